#pragma once
// A portable seeded generator (splitmix64 seeding + xoshiro256**): the same seed gives the same
// stream on every platform and library version, which std::mt19937 + distributions do not promise.
#include <cstdint>

namespace kvq {

class Rng {
 public:
  explicit Rng(uint64_t seed);
  uint64_t next();
  uint64_t below(uint64_t n);  // uniform in [0, n), unbiased (rejection)
  double uniform();            // [0, 1), 53 bits
  // State round-trip, so a resumed run continues the same stream.
  void get_state(uint64_t out[4]) const;
  void set_state(const uint64_t in[4]);

 private:
  uint64_t s_[4];
};

}  // namespace kvq
