// vLLM's TurboQuant KV cache reproduced (kvq/codec/vllm_turboquant.hpp), against independent truth:
// the key codebook against a second computation of vLLM's algorithm written apart in Python
// (tests/codec/vllm_tq_lloyd_max.py: another arrangement of the sums) to the last float32 bit, and
// against the values published in ../shared/VLLM-TURBOQUANT.md; the slot sizes vLLM's config gives;
// the Hadamard matrix orthonormal; codes and bytes of known vectors worked out by hand; the key
// quantizer's error on Gaussian vectors against the distortion integrated from the codebook.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "kvq/codec/codec.hpp"
#include "kvq/codec/vllm_turboquant.hpp"
#include "kvq/format/coding_kinds.hpp"
#include "run_cmd.hpp"

using namespace kvq::vllm_tq;

namespace {

uint32_t bits_of(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

std::vector<uint8_t> encode(const Codec& c, const std::vector<float>& k, const std::vector<float>& v) {
  std::vector<uint8_t> slot(size_t(c.layout().slot_bytes), 0xAB);
  c.encode(k.data(), v.data(), slot.data());
  return slot;
}

}  // namespace

TEST(VllmTurboQuant, CodebookEqualsASecondComputationToTheLastBit) {
  const std::string script = std::string(KVQ_SOURCE_DIR) + "/tests/codec/vllm_tq_lloyd_max.py";
  if (kvq::test::run_cmd("python3 -c 'import math'").status != 0) GTEST_SKIP() << "no python3";
  for (int D : {64, 128, 256})
    for (int bits : {3, 4}) {
      SCOPED_TRACE("D " + std::to_string(D) + ", " + std::to_string(bits) + " bits");
      const Codebook cb = lloyd_max(D, bits);
      const std::string out = kvq::test::temp_path("vllm_tq_" + std::to_string(D) + "_" + std::to_string(bits) + ".txt");
      const auto r = kvq::test::run_cmd("python3 " + script + " " + std::to_string(D) + " " + std::to_string(bits) + " > " + out);
      ASSERT_EQ(r.status, 0) << r.err;
      std::ifstream in(out);
      int iterations = -1;
      in >> iterations;
      EXPECT_EQ(cb.iterations, iterations);
      ASSERT_EQ(cb.centroids.size(), size_t(1) << bits);
      for (size_t i = 0; i < cb.centroids.size(); ++i) {
        std::string hex;
        in >> hex;
        ASSERT_EQ(hex.size(), 8u);
        uint8_t b[4];
        for (int j = 0; j < 4; ++j) b[j] = uint8_t(std::stoul(hex.substr(size_t(2 * j), 2), nullptr, 16));
        const uint32_t want = uint32_t(b[0]) | uint32_t(b[1]) << 8 | uint32_t(b[2]) << 16 | uint32_t(b[3]) << 24;
        EXPECT_EQ(bits_of(cb.centroids[i]), want) << "centroid " << i << " = " << cb.centroids[i];
      }
      // The midpoints the store kernel searches: fp32 sums of fp32 centroids, halved.
      ASSERT_EQ(cb.midpoints.size(), cb.centroids.size() - 1);
      for (size_t i = 0; i < cb.midpoints.size(); ++i)
        EXPECT_EQ(bits_of(cb.midpoints[i]), bits_of((cb.centroids[i] + cb.centroids[i + 1]) * 0.5f));
    }
}

// The values transcribed for D = 128 in ../shared/VLLM-TURBOQUANT.md (computed there independently):
// 3 bits stop after 137 updates, 4 bits run all 200.
TEST(VllmTurboQuant, CodebookMatchesThePublishedValues) {
  const Codebook c3 = lloyd_max(128, 3), c4 = lloyd_max(128, 4);
  EXPECT_EQ(c3.iterations, 137);
  EXPECT_EQ(c4.iterations, 200);
  const double p3[] = {0.021653695, 0.0667902604, 0.118721463, 0.190065846};
  const double p4[] = {0.011351509, 0.0343068577, 0.0580605306, 0.0833014399,
                       0.111038528, 0.143001899,  0.182826623,  0.241381705};
  for (int i = 0; i < 4; ++i) {
    EXPECT_NEAR(c3.centroids[size_t(4 + i)], p3[i], 1e-9);
    EXPECT_NEAR(c3.centroids[size_t(3 - i)], -p3[i], 1e-9);
  }
  for (int i = 0; i < 8; ++i) {
    EXPECT_NEAR(c4.centroids[size_t(8 + i)], p4[i], 1e-9);
    EXPECT_NEAR(c4.centroids[size_t(7 - i)], -p4[i], 1e-9);
  }
}

// vLLM's config.py at D = 128: key ceil(D b / 8) + 2 (fp16 norm) or D (FP8), value ceil(D b / 8) + 4,
// the slot rounded up to even: k8v4 196, 4bit_nc 134, k3v4_nc 118, 3bit_nc 102.
TEST(VllmTurboQuant, SlotSizesAreTheEngines) {
  EXPECT_EQ(slot_layout(Preset::kK8V4, 128).slot_bytes, 196);
  EXPECT_EQ(slot_layout(Preset::k4BitNc, 128).slot_bytes, 134);
  EXPECT_EQ(slot_layout(Preset::kK3V4Nc, 128).slot_bytes, 118);
  EXPECT_EQ(slot_layout(Preset::k3BitNc, 128).slot_bytes, 102);
  // D = 256, worked by hand: k3v4_nc 96 + 2 + 128 + 4 = 230; 3bit_nc 96 + 2 + 96 + 4 = 198.
  EXPECT_EQ(slot_layout(Preset::kK3V4Nc, 256).slot_bytes, 230);
  EXPECT_EQ(slot_layout(Preset::k3BitNc, 256).slot_bytes, 198);
  // D = 8: k3v4_nc 3 + 2 + 4 + 4 = 13, rounded up to 14.
  EXPECT_EQ(slot_layout(Preset::kK3V4Nc, 8).slot_bytes, 14);
  for (int bad : {0, 4, 96, 80, 512}) {
    EXPECT_THROW(slot_layout(Preset::k4BitNc, bad), std::invalid_argument) << bad;
    EXPECT_FALSE(unsupported_head_dim(bad).empty()) << bad;
  }
  EXPECT_NE(unsupported_head_dim(96).find("not a power of two"), std::string::npos);
  EXPECT_EQ(*parse_preset("turboquant_k3v4_nc"), Preset::kK3V4Nc);
  EXPECT_FALSE(parse_preset("turboquant_2bit").has_value());
  EXPECT_EQ(info(Preset::k4BitNc).key_bits, 4);
  EXPECT_TRUE(info(Preset::k3BitNc).norm_correction);
  EXPECT_FALSE(info(Preset::kK8V4).norm_correction);
}

TEST(VllmTurboQuant, HadamardIsSymmetricAndOrthonormal) {
  for (int D : {8, 64, 128, 256}) {
    const std::vector<float> h = hadamard(D);
    const float mag = float(1.0 / std::sqrt(double(D)));
    for (int i = 0; i < D; ++i)
      for (int j = 0; j < D; ++j) {
        const float x = h[size_t(i * D + j)];
        ASSERT_NEAR(std::fabs(x), mag, 1e-7f);
        ASSERT_EQ(x, h[size_t(j * D + i)]);
        double dot = 0.0;
        for (int t = 0; t < D; ++t) dot += double(h[size_t(i * D + t)]) * double(h[size_t(j * D + t)]);
        ASSERT_NEAR(dot, i == j ? 1.0 : 0.0, 1e-6) << D << " " << i << " " << j;
      }
    for (int j = 0; j < D; ++j) EXPECT_GT(h[size_t(j)], 0.0f);  // Sylvester: the first row all +
  }
}

// Worked by hand. D = 128, k3v4_nc: the key 2 e_0 normalises to e_0 exactly (2 + 1e-8 is 2 in fp32),
// so y is the Hadamard matrix's first row, 1/sqrt(128) = 0.0884 everywhere: between the midpoints
// 0.0442 and 0.0928, so 5 midpoints lie below it and every code is 5 (centroid +0.0668). 3-bit words
// of eight 5s: 0b101 repeated = 0xB6DB6D, bytes 6D DB B6; the norm fp16(2) = 0x4000, bytes 00 40.
// Decoding: c = 0.0668 everywhere, normalised to 1/sqrt(128), times H = e_0, times 2 = the key.
TEST(VllmTurboQuant, AxisAlignedKeyCodesByHand) {
  const Codec c(Preset::kK3V4Nc, 128);
  std::vector<float> k(128, 0.0f), v(128, 1.0f);
  k[0] = 2.0f;
  const auto slot = encode(c, k, v);
  for (int g = 0; g < 16; ++g) {
    EXPECT_EQ(slot[size_t(3 * g)], 0x6D);
    EXPECT_EQ(slot[size_t(3 * g + 1)], 0xDB);
    EXPECT_EQ(slot[size_t(3 * g + 2)], 0xB6);
  }
  EXPECT_EQ(slot[48], 0x00);
  EXPECT_EQ(slot[49], 0x40);
  std::vector<float> kd(128), vd(128);
  c.decode(slot.data(), kd.data(), vd.data());
  EXPECT_NEAR(kd[0], 2.0f, 1e-5f);
  for (int j = 1; j < 128; ++j) ASSERT_NEAR(kd[size_t(j)], 0.0f, 1e-5f) << j;
  // A constant value: mn = mx = 1, scale 1e-8 (fp16: 0, below its smallest subnormal's half), codes
  // 0, zero fp16(1) = 0x3C00; decodes to 1 exactly.
  const int vb = c.layout().key_bytes;
  for (int j = 0; j < 64; ++j) EXPECT_EQ(slot[size_t(vb + j)], 0) << j;
  EXPECT_EQ(slot[size_t(vb + 64)], 0x00);
  EXPECT_EQ(slot[size_t(vb + 65)], 0x00);
  EXPECT_EQ(slot[size_t(vb + 66)], 0x00);
  EXPECT_EQ(slot[size_t(vb + 67)], 0x3C);
  for (float x : vd) ASSERT_EQ(x, 1.0f);
  EXPECT_EQ(c.layout().slot_bytes, 118);
}

// D = 8 values by hand. 4 bits: v = 0..6, 15 has mn 0, mx 15, scale 1: codes = v; bytes
// 0x10 0x32 0x54 0xF6; scale fp16(1) = 3C00, zero 0. 3 bits: v = 0..7, scale 1, codes = v; the word
// sum(i << 3i) = 0xFAC688, bytes 88 C6 FA.
TEST(VllmTurboQuant, ValueCodesByHand) {
  std::vector<float> k(8, 0.5f);
  {
    const Codec c(Preset::kK3V4Nc, 8);
    const auto slot = encode(c, k, {0, 1, 2, 3, 4, 5, 6, 15});
    const size_t vb = size_t(c.layout().key_bytes);
    const uint8_t want[] = {0x10, 0x32, 0x54, 0xF6, 0x00, 0x3C, 0x00, 0x00};
    for (size_t j = 0; j < 8; ++j) EXPECT_EQ(slot[vb + j], want[j]) << j;
    EXPECT_EQ(slot[13], 0) << "the pad byte";
    std::vector<float> kd(8), vd(8);
    c.decode(slot.data(), kd.data(), vd.data());
    EXPECT_EQ(vd, (std::vector<float>{0, 1, 2, 3, 4, 5, 6, 15}));
  }
  {
    const Codec c(Preset::k3BitNc, 8);
    const auto slot = encode(c, k, {0, 1, 2, 3, 4, 5, 6, 7});
    const size_t vb = size_t(c.layout().key_bytes);
    const uint8_t want[] = {0x88, 0xC6, 0xFA, 0x00, 0x3C, 0x00, 0x00};
    for (size_t j = 0; j < 7; ++j) EXPECT_EQ(slot[vb + j], want[j]) << j;
    std::vector<uint8_t> kc(8), vc(8);
    c.unpack(slot.data(), kc.data(), vc.data());
    for (int j = 0; j < 8; ++j) EXPECT_EQ(vc[size_t(j)], j);
  }
  // A rounding case: v = 0, 0.5, 1 .. with mx 15: (0.5 - 0) / 1 + 0.5 = 1.0 -> code 1 (ties go up).
  {
    const Codec c(Preset::kK3V4Nc, 8);
    const auto slot = encode(c, k, {0, 0.5f, 0.49f, 2.5f, 3.2f, 14.6f, 14.4f, 15});
    std::vector<uint8_t> kc(8), vc(8);
    c.unpack(slot.data(), kc.data(), vc.data());
    EXPECT_EQ(vc, (std::vector<uint8_t>{0, 1, 0, 3, 3, 15, 14, 15}));
  }
}

// A value with a minimum below -65504: its zero is -inf in fp16 (bytes 00 FC) and the vector decodes
// non-finite — the engine's behaviour (vLLM #53334), reproduced, not repaired.
TEST(VllmTurboQuant, HugeNegativeMinimumOverflowsAsInTheEngine) {
  const Codec c(Preset::k4BitNc, 64);
  std::vector<float> k(64, 1.0f), v(64, 0.0f);
  v[3] = -70000.0f;
  const auto slot = encode(c, k, v);
  const size_t z = size_t(c.layout().key_bytes + c.layout().value_code_bytes + 2);
  EXPECT_EQ(slot[z], 0x00);
  EXPECT_EQ(slot[z + 1], 0xFC);
  std::vector<float> kd(64), vd(64);
  c.decode(slot.data(), kd.data(), vd.data());
  for (float x : vd) EXPECT_FALSE(std::isfinite(x));
}

// k8v4 keys are a plain FP8 E4M3 cast (round to nearest even, saturating), worked by hand: 1 = 0x38,
// -2.5 = 1.25 * 2^1 -> 0xC2, 448 = 0x7E, 1000 saturates to 0x7E, 2^-9 (smallest subnormal) = 0x01,
// 0 = 0x00, -0 = 0x80, 3.14159 = 1.5708 * 2 -> mantissa 4.57 rounds to 5 -> 0x45 (3.25).
TEST(VllmTurboQuant, Fp8KeysByHand) {
  const Codec c(Preset::kK8V4, 8);
  const std::vector<float> k{1.0f, -2.5f, 448.0f, 1000.0f, 0.001953125f, 0.0f, -0.0f, 3.14159f};
  const auto slot = encode(c, k, std::vector<float>(8, 2.0f));
  const uint8_t want[] = {0x38, 0xC2, 0x7E, 0x7E, 0x01, 0x00, 0x80, 0x45};
  for (size_t j = 0; j < 8; ++j) EXPECT_EQ(slot[j], want[j]) << j;
  std::vector<float> kd(8), vd(8);
  c.decode(slot.data(), kd.data(), vd.data());
  EXPECT_EQ(kd, (std::vector<float>{1.0f, -2.5f, 448.0f, 448.0f, 0.001953125f, 0.0f, -0.0f, 3.25f}));
  EXPECT_EQ(c.layout().slot_bytes, 8 + 4 + 4);
}

// Gaussian keys: the squared error of the codes (y - c(y), before norm correction) averages D times
// the codebook's distortion for one coordinate of a uniform direction, integral (y - c(y))^2 f(y) dy
// — integrated here by Simpson's rule on 20,000 intervals per cell from the codebook alone. Within 4 standard errors of the sample mean. After norm correction the
// decoded key has the stored norm.
TEST(VllmTurboQuant, KeyErrorMatchesTheCodebookDistortion) {
  for (Preset p : {Preset::k4BitNc, Preset::k3BitNc}) {
    const int D = 128;
    const Codec c(p, D);
    const Codebook& cb = c.codebook();
    // A coordinate of a uniform direction on the sphere S^(D-1) (a Gaussian vector, normalised and
    // rotated) has density Gamma(D/2) / (sqrt(pi) Gamma((D-1)/2)) (1 - y^2)^((D-3)/2) on [-1, 1]:
    // variance 1/D, lighter tails than N(0, 1/D), for which the codebook was solved.
    const double sd = 1.0 / std::sqrt(double(D));
    const double lognorm = std::lgamma(D / 2.0) - std::lgamma((D - 1) / 2.0) - 0.5 * std::log(M_PI);
    auto phi = [&](double y) { return y * y >= 1 ? 0.0 : std::exp(lognorm + (D - 3) / 2.0 * std::log1p(-y * y)); };
    double expected = 0.0;
    for (size_t i = 0; i < cb.centroids.size(); ++i) {
      const double a = i == 0 ? -12 * sd : cb.midpoints[i - 1], b = i + 1 == cb.centroids.size() ? 12 * sd : cb.midpoints[i];
      const int n = 20000;
      const double h = (b - a) / n;
      double s = 0.0;
      for (int t = 0; t <= n; ++t) {
        const double y = a + t * h, e = (y - cb.centroids[i]) * (y - cb.centroids[i]) * phi(y);
        s += (t == 0 || t == n ? 1 : t % 2 ? 4 : 2) * e;
      }
      expected += s * h / 3;
    }
    expected *= D;
    std::mt19937 rng(11);
    std::normal_distribution<float> g(0.0f, 1.0f);
    const std::vector<float>& H = c.rotation();
    const int N = 3000;
    double sum = 0.0, sum2 = 0.0;
    std::vector<float> k(D), v(D, 0.0f), kd(D), vd(D);
    std::vector<uint8_t> kc(D), vc(D);
    for (int n = 0; n < N; ++n) {
      double nn = 0.0;
      for (auto& x : k) {
        x = 3.0f * g(rng);
        nn += double(x) * x;
      }
      const auto slot = encode(c, k, v);
      c.unpack(slot.data(), kc.data(), vc.data());
      double err = 0.0;
      for (int j = 0; j < D; ++j) {
        double y = 0.0;
        for (int i = 0; i < D; ++i) y += k[size_t(i)] / std::sqrt(nn) * H[size_t(i * D + j)];
        const double e = y - cb.centroids[kc[size_t(j)]];
        err += e * e;
      }
      sum += err;
      sum2 += err * err;
      c.decode(slot.data(), kd.data(), vd.data());
      double dn = 0.0;
      for (float x : kd) dn += double(x) * x;
      ASSERT_NEAR(std::sqrt(dn), std::sqrt(nn), 2e-3 * std::sqrt(nn)) << "norm correction keeps the (fp16) norm";
    }
    const double mean = sum / N, se = std::sqrt((sum2 / N - mean * mean) / N);
    std::printf("NOTE %s: unit-key squared error %.6f (sample, se %.6f) vs %.6f from the codebook\n",
                info(p).name, mean, se, expected);
    EXPECT_NEAR(mean, expected, 4 * se + 1e-3 * expected) << info(p).name;
  }
}

// ---- the coding kind vllm-turboquant: one side of the slot in kvq's packed layout ----------------
// Its bytes hold exactly the slot's fields (the same code stream bytes, the same fp16 norm, scale
// and zero), and HeadCodec decodes them bit for bit as the engine's slot decodes.

namespace {

kvq::HeadDecision tq_kind(kvq::Side s, int bits) {
  kvq::HeadDecision dec;
  dec.kind = kvq::CodingKind::kVllmTurboQuant;
  dec.side = s;
  dec.bits = bits;
  return dec;
}

std::vector<float> gaussian(int n, int d, uint32_t seed, float scale) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> g(0.f, scale);
  std::vector<float> x(size_t(n) * size_t(d));
  for (float& v : x) v = g(rng);
  return x;
}

}  // namespace

