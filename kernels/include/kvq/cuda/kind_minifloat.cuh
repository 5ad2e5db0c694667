#pragma once
// minifloat on the device (the CPU codec: lib/codec/src/kind_minifloat.cpp, the formats in
// kvq/codec/minifloat.hpp): FP8 E4M3 with a per-head scale, NVFP4 (16-value blocks, an E4M3 block
// scale each, E2M1 codes, an fp32 global scale). The latent is x itself. The layout tells the two
// apart: 8-bit codes are FP8, 4-bit codes NVFP4. Scalar encoders here are used by
// encode_kernels.cuh; they round exactly as the CPU's (round to nearest, ties to even, from the
// double's bits).
#include <stdint.h>

#include "kvq/cuda/dev_head.cuh"
#include "kvq/cuda/rn_math.cuh"

namespace kvq::cuda::detail {

__device__ inline float mf_e4m3_decode(uint32_t code) {
  const uint32_t sign = (code & 0x80u) << 24;
  const uint32_t mag = code & 0x7Fu;
  if (mag == 0x7Fu) return layout::f32_from_bits(sign | 0x7FC00000u);
  const uint32_t e = mag >> 3, m = mag & 7u;
  if (e == 0) {
    const float v = (float)m * 0x1p-9f;  // exact
    return sign ? -v : v;
  }
  return layout::f32_from_bits(sign | ((e - 7u + 127u) << 23) | (m << 20));
}

__device__ inline float mf_e2m1_decode(uint32_t code) {
  const uint32_t mag = code & 7u;
  // {0, 0.5, 1, 1.5, 2, 3, 4, 6}: exponent field mag >> 1 (bias 1), mantissa bit mag & 1.
  const float v = mag < 2 ? 0.5f * (float)mag : (float)((2u | (mag & 1u)) << ((mag >> 1) - 1u)) * 0.5f;
  return (code & 8u) ? -v : v;
}

// The magnitude code of ax >= 0 (finite) in a format with E exponent bits, M mantissa bits and
// bias B: 1 << (E + M) means overflow. The CPU's round_magnitude, operation for operation.
template <int E, int M, int B>
__device__ inline uint32_t mf_round_magnitude(double ax) {
  constexpr uint32_t kOverflow = 1u << (E + M);
  const uint64_t bits = double_bits(ax);
  const int fe = (int)(bits >> 52);
  const uint64_t fm = bits & ((uint64_t{1} << 52) - 1);
  if (fe == 0) return 0;
  const int te = fe - 1023 + B;
  if (te > (1 << E) - 1) return kOverflow;
  uint64_t sig;
  int shift;
  if (te >= 1) {
    sig = ((uint64_t)te << 52) | fm;
    shift = 52 - M;
  } else {
    sig = (uint64_t{1} << 52) | fm;
    shift = 52 - M + 1 - te;
    if (shift > 53) return 0;
  }
  const uint64_t rem = sig & ((uint64_t{1} << shift) - 1);
  const uint64_t half = uint64_t{1} << (shift - 1);
  uint64_t code = sig >> shift;
  if (rem > half || (rem == half && (code & 1))) ++code;
  return code > kOverflow ? kOverflow : (uint32_t)code;
}

// Saturating E4M3 / E2M1 of a finite x (the encoder never sees NaN: inputs are finite).
__device__ inline uint32_t mf_e4m3_encode(double x) {
  const uint32_t sign = (double_bits(x) >> 63) ? 0x80u : 0u;
  const uint32_t mag = mf_round_magnitude<4, 3, 7>(fabs(x));
  return sign | (mag > 0x7Eu ? 0x7Eu : mag);
}
__device__ inline uint32_t mf_e2m1_encode(double x) {
  const uint32_t sign = (double_bits(x) >> 63) ? 0x8u : 0u;
  const uint32_t mag = mf_round_magnitude<2, 1, 1>(fabs(x));
  return sign | (mag > 7u ? 7u : mag);
}

// Latent (= decoded) value k of the token whose block is blk; the CPU's decode_fp8 / decode_nvfp4.
__device__ inline float mf_latent_value(const DevHead& h, const uint8_t* blk, uint32_t tb, uint32_t k) {
  const PackedLayout& L = h.L;
  const uint32_t q = layout::get_code(blk + L.meta_bytes, tb + k * L.bits, L.bits);
  if (L.bits == 8) return rn_mul(mf_e4m3_decode(q), h.mf_scale);
  const float s = mf_e4m3_decode(blk[k / layout::kNvfp4BlockValues]);
  return rn_mul(rn_mul(mf_e2m1_decode(q), s), h.mf_scale);
}

}  // namespace kvq::cuda::detail
