#include "kvq/corpus/rng.hpp"

namespace kvq {

static uint64_t splitmix64(uint64_t& x) {
  uint64_t z = (x += 0x9e3779b97f4a7c15ULL);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

static inline uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

Rng::Rng(uint64_t seed) {
  uint64_t x = seed;
  for (auto& s : s_) s = splitmix64(x);
}

uint64_t Rng::next() {
  const uint64_t result = rotl(s_[1] * 5, 7) * 9;
  const uint64_t t = s_[1] << 17;
  s_[2] ^= s_[0]; s_[3] ^= s_[1]; s_[1] ^= s_[2]; s_[0] ^= s_[3];
  s_[2] ^= t;
  s_[3] = rotl(s_[3], 45);
  return result;
}

uint64_t Rng::below(uint64_t n) {
  if (n <= 1) return 0;
  const uint64_t limit = ~uint64_t(0) - (~uint64_t(0) % n);  // reject the biased tail
  uint64_t r;
  do r = next(); while (r >= limit);
  return r % n;
}

double Rng::uniform() { return double(next() >> 11) * (1.0 / 9007199254740992.0); }

void Rng::get_state(uint64_t out[4]) const { for (int i = 0; i < 4; ++i) out[i] = s_[i]; }
void Rng::set_state(const uint64_t in[4]) { for (int i = 0; i < 4; ++i) s_[i] = in[i]; }

}  // namespace kvq
