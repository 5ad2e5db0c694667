#include "kvq/util/rng.hpp"

#include <cmath>

namespace kvq {
namespace {
inline uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }
}  // namespace

Rng::Rng(uint64_t seed) {
  uint64_t x = seed;
  for (auto& s : s_) s = splitmix64_next(x);
}

uint64_t Rng::next() {
  const uint64_t result = rotl(s_[1] * 5, 7) * 9;
  const uint64_t t = s_[1] << 17;
  s_[2] ^= s_[0];
  s_[3] ^= s_[1];
  s_[1] ^= s_[2];
  s_[0] ^= s_[3];
  s_[2] ^= t;
  s_[3] = rotl(s_[3], 45);
  return result;
}

uint64_t Rng::below(uint64_t n) {
  if (n <= 1) return 0;
  const uint64_t limit = ~uint64_t(0) - (~uint64_t(0) % n);  // reject the biased tail
  uint64_t r;
  do r = next();
  while (r >= limit);
  return r % n;
}

double Rng::uniform() { return double(next() >> 11) * 0x1.0p-53; }

double Rng::uniform_open() { return (static_cast<double>(next() >> 11) + 0.5) * 0x1.0p-53; }

double Rng::normal() {
  if (has_spare_) {
    has_spare_ = false;
    return spare_;
  }
  const double u1 = uniform_open();
  const double u2 = uniform_open();
  const double r = std::sqrt(-2.0 * std::log(u1));
  const double a = 2.0 * M_PI * u2;
  spare_ = r * std::sin(a);
  has_spare_ = true;
  return r * std::cos(a);
}

void Rng::get_state(uint64_t out[4]) const {
  for (int i = 0; i < 4; ++i) out[i] = s_[i];
}
void Rng::set_state(const uint64_t in[4]) {
  for (int i = 0; i < 4; ++i) s_[i] = in[i];
}

}  // namespace kvq
