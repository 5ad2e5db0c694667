#pragma once
// The seeded generator behind every random choice in the codec (Haar rotations, Hadamard signs).
// Its output for a seed is part of the format: allocation files record seeds, not matrices, so the
// decoder must regenerate the same rotation. Hence a fixed, documented algorithm (splitmix64 to
// seed xoshiro256**, Box-Muller for normals) instead of <random> distributions, whose output
// differs across standard libraries. Pinned by tests/codec/test_rotation.cpp.
#include <cstdint>

namespace kvq::codec {

class Rng {
 public:
  explicit Rng(uint64_t seed);
  uint64_t next_u64();
  // Uniform on (0, 1): 53 random bits, never 0 (Box-Muller takes its log).
  double uniform_open();
  // Standard normal by Box-Muller; both values of a pair are used, cosine first.
  double normal();

 private:
  uint64_t s_[4];
  double spare_ = 0.0;
  bool has_spare_ = false;
};

}  // namespace kvq::codec
