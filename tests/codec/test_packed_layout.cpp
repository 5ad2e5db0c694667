// The packed layout: fp16 fields, the code bit stream, block sizes, and the worked example of
// schemas/packed-layout.md byte for byte.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "kvq/format/packed_layout.hpp"
#include "kvq/util/rng.hpp"

namespace kvq::layout {
namespace {

TEST(Fp16, HalfToFloatMatchesCompilerForEveryValue) {
  for (uint32_t h = 0; h < 65536; ++h) {
    _Float16 ref;
    const uint16_t hb = static_cast<uint16_t>(h);
    std::memcpy(&ref, &hb, 2);
    const float want = static_cast<float>(ref);
    const float got = f16_to_f32(hb);
    if (std::isnan(want)) {
      EXPECT_TRUE(std::isnan(got)) << std::hex << h;
      continue;
    }
    EXPECT_EQ(f32_bits(got), f32_bits(want)) << std::hex << h;
    EXPECT_EQ(f32_to_f16(got), hb) << std::hex << h;  // round trip is exact
  }
}

TEST(Fp16, FloatToHalfRoundsToNearestEven) {
  auto check = [](uint32_t bits) {
    const float f = f32_from_bits(bits);
    const _Float16 ref = static_cast<_Float16>(f);
    uint16_t want;
    std::memcpy(&want, &ref, 2);
    const uint16_t got = f32_to_f16(f);
    if (std::isnan(f)) {
      EXPECT_EQ(got & 0x7c00, 0x7c00);
      EXPECT_NE(got & 0x3ff, 0);
    } else {
      EXPECT_EQ(got, want) << std::hex << bits;
    }
  };
  for (uint64_t b = 0; b < (1ull << 32); b += 4093) check(static_cast<uint32_t>(b));
  // Around every rounding boundary: ties and neighbours, subnormals, overflow.
  for (uint32_t h = 0; h < 0x7c00; ++h) {
    const uint32_t mid = f32_bits(f16_to_f32(static_cast<uint16_t>(h))) + (1u << 12);
    for (int64_t delta = -2; delta <= 2; ++delta) {
      check(static_cast<uint32_t>(mid + delta));
      check(static_cast<uint32_t>(mid + delta) | 0x80000000u);
    }
  }
  EXPECT_EQ(f32_to_f16(65504.f), 0x7bff);
  EXPECT_EQ(f32_to_f16(65519.f), 0x7bff);
  EXPECT_EQ(f32_to_f16(65520.f), 0x7c00);
  EXPECT_EQ(f32_to_f16(1.5f), 0x3e00);
  EXPECT_EQ(f32_to_f16(std::ldexp(1.f, -24)), 0x0001);
  EXPECT_EQ(f32_to_f16(std::ldexp(1.f, -25)), 0x0000);  // tie to even: zero
}

TEST(Bits, LsbFirstExample) {
  // codes 1, 2, 3 at 3 bits: stream bits 0-2 = 001, 3-5 = 010, 6-8 = 011 (LSB first)
  uint8_t buf[2] = {0, 0};
  const uint8_t codes[3] = {1, 2, 3};
  pack_codes(codes, 3, 3, buf, 0);
  EXPECT_EQ(buf[0], 0xD1);
  EXPECT_EQ(buf[1], 0x00);
}

// Every width 1..8, group sizes 1, 3, 7, 33, 64, every start bit 0..7: codes survive bit for bit,
// nothing outside the stream is written, and reads stay inside a buffer that ends at the last code.
TEST(Bits, PackUnpackAllWidthsAndGroupSizes) {
  kvq::Rng rng(77);
  for (uint32_t bits = 1; bits <= 8; ++bits) {
    for (uint32_t n : {1u, 3u, 7u, 33u, 64u}) {
      for (uint32_t start = 0; start < 8; ++start) {
        std::vector<uint8_t> codes(n), back(n);
        for (auto& c : codes) c = static_cast<uint8_t>(rng.next() & ((1u << bits) - 1));
        const uint32_t nbytes = bytes_for_bits(start + uint64_t{n} * bits);
        std::vector<uint8_t> buf(nbytes, 0);  // exactly sized: ASan catches an over-read
        pack_codes(codes.data(), n, bits, buf.data(), start);
        unpack_codes(buf.data(), start, bits, n, back.data());
        EXPECT_EQ(codes, back) << "bits=" << bits << " n=" << n << " start=" << start;
        // bits before `start` and after the last code stay zero
        EXPECT_EQ(buf[0] & ((1u << start) - 1), 0u);
        const uint32_t end = start + n * bits;
        if (end % 8) {
          EXPECT_EQ(buf[nbytes - 1] >> (end % 8), 0u);
        }
        for (uint32_t i = 0; i < n; ++i)
          EXPECT_EQ(get_code(buf.data(), start + uint64_t{i} * bits, bits), codes[i]);
      }
    }
  }
}

TEST(Layout, TqSizes) {
  const uint16_t dims[] = {128};
  const uint8_t bits[] = {3};
  const PackedLayout L = make_tq_layout(kSideK, 128, dims, bits, 1);
  EXPECT_EQ(L.meta_bytes, 2u);
  EXPECT_EQ(L.code_bits_per_token, 384u);
  EXPECT_EQ(L.block_bytes, 50u);  // = vLLM's TurboQuant K slot: ceil(d b / 8) + 2
  EXPECT_DOUBLE_EQ(effective_bpd(L), 50 * 8 / 128.0);
  EXPECT_EQ(packed_bytes(L, 10), 500u);
}

TEST(Layout, LowRankSizes) {
  const PackedLayout L = make_lrh_layout(kSideK, 128, 32, 4);
  EXPECT_EQ(L.block_bytes, 18u);
  EXPECT_DOUBLE_EQ(effective_bpd(L), 18 * 8 / 128.0);
  const PackedLayout odd = make_lrh_layout(kSideV, 96, 18, 3);  // 2 + ceil(54 / 8) = 9 -> 10
  EXPECT_EQ(odd.block_bytes, 10u);
}

// KIVI metadata: one fp16 (scale, zero) per group: 32 bits per group_size values.
// K: bpd = b + 32/g exactly (a block of g tokens x d channels; g*d*b bits is whole bytes for g=32).
// V: bpd = b + 32*ceil(d/g)/d + padding/d; = b + 1 exactly when g | d.
TEST(Layout, KiviMetadataIsOneBitPerDimAtGroup32) {
  for (uint32_t d : {8u, 64u, 96u, 128u, 256u}) {
    for (uint32_t b = 1; b <= 8; ++b) {
      const PackedLayout k = make_kivi_layout(kSideK, d, b, 32);
      EXPECT_EQ(k.tokens_per_block, 32u);
      EXPECT_EQ(k.block_bytes, 4 * d + 32 * d * b / 8);
      EXPECT_DOUBLE_EQ(effective_bpd(k), b + 1.0) << "d=" << d << " b=" << b;

      const PackedLayout v = make_kivi_layout(kSideV, d, b, 32);
      const uint32_t groups = (d + 31) / 32;
      EXPECT_EQ(v.block_bytes, align_up(4 * groups + bytes_for_bits(d * b), 2));
      const double exact = b + 32.0 * groups / d + 8.0 * (v.block_bytes - 4 * groups - d * b / 8.0) / d;
      EXPECT_DOUBLE_EQ(effective_bpd(v), exact) << "d=" << d << " b=" << b;
      if (d % 32 == 0 && (d * b) % 16 == 0) {
        EXPECT_DOUBLE_EQ(effective_bpd(v), b + 1.0);
      }
    }
  }
  EXPECT_DOUBLE_EQ(effective_bpd(make_kivi_layout(kSideV, 8, 2, 32)), 2 + 4.0);  // one group of 8
}

// schemas/packed-layout.md, "Worked example": d = 8, Block-GTQ K, split-half blocks; blocks 0,1
// at 3 bits (group 0, dims 0 4 1 5), blocks 2,3 at 2 bits (group 1, dims 2 6 3 7).
TEST(Layout, WorkedExampleBytes) {
  const uint16_t dims[] = {4, 4};
  const uint8_t bits[] = {3, 2};
  const PackedLayout L = make_tq_layout(kSideK, 8, dims, bits, 2);
  ASSERT_EQ(L.meta_bytes, 4u);
  ASSERT_EQ(L.code_bits_per_token, 20u);
  ASSERT_EQ(L.groups[1].code_bit_offset, 12u);
  ASSERT_EQ(L.block_bytes, 8u);
  EXPECT_DOUBLE_EQ(effective_bpd(L), 8.0);

  std::vector<uint8_t> slot(L.block_bytes, 0);
  store_u16le(&slot[0], f32_to_f16(1.5f));
  store_u16le(&slot[2], f32_to_f16(0.25f));
  const uint8_t g0[] = {5, 0, 7, 2}, g1[] = {1, 3, 0, 2};
  pack_codes(g0, 4, 3, &slot[L.meta_bytes], L.groups[0].code_bit_offset);
  pack_codes(g1, 4, 2, &slot[L.meta_bytes], L.groups[1].code_bit_offset);
  const std::vector<uint8_t> want = {0x00, 0x3E, 0x00, 0x34, 0xC5, 0xD5, 0x08, 0x00};
  EXPECT_EQ(slot, want);
}

}  // namespace
}  // namespace kvq::layout