TEST(VllmTurboQuantKind, BytesAreTheSlotsFieldsAndDecodeIsTheEngines) {
  for (int D : {64, 128, 256})
    for (int p = 0; p < kNumPresets; ++p) {
      const Preset preset = Preset(p);
      const Codec engine(preset, D);
      const SlotLayout& sl = engine.layout();
      const int kb = info(preset).key_bits, vb = info(preset).value_bits;
      const kvq::codec::HeadCodec kc(tq_kind(kvq::Side::kK, kb), D), vc(tq_kind(kvq::Side::kV, vb), D);
      const int n = 20;
      const std::vector<float> k = gaussian(n, D, 7u + unsigned(D), 1.7f), v = gaussian(n, D, 9u + unsigned(p), 0.3f);
      const std::vector<uint8_t> kp = kc.encode(k.data(), n), vp = vc.encode(v.data(), n);
      std::vector<float> kd(size_t(n) * D), vd(size_t(n) * D);
      kc.decode(kp.data(), n, kd.data());
      vc.decode(vp.data(), n, vd.data());
      const auto& kl = kc.layout();
      const auto& vl = vc.layout();
      const std::string where = std::string(info(preset).name) + " D " + std::to_string(D);
      ASSERT_EQ(int(kl.block_bytes), sl.key_bytes) << where;  // no padding at these dims
      ASSERT_EQ(int(vl.block_bytes), sl.value_bytes) << where;
      for (int t = 0; t < n; ++t) {
        std::vector<uint8_t> slot(static_cast<size_t>(sl.slot_bytes));
        engine.encode(&k[size_t(t) * D], &v[size_t(t) * D], slot.data());
        const uint8_t* kb_ = kp.data() + size_t(t) * kl.block_bytes;
        const uint8_t* vb_ = vp.data() + size_t(t) * vl.block_bytes;
        // Key: [fp16 norm | codes] here, [codes | fp16 norm] in the slot; FP8: the codes alone.
        EXPECT_EQ(0, std::memcmp(kb_ + kl.meta_bytes, slot.data(), size_t(sl.key_code_bytes))) << where << " t " << t;
        if (kb != 8) EXPECT_EQ(0, std::memcmp(kb_, slot.data() + sl.key_code_bytes, 2)) << where << " t " << t;
        // Value: [fp16 scale | fp16 zero | codes] here, [codes | scale | zero] in the slot.
        const uint8_t* sv = slot.data() + sl.key_bytes;
        EXPECT_EQ(0, std::memcmp(vb_ + 4, sv, size_t(sl.value_code_bytes))) << where << " t " << t;
        EXPECT_EQ(0, std::memcmp(vb_, sv + sl.value_code_bytes, 4)) << where << " t " << t;
        std::vector<float> ek(static_cast<size_t>(D)), ev(static_cast<size_t>(D));
        engine.decode(slot.data(), ek.data(), ev.data());
        for (int j = 0; j < D; ++j) {
          EXPECT_EQ(bits_of(kd[size_t(t) * D + j]), bits_of(ek[size_t(j)])) << where << " key t " << t << " j " << j;
          EXPECT_EQ(bits_of(vd[size_t(t) * D + j]), bits_of(ev[size_t(j)])) << where << " value t " << t << " j " << j;
        }
      }
    }
}

