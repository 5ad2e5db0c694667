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
  // Hands the pages of bytes [offset, offset + len) back to the kernel (madvise DONTNEED; the
  // mapping is read-only and file-backed, so a later read pages them in again from the file).
  // Whole pages covering the range are dropped; out-of-range parts are clipped.
  void drop(uint64_t offset, uint64_t len) const;
  // Maps the pages of [offset, offset + len) in one call (madvise POPULATE_READ) before they are
  // read through: a page fault per 4 KiB otherwise dominates converting a large tensor. Advice
  // only: a kernel without it, or a failure, leaves the pages to fault in as they are read.
  void prefault(uint64_t offset, uint64_t len) const;

 private:
  std::string path_;
  const uint8_t* data_ = nullptr;
  uint64_t size_ = 0;
};

}  // namespace kvq::detail
