#pragma once
// Shared by the fuzz drivers: the readers take paths, so each input is written to a per-process
// scratch file first. Only kvq::Error may leave a reader; anything else (another exception, a
// crash, a sanitizer report, a timeout, an out-of-memory) is a finding.
#include <fcntl.h>
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <string>

namespace kvq_fuzz {

// $KVQ_FUZZ_SCRATCH, else /dev/shm, else $TMPDIR or /tmp. A tmpfs matters: on ext4, truncating a
// file to zero and closing it forces a writeback (auto_da_alloc), which capped every target at
// ~300 exec/s.
inline std::string scratch_path(const char* suffix) {
  std::string dir;
  if (const char* d = std::getenv("KVQ_FUZZ_SCRATCH"); d && *d) dir = d;
  else if (::access("/dev/shm", W_OK) == 0) dir = "/dev/shm";
  else if (const char* t = std::getenv("TMPDIR"); t && *t) dir = t;
  else dir = "/tmp";
  return dir + "/kvq-fuzz-" + std::to_string(::getpid()) + suffix;
}

// Overwrites in place and then sets the length (never truncates to zero first, see above).
inline void write_file(const std::string& path, const uint8_t* data, size_t size) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_CLOEXEC, 0600);
  if (fd < 0) std::abort();
  for (size_t done = 0; done < size;) {
    const ssize_t n = ::pwrite(fd, data + done, size - done, off_t(done));
    if (n <= 0) std::abort();
    done += size_t(n);
  }
  if (::ftruncate(fd, off_t(size)) != 0) std::abort();
  ::close(fd);
}

inline const std::string& write_scratch(const char* suffix, const uint8_t* data, size_t size) {
  static const std::string path = scratch_path(suffix);
  write_file(path, data, size);
  return path;
}

}  // namespace kvq_fuzz
