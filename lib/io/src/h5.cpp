#include "kvq/io/h5.hpp"

#include <iostream>

#include <hdf5.h>

#include <algorithm>
#include <mutex>
#include <type_traits>

#include "kvq/util/error.hpp"

namespace kvq::h5 {

void quiet() {
  static std::once_flag once;
  std::call_once(once, [] { H5::Exception::dontPrint(); });
}

static std::string path_of(const H5::H5Object& o) {
  try {
    return o.getObjName();
  } catch (...) {
    return "?";
  }
}

MuteCloseErrors::MuteCloseErrors() : old_(std::cerr.rdbuf(nullptr)) {}
MuteCloseErrors::~MuteCloseErrors() { std::cerr.rdbuf(old_); }

H5::H5File create(const std::string& path) {
  quiet();
  try {
    return H5::H5File(path, H5F_ACC_TRUNC);
  } catch (const H5::Exception&) {
    throw Error(path, "", "cannot create HDF5 file");
  }
}

H5::H5File open_read(const std::string& path) {
  quiet();
  FILE* f = std::fopen(path.c_str(), "rb");
  if (!f) throw Error(path, "", "cannot open for reading");
  std::fclose(f);
  htri_t is = H5Fis_hdf5(path.c_str());
  if (is <= 0) throw Error(path, "", "not an HDF5 file (bad signature or truncated)");
  try {
    return H5::H5File(path, H5F_ACC_RDONLY);
  } catch (const H5::Exception&) {
    throw Error(path, "", "corrupt HDF5 file (cannot open)");
  }
}

H5::Group make_group(H5::Group& parent, const std::string& name) {
  hid_t gcpl = H5Pcreate(H5P_GROUP_CREATE);
  H5Pset_obj_track_times(gcpl, false);
  hid_t id = H5Gcreate2(parent.getId(), name.c_str(), H5P_DEFAULT, gcpl, H5P_DEFAULT);
  H5Pclose(gcpl);
  if (id < 0) throw Error("", name, "cannot create HDF5 group");
  H5::Group g(id);
  H5Gclose(id);  // H5::Group(id) took its own reference
  return g;
}

void write_attr(H5::H5Object& o, const std::string& name, const std::string& v) {
  H5::StrType t(H5::PredType::C_S1, v.empty() ? 1 : v.size());
  t.setStrpad(H5T_STR_NULLPAD);
  auto a = o.createAttribute(name, t, H5::DataSpace(H5S_SCALAR));
  a.write(t, v.empty() ? std::string(1, '\0') : v);
}
void write_attr(H5::H5Object& o, const std::string& name, int64_t v) {
  auto a = o.createAttribute(name, H5::PredType::STD_I64LE, H5::DataSpace(H5S_SCALAR));
  a.write(H5::PredType::NATIVE_INT64, &v);
}
void write_attr(H5::H5Object& o, const std::string& name, double v) {
  auto a = o.createAttribute(name, H5::PredType::IEEE_F64LE, H5::DataSpace(H5S_SCALAR));
  a.write(H5::PredType::NATIVE_DOUBLE, &v);
}

bool has_link(const H5::Group& g, const std::string& name) {
  try {
    return g.nameExists(name);
  } catch (const H5::Exception&) {
    std::string file;
    try { file = g.getFileName(); } catch (const H5::Exception&) {}
    throw Error(file, path_of(g) + "/" + name, "unreadable link (truncated or corrupt file)");
  }
}

bool has_attr(const H5::H5Object& o, const std::string& name) {
  try {
    return o.attrExists(name);
  } catch (const H5::Exception&) {  // corrupt attribute storage: HDF5 throws rather than answer
    std::string file;
    try { file = o.getFileName(); } catch (const H5::Exception&) {}
    throw Error(file, path_of(o) + "@" + name, "unreadable attribute (truncated or corrupt file)");
  }
}

static H5::Attribute open_attr(const std::string& file, const H5::H5Object& o, const std::string& name) {
  if (!o.attrExists(name)) throw Error(file, path_of(o) + "@" + name, "attribute missing");
  return o.openAttribute(name);
}

// libhdf5 trusts a file's datatype fields when it converts numbers: a corrupt precision (fuzzing
// found 32832 bits in an 8-byte integer) makes it read past its own buffer. kvq writes plain 1-8
// byte numbers, so the fields must lie inside the element.
static void check_number_type(const std::string& file, const std::string& where, hid_t type) {
  const size_t size = H5Tget_size(type), bits = 8 * size, prec = H5Tget_precision(type);
  const int off = H5Tget_offset(type);
  bool ok = size >= 1 && size <= 8 && prec >= 1 && off >= 0 && size_t(off) + prec <= bits;
  if (ok && H5Tget_class(type) == H5T_FLOAT) {
    size_t spos, epos, esize, mpos, msize;
    ok = H5Tget_fields(type, &spos, &epos, &esize, &mpos, &msize) >= 0 && spos < bits && esize >= 1 &&
         msize >= 1 && epos + esize <= bits && mpos + msize <= bits;
  }
  if (!ok)
    throw Error(file, where,
                "element type is not a plain number (" + std::to_string(size) + " bytes, " +
                    std::to_string(prec) + "-bit precision at bit " + std::to_string(off) + ")");
}

// A numeric attribute is read into one variable: more than one element would overflow it.
static void check_scalar_number(const std::string& file, const std::string& where, const H5::Attribute& a) {
  const hssize_t n = a.getSpace().getSimpleExtentNpoints();
  if (n != 1) throw Error(file, where, "holds " + std::to_string(n) + " values, expected one");
  H5::DataType t = a.getDataType();
  check_number_type(file, where, t.getId());
}

std::string read_attr_str(const std::string& file, const H5::H5Object& o, const std::string& name) {
  try {
    auto a = open_attr(file, o, name);
    if (a.getTypeClass() != H5T_STRING) throw Error(file, path_of(o) + "@" + name, "not a string");
    H5::StrType t = a.getStrType();
    size_t n = t.getSize();
    if (n > (size_t(1) << 30)) throw Error(file, path_of(o) + "@" + name, "string attribute too large");
    std::string s;
    a.read(t, s);
    while (!s.empty() && s.back() == '\0') s.pop_back();
    return s;
  } catch (const H5::Exception&) {
    throw Error(file, path_of(o) + "@" + name, "unreadable attribute");
  }
}

int64_t read_attr_i64(const std::string& file, const H5::H5Object& o, const std::string& name) {
  try {
    auto a = open_attr(file, o, name);
    if (a.getTypeClass() != H5T_INTEGER) throw Error(file, path_of(o) + "@" + name, "not an integer");
    check_scalar_number(file, path_of(o) + "@" + name, a);
    int64_t v;
    a.read(H5::PredType::NATIVE_INT64, &v);
    return v;
  } catch (const H5::Exception&) {
    throw Error(file, path_of(o) + "@" + name, "unreadable attribute");
  }
}

double read_attr_f64(const std::string& file, const H5::H5Object& o, const std::string& name) {
  try {
    auto a = open_attr(file, o, name);
    if (a.getTypeClass() != H5T_FLOAT) throw Error(file, path_of(o) + "@" + name, "not a float");
    check_scalar_number(file, path_of(o) + "@" + name, a);
    double v;
    a.read(H5::PredType::NATIVE_DOUBLE, &v);
    return v;
  } catch (const H5::Exception&) {
    throw Error(file, path_of(o) + "@" + name, "unreadable attribute");
  }
}

// Runs f(memory space, file space, first element, elements) over slabs of whole dim-0 rows of
// about kSlabBytes each.
template <class F>
static void for_slabs(const std::vector<hsize_t>& dims, size_t esize, F&& f) {
  constexpr size_t kSlabBytes = size_t(32) << 20;
  size_t row = 1;
  for (size_t i = 1; i < dims.size(); ++i) row *= dims[i];
  const hsize_t per = std::max<hsize_t>(1, hsize_t(kSlabBytes / std::max<size_t>(1, row * esize)));
  H5::DataSpace file(int(dims.size()), dims.data());
  for (hsize_t r0 = 0; r0 < dims[0]; r0 += per) {
    std::vector<hsize_t> start(dims.size(), 0), count = dims;
    start[0] = r0;
    count[0] = std::min<hsize_t>(per, dims[0] - r0);
    file.selectHyperslab(H5S_SELECT_SET, count.data(), start.data());
    H5::DataSpace mem(int(count.size()), count.data());
    f(mem, file, size_t(r0) * row, size_t(count[0]) * row);
  }
}

template <class T>
static void write_impl(H5::Group& g, const std::string& name, const std::vector<hsize_t>& dims, const T* data,
                       const H5::PredType& file_type, const H5::PredType& mem_type) {
  H5::DataSpace space(int(dims.size()), dims.data());
  H5::DSetCreatPropList dcpl;
  H5Pset_obj_track_times(dcpl.getId(), false);
  auto ds = g.createDataSet(name, file_type, space, dcpl);
  size_t n = 1;
  for (auto x : dims) n *= x;
  if (n > 0 && !payload::is_file_backed(data, n * sizeof(T))) {
    ds.write(data, mem_type);
  } else if (n > 0) {
    for_slabs(dims, sizeof(T), [&](const H5::DataSpace& mem, const H5::DataSpace& file, size_t off, size_t count) {
      ds.write(data + off, mem_type, mem, file);
      payload::release(data + off, count * sizeof(T));
    });
  }
  // Closed here, not by the destructor: a close that cannot write its data (a full disk) throws,
  // where ~DataSet would only print and the file would look written.
  ds.close();
}

void write(H5::Group& g, const std::string& n, const std::vector<hsize_t>& d, const double* p) {
  write_impl(g, n, d, p, H5::PredType::IEEE_F64LE, H5::PredType::NATIVE_DOUBLE);
}
void write(H5::Group& g, const std::string& n, const std::vector<hsize_t>& d, const float* p) {
  write_impl(g, n, d, p, H5::PredType::IEEE_F32LE, H5::PredType::NATIVE_FLOAT);
}
void write(H5::Group& g, const std::string& n, const std::vector<hsize_t>& d, const int64_t* p) {
  write_impl(g, n, d, p, H5::PredType::STD_I64LE, H5::PredType::NATIVE_INT64);
}
void write(H5::Group& g, const std::string& n, const std::vector<hsize_t>& d, const uint64_t* p) {
  write_impl(g, n, d, p, H5::PredType::STD_U64LE, H5::PredType::NATIVE_UINT64);
}
void write(H5::Group& g, const std::string& n, const std::vector<hsize_t>& d, const int32_t* p) {
  write_impl(g, n, d, p, H5::PredType::STD_I32LE, H5::PredType::NATIVE_INT32);
}
void write(H5::Group& g, const std::string& n, const std::vector<hsize_t>& d, const uint8_t* p) {
  write_impl(g, n, d, p, H5::PredType::STD_U8LE, H5::PredType::NATIVE_UINT8);
}

bool exists(const H5::Group& g, const std::string& name) {
  return H5Lexists(g.getId(), name.c_str(), H5P_DEFAULT) > 0;
}

H5::Group open_group(const std::string& file, const H5::Group& parent, const std::string& name) {
  if (!exists(parent, name)) throw Error(file, name, "group missing");
  try {
    return parent.openGroup(name);
  } catch (const H5::Exception&) {
    throw Error(file, name, "unreadable group");
  }
}

static std::string dims_str(const std::vector<hsize_t>& d) {
  std::string s = "[";
  for (size_t i = 0; i < d.size(); ++i) s += (i ? "," : "") + std::to_string(d[i]);
  return s + "]";
}

std::vector<hsize_t> shape_of(const std::string& file, const H5::Group& g, const std::string& name) {
  const std::string where = path_of(g) == "/" ? "/" + name : path_of(g) + "/" + name;
  if (!exists(g, name)) throw Error(file, where, "dataset missing");
  try {
    auto ds = g.openDataSet(name);
    auto sp = ds.getSpace();
    int nd = sp.getSimpleExtentNdims();
    if (nd < 0 || nd > 8) throw Error(file, where, "bad rank");
    std::vector<hsize_t> dims(static_cast<size_t>(nd));
    sp.getSimpleExtentDims(dims.data());
    return dims;
  } catch (const H5::Exception&) {
    throw Error(file, where, "unreadable dataset");
  }
}

template <class Out>
static Out sized(size_t n) {
  if constexpr (std::is_same_v<Out, payload::FloatVector>) return payload::zeros(n);
  else return Out(n);
}

template <class T, class Out = std::vector<T>>
static Out read_impl(const std::string& file, const H5::Group& g, const std::string& name,
                                const std::vector<hsize_t>& expect, const H5::PredType& mem_type,
                                H5T_class_t cls) {
  const std::string where = path_of(g) == "/" ? "/" + name : path_of(g) + "/" + name;
  auto dims = shape_of(file, g, name);
  if (dims != expect)
    throw Error(file, where, "shape " + dims_str(dims) + " but the header implies " + dims_str(expect));
  try {
    auto ds = g.openDataSet(name);
    if (ds.getTypeClass() != cls) throw Error(file, where, "wrong element type");
    // HDF5 sizes its own conversion and chunk buffers from the file's datatype and layout, before
    // any data is read: a corrupt element size or chunk shape makes it allocate gigabytes. kvq
    // writes plain numbers, contiguous (or compact), so anything else is rejected up front.
    H5::DataType type = ds.getDataType();
    check_number_type(file, where, type.getId());
    const size_t esize = type.getSize();
    const H5D_layout_t layout = ds.getCreatePlist().getLayout();
    if (layout != H5D_CONTIGUOUS && layout != H5D_COMPACT)
      throw Error(file, where, "storage layout is not contiguous (not written by kvq, or corrupt)");
    // Validate before allocating: the shape comes from the file, and a corrupt dataspace claimed
    // 2^50 elements (found by fuzzing). kvq writes every element, so the stored bytes must cover
    // the shape, and they cannot exceed the file.
    size_t n = 1, need = esize;
    bool overflow = false;
    for (auto x : dims) overflow |= __builtin_mul_overflow(n, size_t(x), &n);
    overflow |= __builtin_mul_overflow(n, esize, &need);
    hsize_t file_bytes = 0;
    const hid_t fid = H5Iget_file_id(ds.getId());
    if (fid < 0 || H5Fget_filesize(fid, &file_bytes) < 0) file_bytes = 0;
    if (fid >= 0) H5Fclose(fid);
    const hsize_t stored = ds.getStorageSize();
    if (overflow || (n > 0 && (stored < need || stored > file_bytes)))
      throw Error(file, where,
                  "shape " + dims_str(dims) + " needs " + (overflow ? "more than 2^64" : std::to_string(need)) +
                      " bytes but the file stores " + std::to_string(stored) + " (truncated or corrupt)");
    Out out = sized<Out>(n);
    if (n == 0) return out;
    if (!payload::is_file_backed(out.data(), n * sizeof(T))) {
      ds.read(out.data(), mem_type);
      return out;
    }
    for_slabs(dims, sizeof(T), [&](const H5::DataSpace& mem, const H5::DataSpace& fsp, size_t off, size_t count) {
      ds.read(out.data() + off, mem_type, mem, fsp);
      payload::release(out.data() + off, count * sizeof(T));
    });
    return out;
  } catch (const H5::Exception&) {
    throw Error(file, where, "unreadable dataset (truncated or corrupt file)");
  }
}

std::vector<double> read_f64(const std::string& f, const H5::Group& g, const std::string& n,
                             const std::vector<hsize_t>& e) {
  return read_impl<double>(f, g, n, e, H5::PredType::NATIVE_DOUBLE, H5T_FLOAT);
}
std::vector<float> read_f32(const std::string& f, const H5::Group& g, const std::string& n,
                            const std::vector<hsize_t>& e) {
  return read_impl<float>(f, g, n, e, H5::PredType::NATIVE_FLOAT, H5T_FLOAT);
}
void read_f32(const std::string& f, const H5::Group& g, const std::string& n, const std::vector<hsize_t>& e,
              payload::FloatVector* out) {
  *out = payload::FloatVector();  // free the old storage first
  *out = read_impl<float, payload::FloatVector>(f, g, n, e, H5::PredType::NATIVE_FLOAT, H5T_FLOAT);
}
std::vector<int64_t> read_i64(const std::string& f, const H5::Group& g, const std::string& n,
                              const std::vector<hsize_t>& e) {
  return read_impl<int64_t>(f, g, n, e, H5::PredType::NATIVE_INT64, H5T_INTEGER);
}
std::vector<uint64_t> read_u64(const std::string& f, const H5::Group& g, const std::string& n,
                               const std::vector<hsize_t>& e) {
  return read_impl<uint64_t>(f, g, n, e, H5::PredType::NATIVE_UINT64, H5T_INTEGER);
}
std::vector<int32_t> read_i32(const std::string& f, const H5::Group& g, const std::string& n,
                              const std::vector<hsize_t>& e) {
  return read_impl<int32_t>(f, g, n, e, H5::PredType::NATIVE_INT32, H5T_INTEGER);
}
std::vector<uint8_t> read_u8(const std::string& f, const H5::Group& g, const std::string& n,
                             const std::vector<hsize_t>& e) {
  return read_impl<uint8_t>(f, g, n, e, H5::PredType::NATIVE_UINT8, H5T_INTEGER);
}

void write_text(H5::Group& g, const std::string& name, const std::string& text) {
  write(g, name, {hsize_t(text.size())}, reinterpret_cast<const uint8_t*>(text.data()));
}

std::string read_text(const std::string& file, const H5::Group& g, const std::string& name, size_t max_bytes) {
  const std::string where = path_of(g) == "/" ? "/" + name : path_of(g) + "/" + name;
  const std::vector<hsize_t> dims = shape_of(file, g, name);
  if (dims.size() != 1) throw Error(file, where, "expected a 1-D dataset of bytes, found rank " + std::to_string(dims.size()));
  if (dims[0] > max_bytes)
    throw Error(file, where, std::to_string(dims[0]) + " bytes, more than the " + std::to_string(max_bytes) + " allowed");
  const std::vector<uint8_t> bytes = read_u8(file, g, name, dims);
  return std::string(bytes.begin(), bytes.end());
}

void write_root_text(H5::Group& root, const std::string& name, const std::string& text, bool as_dataset) {
  if (as_dataset) write_text(root, name, text);
  else write_attr(root, name, text);
}

std::string read_root_text(const std::string& file, const H5::Group& root, const std::string& name, int64_t version,
                           int64_t since, const std::string& kind, size_t max_bytes) {
  if (version >= since) {
    if (has_attr(root, name))
      throw Error(file, "/@" + name, "a version-" + std::to_string(version) + " file keeps its " + name + " in the /" +
                                         name + " dataset, not the attribute");
    return read_text(file, root, name, max_bytes);
  }
  if (has_link(root, name))
    throw Error(file, "/" + name, "a " + name + " dataset needs " + kind + " version >= " + std::to_string(since) +
                                      ", the file is version " + std::to_string(version));
  return read_attr_str(file, root, name);
}

}  // namespace kvq::h5
