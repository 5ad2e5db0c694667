#pragma once
// Read-only memory map of a whole file. Checkpoints are read through this so that validation can
// look at headers and sizes before any tensor is allocated, and so the payload is paged in lazily.
#include <cstddef>
#include <cstdint>
#include <string>

namespace kvq::detail {

class MappedFile {
 public:
  explicit MappedFile(const std::string& path);  // throws kvq::Error naming the file
  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  const uint8_t* data() const { return data_; }
  uint64_t size() const { return size_; }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  const uint8_t* data_ = nullptr;
  uint64_t size_ = 0;
};

}  // namespace kvq::detail
