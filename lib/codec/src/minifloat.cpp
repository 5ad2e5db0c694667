#include "kvq/codec/minifloat.hpp"

#include <cmath>
#include <cstring>
#include <limits>
#include <string>

#include "kvq/util/error.hpp"

namespace kvq::codec {
namespace {

// Magnitude code (exponent field << M | mantissa field) of ax >= 0, finite, in a format with E
// exponent bits, M mantissa bits, bias B and every exponent field a number: round to nearest,
// ties to the even code, straight from the double's bits (a double holds every float and every
// quotient we round exactly enough, see the header). A result above the format's largest code
// means overflow; the caller applies its policy.
template <int E, int M, int B>
uint32_t round_magnitude(double ax) {
  constexpr uint32_t kOverflow = 1u << (E + M);
  uint64_t bits;
  std::memcpy(&bits, &ax, sizeof bits);
  const int fe = static_cast<int>(bits >> 52);
  const uint64_t fm = bits & ((uint64_t{1} << 52) - 1);
  if (fe == 0) return 0;  // double subnormals (and 0) are far below half the smallest subnormal
  const int te = fe - 1023 + B;  // the target's biased exponent
  if (te > (1 << E) - 1) return kOverflow;
  uint64_t sig;
  int shift;
  if (te >= 1) {
    // Normal: keep the exponent in the code so a mantissa carry bumps it (1.11..1 -> 10.0).
    sig = (static_cast<uint64_t>(te) << 52) | fm;
    shift = 52 - M;
  } else {
    // Subnormal: the implicit bit becomes explicit, shifted right by 1 - te more places; a carry
    // into the exponent field gives the smallest normal, which is right.
    sig = (uint64_t{1} << 52) | fm;
    shift = 52 - M + 1 - te;
    if (shift > 53) return 0;  // below half the smallest subnormal (sig < 2^53 <= half)
  }
  const uint64_t rem = sig & ((uint64_t{1} << shift) - 1);
  const uint64_t half = uint64_t{1} << (shift - 1);
  uint64_t code = sig >> shift;
  if (rem > half || (rem == half && (code & 1))) ++code;
  return code > kOverflow ? kOverflow : static_cast<uint32_t>(code);
}

float from_bits(uint32_t b) {
  float f;
  std::memcpy(&f, &b, sizeof f);
  return f;
}

void check_scale(float scale, const char* field) {
  if (!(std::isfinite(scale) && scale > 0.0f))
    throw Error("", field, "must be finite and > 0, got " + std::to_string(scale));
}

constexpr float kE2M1Magnitude[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};

}  // namespace

uint8_t e4m3_encode(double x, E4M3Overflow overflow) {
  const uint8_t sign = std::signbit(x) ? 0x80 : 0x00;
  if (std::isnan(x)) return sign | kE4M3NaN;
  const double ax = std::fabs(x);
  const uint32_t mag = std::isinf(ax) ? 0x80u : round_magnitude<4, 3, 7>(ax);
  if (mag > 0x7E)  // 0x7F is NaN, so the largest finite is 0x7E even though its exponent is normal
    return sign | (overflow == E4M3Overflow::kSaturate ? uint8_t{0x7E} : kE4M3NaN);
  return sign | static_cast<uint8_t>(mag);
}

float e4m3_decode(uint8_t code) {
  const uint32_t sign = static_cast<uint32_t>(code & 0x80) << 24;
  const uint32_t mag = code & 0x7F;
  if (mag == kE4M3NaN) return from_bits(sign | 0x7FC00000u);
  const uint32_t e = mag >> 3, m = mag & 7;
  if (e == 0) {
    const float v = static_cast<float>(m) * 0x1p-9f;  // subnormal: m * 2^-9, exact
    return sign ? -v : v;
  }
  return from_bits(sign | ((e - 7 + 127) << 23) | (m << 20));
}

uint8_t e2m1_encode(double x) {
  if (std::isnan(x)) return 0;
  const uint8_t sign = std::signbit(x) ? 0x8 : 0x0;
  const double ax = std::fabs(x);
  const uint32_t mag = std::isinf(ax) ? 8u : round_magnitude<2, 1, 1>(ax);
  return sign | static_cast<uint8_t>(mag > 7 ? 7 : mag);
}

float e2m1_decode(uint8_t code) {
  const float v = kE2M1Magnitude[code & 7];
  return (code & 0x8) ? -v : v;
}

void encode_fp8(const float* x, size_t n, float scale, uint8_t* codes, E4M3Overflow overflow) {
  check_scale(scale, "fp8 scale");
  const double s = scale;
  for (size_t i = 0; i < n; ++i) codes[i] = e4m3_encode(x[i] / s, overflow);
}

void decode_fp8(const uint8_t* codes, size_t n, float scale, float* out) {
  check_scale(scale, "fp8 scale");
  for (size_t i = 0; i < n; ++i) out[i] = e4m3_decode(codes[i]) * scale;
}

void encode_nvfp4(const float* x, size_t n, uint8_t* codes, uint8_t* scales, float global_scale) {
  check_scale(global_scale, "nvfp4 global scale");
  const double g = global_scale;
  for (size_t lo = 0, b = 0; lo < n; lo += kNvfp4Block, ++b) {
    const size_t hi = lo + kNvfp4Block < n ? lo + kNvfp4Block : n;
    double amax = 0.0;
    bool nan = false;
    for (size_t i = lo; i < hi; ++i) {
      if (std::isnan(x[i])) nan = true;
      else amax = std::fmax(amax, std::fabs(static_cast<double>(x[i])));
    }
    if (nan) {
      scales[b] = kE4M3NaN;
      for (size_t i = lo; i < hi; ++i) codes[i] = 0;
      continue;
    }
    scales[b] = e4m3_encode(amax / (6.0 * g));
    // Exact in double: a 4-bit significand times a 24-bit one.
    const double s = static_cast<double>(e4m3_decode(scales[b])) * g;
    for (size_t i = lo; i < hi; ++i) codes[i] = s == 0.0 ? 0 : e2m1_encode(x[i] / s);
  }
}

void decode_nvfp4(const uint8_t* codes, const uint8_t* scales, size_t n, float* out,
                  float global_scale) {
  check_scale(global_scale, "nvfp4 global scale");
  for (size_t lo = 0, b = 0; lo < n; lo += kNvfp4Block, ++b) {
    const size_t hi = lo + kNvfp4Block < n ? lo + kNvfp4Block : n;
    const float s = e4m3_decode(scales[b]);
    // e2m1 * s is exact in float (2 + 4 significant bits, >= 2^-10); one rounding for * g.
    for (size_t i = lo; i < hi; ++i) out[i] = e2m1_decode(codes[i]) * s * global_scale;
  }
}

Nvfp4Codes encode_nvfp4(const float* x, size_t n, float global_scale) {
  Nvfp4Codes c;
  c.codes.resize(n);
  c.scales.resize(nvfp4_scale_count(n));
  encode_nvfp4(x, n, c.codes.data(), c.scales.data(), global_scale);
  return c;
}

}  // namespace kvq::codec