// A kept layer is stored in BF16: every decoded value is a bfloat16 (low 16 bits zero) and the
// nearest one to the input (no bfloat16 strictly between), ties to the even mantissa.
TEST(VllmTurboQuantKind, KeptLayerIsBf16RoundToNearestEven) {
  const int D = 96;  // any dim: vLLM keeps a skipped layer whatever its head dim
  std::vector<float> x = gaussian(8, D, 3, 5.f);
  x[0] = 1.0f + 1.0f / 256.f;        // a tie: 1 + 2^-8 lies halfway between 1 and 1 + 2^-7 -> 1 (even)
  x[1] = 1.0f + 3.0f / 256.f;        // a tie -> 1 + 2^-6 (even)
  x[2] = -0.0f;
  for (kvq::Side s : {kvq::Side::kK, kvq::Side::kV}) {
    const kvq::codec::HeadCodec c(tq_kind(s, 16), D);
    EXPECT_EQ(c.layout().block_bytes, uint32_t(2 * D));
    const auto packed = c.encode(x.data(), 8);
    std::vector<float> y(x.size());
    c.decode(packed.data(), 8, y.data());
    EXPECT_EQ(y[0], 1.0f);
    EXPECT_EQ(y[1], 1.0f + 4.0f / 256.f);
    EXPECT_EQ(bits_of(y[2]), 0x80000000u);
    for (size_t i = 3; i < x.size(); ++i) {
      ASSERT_EQ(bits_of(y[i]) & 0xFFFFu, 0u) << i;
      const float up = std::nextafter(y[i], INFINITY), dn = std::nextafter(y[i], -INFINITY);
      // The neighbouring bfloat16s are 2^16 float ulps away: the input lies within half of that.
      const double ulp = double(std::nextafter(float(std::fabs(y[i])), INFINITY)) - double(std::fabs(y[i]));
      EXPECT_LE(std::fabs(double(x[i]) - double(y[i])), 32768.0 * ulp * 1.0000001) << i << " " << up << " " << dn;
    }
  }
}

