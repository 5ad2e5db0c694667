#pragma once
// Shared by the fuzz drivers: the readers take paths, so each input is written to a per-process
// scratch file first. Only kvq::Error may leave a reader; anything else (another exception, a
// crash, a sanitizer report, a timeout, an out-of-memory) is a finding.
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

namespace kvq_fuzz {

inline std::string scratch_path(const char* suffix) {
  const char* dir = std::getenv("TMPDIR");
  return std::string(dir && *dir ? dir : "/tmp") + "/kvq-fuzz-" + std::to_string(::getpid()) + suffix;
}

inline const std::string& write_scratch(const char* suffix, const uint8_t* data, size_t size) {
  static const std::string path = scratch_path(suffix);
  FILE* f = std::fopen(path.c_str(), "wb");
  if (!f) std::abort();
  if (size && std::fwrite(data, 1, size, f) != size) std::abort();
  std::fclose(f);
  return path;
}

}  // namespace kvq_fuzz
