#pragma once
#include <cstddef>
#include <cstdint>
#include <string>

namespace kvq {

// Streaming SHA-256 (FIPS 180-4). Provenance hashes of model, corpus and calibration files.
class Sha256 {
 public:
  Sha256();
  void update(const void* data, size_t n);
  std::string hex_digest();  // finalises; the object must not be updated afterwards

 private:
  void block(const uint8_t* p);
  uint32_t h_[8];
  uint8_t buf_[64];
  size_t buf_len_ = 0;
  uint64_t total_ = 0;
};

std::string sha256_hex(const void* data, size_t n);
std::string sha256_file(const std::string& path);  // throws kvq::Error if unreadable

}  // namespace kvq
