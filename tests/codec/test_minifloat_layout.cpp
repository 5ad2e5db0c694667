// Coding kind 3 (kMinifloat) in the packed layout: the bytes of hand-worked FP8 and NVFP4 tokens
// (schemas/packed-layout.md, kind 3), the sizes and effective bits, and the decisions refused.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "kvq/codec/codec.hpp"
#include "kvq/format/decision_layout.hpp"
#include "kvq/util/error.hpp"

namespace {

using kvq::CodingKind;
using kvq::HeadDecision;
using kvq::MinifloatFormat;

HeadDecision minifloat(MinifloatFormat f, float scale, kvq::Side side = kvq::Side::kV) {
  HeadDecision h;
  h.layer = 2;
  h.kv_head = 1;
  h.side = side;
  h.kind = CodingKind::kMinifloat;
  h.post_rope = side == kvq::Side::kK;
  h.minifloat = f;
  h.scale = scale;
  return h;
}

// x / scale = 2, -0.5, 448, 600 (saturates), 0, -0, 2^-9 (smallest subnormal), 6. E4M3 patterns by
// hand (sign | exponent+7 << 3 | mantissa): 2 = 0x40, -0.5 = 0xB0, 448 = 0x7E, 0, -0 = 0x80,
// 2^-9 = 0x01, 6 = 1.5 * 2^2 = 0x4C.
TEST(MinifloatLayout, Fp8TokenBytes) {
  const auto dec = minifloat(MinifloatFormat::kFp8E4M3, 0.5f);
  const float x[8] = {1.0f, -0.25f, 224.0f, 300.0f, 0.0f, -0.0f, 0x1p-10f, 3.0f};
  kvq::codec::HeadCodec c(dec, 8);
  EXPECT_EQ(c.layout().meta_bytes, 0u);
  EXPECT_EQ(c.layout().block_bytes, 8u);
  const auto bytes = c.encode(x, 1);
  const std::vector<uint8_t> want = {0x40, 0xB0, 0x7E, 0x7E, 0x00, 0x80, 0x01, 0x4C};
  EXPECT_EQ(bytes, want);
  float y[8];
  c.decode(bytes.data(), 1, y);
  const float back[8] = {1.0f, -0.25f, 224.0f, 224.0f, 0.0f, -0.0f, 0x1p-10f, 3.0f};
  for (int i = 0; i < 8; ++i) {
    EXPECT_EQ(y[i], back[i]) << i;
    EXPECT_EQ(std::signbit(y[i]), std::signbit(back[i])) << i;
  }
  uint8_t codes[8];
  c.unpack_codes(bytes.data(), 1, codes);
  EXPECT_EQ(std::vector<uint8_t>(codes, codes + 8), want);
}

// One NVFP4 block of 16 with amax 6 and global scale g: block scale E4M3(6 / (6 g) / ... ) = 1.0 =
// 0x38 when x is given in units of g. E2M1 codes (sign << 3 | magnitude index into
// {0, .5, 1, 1.5, 2, 3, 4, 6}); ties go to the even code: 0.25 -> 0, 0.75 -> 1.0 (2), 5 -> 4 (6),
// 2.5 -> 2 (4). Two codes per byte, the first in the low nibble.
const float kBlock[16] = {0, 0.5f, 1, 1.5f, 2, 3, 4, 6, -0.5f, -1, -6, 0.25f, 0.75f, 5, 2.5f, -3};
const uint8_t kBlockCodes[8] = {0x10, 0x32, 0x54, 0x76, 0xA9, 0x0F, 0x62, 0xD4};

TEST(MinifloatLayout, Nvfp4TokenBytes) {
  // d = 32, g = 0.25: block 0 as above (scaled by g), block 1 all zeros (scale 0, codes 0).
  const float g = 0.25f;
  std::vector<float> x(32, 0.0f);
  for (int i = 0; i < 16; ++i) x[size_t(i)] = kBlock[i] * g;
  kvq::codec::HeadCodec c(minifloat(MinifloatFormat::kNvfp4, g), 32);
  EXPECT_EQ(c.layout().n_records, 2u);
  EXPECT_EQ(c.layout().meta_bytes, 2u);
  EXPECT_EQ(c.layout().block_bytes, 18u);
  const auto bytes = c.encode(x.data(), 1);
  std::vector<uint8_t> want = {0x38, 0x00};
  want.insert(want.end(), kBlockCodes, kBlockCodes + 8);
  want.insert(want.end(), 8, 0x00);
  EXPECT_EQ(bytes, want);
  std::vector<float> y(32);
  c.decode(bytes.data(), 1, y.data());
  const float back[16] = {0, 0.5f, 1, 1.5f, 2, 3, 4, 6, -0.5f, -1, -6, 0, 1, 4, 2, -3};
  for (int i = 0; i < 16; ++i) EXPECT_EQ(y[size_t(i)], back[i] * g) << i;
  for (int i = 16; i < 32; ++i) EXPECT_EQ(y[size_t(i)], 0.0f) << i;
  std::vector<uint8_t> codes(32);
  c.unpack_codes(bytes.data(), 1, codes.data());
  const uint8_t want_codes[16] = {0, 1, 2, 3, 4, 5, 6, 7, 9, 0xA, 0xF, 0, 2, 6, 4, 0xD};
  for (int i = 0; i < 16; ++i) EXPECT_EQ(codes[size_t(i)], want_codes[i]) << i;
}

TEST(MinifloatLayout, Nvfp4PartialBlockAndPadding) {
  // d = 16: 1 scale byte + 8 code bytes = 9, padded to 10 (5 bits per dim); d = 8: 1 + 4 -> 6.
  kvq::codec::HeadCodec c16(minifloat(MinifloatFormat::kNvfp4, 1.0f), 16);
  EXPECT_EQ(c16.layout().block_bytes, 10u);
  const auto bytes = c16.encode(kBlock, 1);
  std::vector<uint8_t> want = {0x38};
  want.insert(want.end(), kBlockCodes, kBlockCodes + 8);
  want.push_back(0x00);
  EXPECT_EQ(bytes, want);
  kvq::codec::HeadCodec c8(minifloat(MinifloatFormat::kNvfp4, 1.0f), 8);
  EXPECT_EQ(c8.layout().block_bytes, 6u);
  // The first 8 values alone: amax 6 again -> scale 0x38, codes 0..7.
  EXPECT_EQ(c8.encode(kBlock, 1), (std::vector<uint8_t>{0x38, 0x10, 0x32, 0x54, 0x76, 0x00}));
}

TEST(MinifloatLayout, EffectiveBitsPerDim) {
  for (int d : {64, 128, 256}) {
    EXPECT_DOUBLE_EQ(kvq::layout::effective_bpd(minifloat(MinifloatFormat::kFp8E4M3, 1.f), d), 8.0) << d;
    EXPECT_DOUBLE_EQ(kvq::layout::effective_bpd(minifloat(MinifloatFormat::kNvfp4, 1.f), d), 4.5) << d;
  }
  // d = 96 (6 blocks): 6 + 48 = 54 bytes = 4.5 too; d = 8: 6 bytes = 6 bits per dim.
  EXPECT_DOUBLE_EQ(kvq::layout::effective_bpd(minifloat(MinifloatFormat::kNvfp4, 1.f), 96), 4.5);
  EXPECT_DOUBLE_EQ(kvq::layout::effective_bpd(minifloat(MinifloatFormat::kNvfp4, 1.f), 8), 6.0);
}

TEST(MinifloatLayout, ManyTokensKeepTheirBlocks) {
  // Token t of a T-token buffer is the single-token encoding, at t * block_bytes.
  for (auto f : {MinifloatFormat::kFp8E4M3, MinifloatFormat::kNvfp4})
    for (int d : {8, 64, 96, 128}) {
      std::vector<float> x(size_t(5) * d);
      for (size_t i = 0; i < x.size(); ++i) x[i] = std::sin(0.37 * double(i)) * (1 + double(i % 7));
      // Scales that keep |x| <= 7 in range: FP8 8/448 (no saturation), NVFP4 0.01 (block scales <= 117).
      const float scale = f == MinifloatFormat::kFp8E4M3 ? 8.0f / 448.0f : 0.01f;
      kvq::codec::HeadCodec c(minifloat(f, scale, kvq::Side::kK), d);
      const auto all = c.encode(x.data(), 5);
      ASSERT_EQ(all.size(), 5 * c.layout().block_bytes);
      std::vector<float> y(x.size());
      c.round_trip(x.data(), 5, y.data());
      for (int t = 0; t < 5; ++t) {
        const auto one = c.encode(x.data() + size_t(t) * d, 1);
        EXPECT_TRUE(std::equal(one.begin(), one.end(), all.begin() + std::ptrdiff_t(t) * c.layout().block_bytes));
        std::vector<float> z(static_cast<size_t>(d));
        c.decode(one.data(), 1, z.data());
        for (int i = 0; i < d; ++i) EXPECT_EQ(z[size_t(i)], y[size_t(t) * d + i]);
      }
      // Relative error bounded by the format: E4M3 half an ulp (2^-4) of each value, NVFP4 half a
      // step of the block (amax / 6 * 0.5 after the scale's own rounding, <= amax / 8).
      for (size_t i = 0; i < x.size(); ++i) {
        if (f == MinifloatFormat::kFp8E4M3) EXPECT_LE(std::fabs(y[i] - x[i]), std::fabs(x[i]) / 16 + 0x1p-10 * scale) << i;  // + subnormal step / 2
        else EXPECT_LE(std::fabs(y[i] - x[i]), 8.0 / 6.0) << i;  // |x| <= 8 here
      }
    }
}

void expect_refused(const HeadDecision& dec, const std::string& needle) {
  try {
    kvq::codec::HeadCodec c(dec, 64);
    ADD_FAILURE() << "accepted; wanted '" << needle << "'";
  } catch (const kvq::Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find(needle), std::string::npos) << m;
    EXPECT_NE(m.find("L2 H1"), std::string::npos) << m;
  }
}

TEST(MinifloatLayout, BadDecisionsAreErrors) {
  for (float s : {0.0f, -1.0f, std::numeric_limits<float>::infinity(), std::numeric_limits<float>::quiet_NaN()}) {
    expect_refused(minifloat(MinifloatFormat::kFp8E4M3, s), "scale: must be finite and > 0 for fp8");
    expect_refused(minifloat(MinifloatFormat::kNvfp4, s), "scale: must be finite and > 0 for nvfp4");
  }
  expect_refused(minifloat(static_cast<MinifloatFormat>(7), 1.f), "minifloat: unknown format 7");
  // Non-finite inputs are refused like every kind's.
  kvq::codec::HeadCodec c(minifloat(MinifloatFormat::kFp8E4M3, 1.f), 8);
  float x[8] = {0, 0, 0, std::numeric_limits<float>::infinity(), 0, 0, 0, 0};
  EXPECT_THROW(c.encode(x, 1), kvq::Error);
}

}  // namespace