TEST(VllmTurboQuantKind, HeadDimRuleIsTheEnginesAndBadDecisionsAreRefused) {
  // vLLM codes exactly the powers of two 8..256 (3-bit words of 8 codes, its Hadamard builder).
  for (int D = 1; D <= 300; ++D) {
    const bool engine = D == 8 || D == 16 || D == 32 || D == 64 || D == 128 || D == 256;
    EXPECT_EQ(unsupported_head_dim(D).empty(), engine) << D;
  }
  auto refused = [](const kvq::HeadDecision& dec, int D, const std::string& want) {
    try {
      kvq::codec::HeadCodec c(dec, D);
      ADD_FAILURE() << "accepted bits " << dec.bits << " at D " << D;
    } catch (const kvq::Error& e) {
      EXPECT_NE(std::string(e.what()).find(want), std::string::npos) << e.what();
      EXPECT_EQ(std::string(e.what()).find('\n'), std::string::npos) << e.what();
    }
  };
  refused(tq_kind(kvq::Side::kV, 8), 128, "values with 3 or 4 bits");
  refused(tq_kind(kvq::Side::kK, 2), 128, "keys with 3, 4 or 8 (FP8) bits");
  refused(tq_kind(kvq::Side::kK, 4), 96, "not a power of two");
  refused(tq_kind(kvq::Side::kV, 3), 512, "over 256");
  EXPECT_NO_THROW(kvq::codec::HeadCodec(tq_kind(kvq::Side::kK, 16), 96));
}
