#pragma once
// Thin HDF5 helpers shared by the calibration and allocation formats. Every failure becomes a
// kvq::Error naming the file and the object path; nothing of HDF5's own stack is printed.
#include <H5Cpp.h>

#include <cstdint>
#include <iosfwd>
#include <string>
#include <vector>

#include "kvq/util/payload_memory.hpp"

namespace kvq::h5 {

// While alive, std::cerr goes nowhere: HDF5's C++ objects print "DataSet::~DataSet - H5Dclose
// failed" there when a destructor's close fails (a full disk). The writers report that failure
// once, as a kvq::Error (explicit closes throw), so they hold this around their HDF5 objects.
// kvq itself never writes to std::cerr.
class MuteCloseErrors {
 public:
  MuteCloseErrors();
  ~MuteCloseErrors();
  MuteCloseErrors(const MuteCloseErrors&) = delete;
  MuteCloseErrors& operator=(const MuteCloseErrors&) = delete;

 private:
  std::streambuf* old_;
};

void quiet();  // turn off HDF5's automatic error stack printing (once per process)

H5::H5File create(const std::string& path);
H5::H5File open_read(const std::string& path);  // throws kvq::Error "not an HDF5 file"/unreadable
H5::Group make_group(H5::Group& parent, const std::string& name);  // no timestamps (deterministic)

void write_attr(H5::H5Object& o, const std::string& name, const std::string& v);
void write_attr(H5::H5Object& o, const std::string& name, int64_t v);
void write_attr(H5::H5Object& o, const std::string& name, double v);
bool has_attr(const H5::H5Object& o, const std::string& name);
bool has_link(const H5::Group& g, const std::string& name);  // a dataset or group called `name` in g
std::string read_attr_str(const std::string& file, const H5::H5Object& o, const std::string& name);
int64_t read_attr_i64(const std::string& file, const H5::H5Object& o, const std::string& name);
double read_attr_f64(const std::string& file, const H5::H5Object& o, const std::string& name);

// Datasets are written contiguous, without timestamps; dims are the shape. Data in file-backed
// payload memory (kvq/util/payload_memory.hpp) is written in slabs along dim 0 and each slab's
// pages are released after it is written, so a payload larger than RAM is never resident at once
// (same bytes in the file).
void write(H5::Group& g, const std::string& name, const std::vector<hsize_t>& dims, const double* data);
void write(H5::Group& g, const std::string& name, const std::vector<hsize_t>& dims, const float* data);
void write(H5::Group& g, const std::string& name, const std::vector<hsize_t>& dims, const int64_t* data);
void write(H5::Group& g, const std::string& name, const std::vector<hsize_t>& dims, const uint64_t* data);
void write(H5::Group& g, const std::string& name, const std::vector<hsize_t>& dims, const int32_t* data);
void write(H5::Group& g, const std::string& name, const std::vector<hsize_t>& dims, const uint8_t* data);
// Text too large for an attribute (HDF5 keeps an attribute in the object header: 64 KiB at most)
// as a 1-D u8 dataset of its bytes; read_text refuses more than max_bytes before allocating.
void write_text(H5::Group& g, const std::string& name, const std::string& text);
std::string read_text(const std::string& file, const H5::Group& g, const std::string& name, size_t max_bytes);
// A root JSON text that files of version >= `since` keep as the dataset `name` (write_text) and
// older files as the string attribute `name`: written where `as_dataset` says; read from where the
// file's `version` says, the other place refused (one line naming the object, the `kind` of file
// and both versions), so a file never holds two.
void write_root_text(H5::Group& root, const std::string& name, const std::string& text, bool as_dataset);
std::string read_root_text(const std::string& file, const H5::Group& root, const std::string& name, int64_t version,
                           int64_t since, const std::string& kind, size_t max_bytes);

// Reads a dataset after checking its shape equals `expect` (validate before allocating).
std::vector<double> read_f64(const std::string& file, const H5::Group& g, const std::string& name,
                             const std::vector<hsize_t>& expect);
std::vector<float> read_f32(const std::string& file, const H5::Group& g, const std::string& name,
                            const std::vector<hsize_t>& expect);
std::vector<int64_t> read_i64(const std::string& file, const H5::Group& g, const std::string& name,
                              const std::vector<hsize_t>& expect);
std::vector<uint64_t> read_u64(const std::string& file, const H5::Group& g, const std::string& name,
                               const std::vector<hsize_t>& expect);
std::vector<int32_t> read_i32(const std::string& file, const H5::Group& g, const std::string& name,
                              const std::vector<hsize_t>& expect);
std::vector<uint8_t> read_u8(const std::string& file, const H5::Group& g, const std::string& name,
                             const std::vector<hsize_t>& expect);
// read_f32 into payload memory: while a payload::FileBacked scope is alive the rows are read in
// slabs along dim 0, each slab released after it is read.
void read_f32(const std::string& file, const H5::Group& g, const std::string& name,
              const std::vector<hsize_t>& expect, payload::FloatVector* out);
// Shape of a dataset (throws naming it when absent).
std::vector<hsize_t> shape_of(const std::string& file, const H5::Group& g, const std::string& name);
bool exists(const H5::Group& g, const std::string& name);
H5::Group open_group(const std::string& file, const H5::Group& parent, const std::string& name);

}  // namespace kvq::h5
