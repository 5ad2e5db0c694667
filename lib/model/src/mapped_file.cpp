#include "mapped_file.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "kvq/util/error.hpp"

namespace kvq::detail {

MappedFile::MappedFile(const std::string& path) : path_(path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw Error(path, "", std::string("cannot open: ") + std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    throw Error(path, "", "not a regular file");
  }
  size_ = static_cast<uint64_t>(st.st_size);
  if (size_ > 0) {  // mmap rejects length 0; an empty file is reported by the format readers
    void* p = ::mmap(nullptr, size_, PROT_READ, MAP_PRIVATE, fd, 0);
    if (p == MAP_FAILED) {
      int e = errno;
      ::close(fd);
      throw Error(path, "", std::string("cannot map: ") + std::strerror(e));
    }
    data_ = static_cast<const uint8_t*>(p);
  }
  ::close(fd);  // the mapping keeps the file alive
}

void MappedFile::drop(uint64_t offset, uint64_t len) const {
  if (!data_ || offset >= size_ || len == 0) return;
  const uint64_t page = uint64_t(::sysconf(_SC_PAGESIZE));
  const uint64_t end = std::min(size_, offset + len);
  const uint64_t b = offset / page * page, e = (end + page - 1) / page * page;
  // Advice only: a failure leaves the pages resident, which costs memory, not correctness.
  (void)::madvise(const_cast<uint8_t*>(data_) + b, std::min(e, (size_ + page - 1) / page * page) - b, MADV_DONTNEED);
}

void MappedFile::prefault(uint64_t offset, uint64_t len) const {
#ifdef MADV_POPULATE_READ
  if (!data_ || offset >= size_ || len == 0) return;
  const uint64_t page = uint64_t(::sysconf(_SC_PAGESIZE));
  const uint64_t end = std::min(size_, offset + len);
  const uint64_t b = offset / page * page, e = (end + page - 1) / page * page;
  (void)::madvise(const_cast<uint8_t*>(data_) + b, std::min(e, (size_ + page - 1) / page * page) - b, MADV_POPULATE_READ);
#else
  (void)offset;
  (void)len;
#endif
}

MappedFile::~MappedFile() {
  if (data_) ::munmap(const_cast<uint8_t*>(data_), size_);
}

}  // namespace kvq::detail
