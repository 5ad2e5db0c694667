#pragma once
// The serving engines' own KV-cache number formats, as a CPU reference:
//  - FP8 E4M3 (OCP FP8 "E4M3", NVIDIA/PyTorch/ml_dtypes "float8_e4m3fn"): 1 sign, 4 exponent bits
//    (bias 7), 3 mantissa bits. No infinities; NaN only at S.1111.111 (0x7F, 0xFF); max finite 448
//    (0x7E); subnormals (exponent field 0) are m * 2^-9, m = 1..7.
//  - FP4 E2M1: 1 sign, 2 exponent bits (bias 1), 1 mantissa bit: magnitudes
//    {0, 0.5, 1, 1.5, 2, 3, 4, 6}. No infinities, no NaN.
//  - NVFP4: blocks of 16 consecutive values; per block one E4M3 scale, the block's amax / 6
//    (divided by an optional fp32 per-tensor global scale), and one E2M1 code per value.
//
// Rounding is round-to-nearest, ties to the even code, of the exact real value. Quotients
// (x / scale) are formed in double before rounding: a float over a float (or a float times a
// 4-bit significand) is never within 2^-53 relative of a rounding boundary without being on it,
// so the double quotient decides every rounding exactly as the real one would. Kernels that
// divide (or multiply by a reciprocal) in fp32 can differ on inputs within an fp32 ulp of a
// boundary.
//
// Policy for values the formats cannot hold:
//  - E4M3, |x| beyond the largest finite (448): saturate to +-448 by default — what vLLM / ModelOpt
//    scaling (scale = amax / 448) assumes. |x| <= 464 (the midpoint to the would-be 480) is an
//    ordinary round to 448 (ties to even: 448 = 1.110b * 2^8); past it the E4M3Overflow policy
//    decides: kSaturate -> +-448, kNaN -> the NaN code (the OCP non-saturating conversion).
//    +-inf follow the same policy (saturate by default). NaN -> the NaN code with x's sign.
//  - E2M1: always saturates to +-6 (+-inf included). NaN -> +0 (E2M1 has no NaN code); NVFP4 never
//    sends a NaN here: a NaN anywhere in a block makes that block's scale the E4M3 NaN code, so the
//    whole block decodes to NaN rather than losing it.
//  - Signed zero is kept by both formats (-0 -> 0x80 / 0x8).
#include <cstddef>
#include <cstdint>
#include <vector>

namespace kvq::codec {

inline constexpr float kE4M3Max = 448.0f;
inline constexpr float kE2M1Max = 6.0f;
inline constexpr uint8_t kE4M3NaN = 0x7F;  // with the sign bit: 0xFF
inline constexpr int kNvfp4Block = 16;

// Storage per value, the allocator's effective bits. FP8 per-tensor: 8 (the fp32 scale is per
// tensor, negligible). NVFP4: a 4-bit code plus an 8-bit scale per 16 values (the fp32 global
// scale is per tensor, negligible).
inline constexpr double kFp8BitsPerValue = 8.0;
inline constexpr double kNvfp4BitsPerValue = 4.0 + 8.0 / kNvfp4Block;
static_assert(kNvfp4BitsPerValue == 4.5);

enum class E4M3Overflow { kSaturate, kNaN };

// Scalar codecs. Codes are the format's bit patterns; an E2M1 code uses the low 4 bits (sign bit 3).
uint8_t e4m3_encode(double x, E4M3Overflow overflow = E4M3Overflow::kSaturate);
float e4m3_decode(uint8_t code);  // exact; 0x7F / 0xFF -> quiet NaN
uint8_t e2m1_encode(double x);    // saturating; NaN -> 0
float e2m1_decode(uint8_t code);  // exact; bits above the low 4 are ignored

// Per-tensor FP8: codes[i] = E4M3(x[i] / scale), decode x^ = e4m3 * scale. scale must be finite and
// > 0 (kvq::Error otherwise).
void encode_fp8(const float* x, size_t n, float scale, uint8_t* codes,
                E4M3Overflow overflow = E4M3Overflow::kSaturate);
void decode_fp8(const uint8_t* codes, size_t n, float scale, float* out);

// NVFP4 over n values: blocks [16b, 16b + 16), the last one shorter when 16 does not divide n.
// codes: n bytes, one E2M1 code each (unpacked: packing two per byte is the layout's business);
// scales: nvfp4_scale_count(n) E4M3 codes. Per block, with g = global_scale:
//   s = E4M3(amax / (6 g)) (saturating: a block whose amax exceeds 6 * 448 * g has its large
//   values clipped to +-6 * 448 * g), codes[i] = E2M1(x[i] / (decoded s * g)),
//   decode x^ = e2m1 * decoded s * g.
// A block whose scale is 0 — all zeros, or an amax so small that amax / (6 g) rounds to 0 (below
// 2^-10 * 6 g; choose g to avoid it) — gets all codes 0 and decodes to zeros. +-inf in a block:
// the scale saturates and the inf codes saturate to +-6. NaN in a block: scale = NaN code, codes 0,
// the block decodes to NaN. global_scale must be finite and > 0 (kvq::Error otherwise).
inline size_t nvfp4_scale_count(size_t n) { return (n + kNvfp4Block - 1) / kNvfp4Block; }
void encode_nvfp4(const float* x, size_t n, uint8_t* codes, uint8_t* scales,
                  float global_scale = 1.0f);
void decode_nvfp4(const uint8_t* codes, const uint8_t* scales, size_t n, float* out,
                  float global_scale = 1.0f);

struct Nvfp4Codes {
  std::vector<uint8_t> codes;   // n
  std::vector<uint8_t> scales;  // nvfp4_scale_count(n)
};
Nvfp4Codes encode_nvfp4(const float* x, size_t n, float global_scale = 1.0f);

}  // namespace kvq::codec
