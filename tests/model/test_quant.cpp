// Quantized-weight readers (lib/model/src/parts/quant): every FP8 E4M3 / E2M1 / E8M0 code against a
// value computed here from its bit fields with std::ldexp (plus the formats' known constants), and
// each stored form (FP8 blocks with partial edge blocks, FP8 per tensor / per channel, INT4
// pack-quantized, MXFP4) written by the test's own safetensors writer (model_test_util.hpp) from
// codes chosen here and decoded against a brute-force loop in double. Decoded values must match
// exactly: each is one code times one scale, exact in double and rounded once to fp32, which is
// what the library's fp32 product gives. Negative controls show each reference would catch the
// mistake it names; the one-line errors are asserted by substring.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <memory>
#include <nlohmann/json.hpp>
#include <random>
#include <set>
#include <tuple>
#include <limits>
#include <algorithm>

#include "../../lib/model/src/parts/quant.hpp"
#include "model_test_util.hpp"

namespace {

using namespace kvq::detail;
using kvq::test::expect_error;
using kvq::test::StEntry;
using kvq::test::StMap;
using kvq::test::TempDir;
using json = nlohmann::json;

// ---- independent references ---------------------------------------------------------------------

// E4M3 (e4m3fn) from its fields: S.EEEE.MMM, bias 7; E = 0 subnormal m/8 · 2^-6; S.1111.111 NaN.
double ref_e4m3(uint8_t b) {
  const int s = b >> 7, e = (b >> 3) & 0xF, m = b & 7;
  if (e == 15 && m == 7) return std::nan("");
  const double mag = e == 0 ? std::ldexp(m / 8.0, -6) : std::ldexp(1.0 + m / 8.0, e - 7);
  return s ? -mag : mag;
}

// E2M1 from its fields: S.EE.M, bias 1; E = 0 subnormal m/2.
double ref_e2m1(uint8_t n) {
  const int s = (n >> 3) & 1, e = (n >> 1) & 3, m = n & 1;
  const double mag = e == 0 ? m * 0.5 : std::ldexp(1.0 + m / 2.0, e - 1);
  return s ? -mag : mag;
}

double ref_e8m0(uint8_t s) { return std::ldexp(1.0, int(s) - 127); }

// ---- a checkpoint written by the test -----------------------------------------------------------

template <class T>
std::string le_bytes(const std::vector<T>& v) {
  return std::string(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(T));
}

StEntry entry(const std::string& dtype, std::vector<int64_t> shape, std::string bytes) {
  StEntry e;
  e.dtype = dtype;
  e.shape = std::move(shape);
  e.bytes = std::move(bytes);
  return e;
}

StEntry f32(std::vector<int64_t> shape, const std::vector<float>& v) { return entry("F32", std::move(shape), le_bytes(v)); }
StEntry u8(std::vector<int64_t> shape, const std::vector<uint8_t>& v) { return entry("U8", std::move(shape), le_bytes(v)); }
StEntry i32(std::vector<int64_t> shape, const std::vector<int32_t>& v) { return entry("I32", std::move(shape), le_bytes(v)); }
StEntry f8(std::vector<int64_t> shape, const std::vector<uint8_t>& v) { return entry("F8_E4M3", std::move(shape), le_bytes(v)); }
// BF16 by truncation: the tests only store values whose low 16 bits are zero (checked).
StEntry bf16(std::vector<int64_t> shape, const std::vector<float>& v) {
  std::vector<uint16_t> h;
  for (float x : v) {
    uint32_t bits;
    std::memcpy(&bits, &x, 4);
    EXPECT_EQ(bits & 0xFFFF, 0u) << x << " is not a BF16 value";
    h.push_back(uint16_t(bits >> 16));
  }
  return entry("BF16", std::move(shape), le_bytes(h));
}

// Tensors split over two shards (names in `second` go to the second, as an index may place a scale
// apart from its weight); lookup() is what the loader's weight_map gives.
class Ckpt {
 public:
  StMap t;
  std::set<std::string> second;

  TensorLookup lookup() {
    StMap a, b;
    for (const auto& [n, e] : t) (second.count(n) ? b : a)[n] = e;
    files_.clear();
    owner_.clear();
    int k = 0;
    for (const StMap* m : {&a, &b}) {
      const std::string path = dir_ / ("model-0000" + std::to_string(++k) + "-of-00002.safetensors");
      kvq::test::write_bytes(path, kvq::test::st_serialize(*m));
      files_.push_back(std::make_unique<SafetensorsFile>(path));
      for (const auto& kv : *m) owner_[kv.first] = files_.back().get();
    }
    return {[this](const std::string& n) -> const SafetensorsFile* {
              auto it = owner_.find(n);
              return it == owner_.end() ? nullptr : it->second;
            },
            dir_.str()};
  }

 private:
  TempDir dir_;
  std::vector<std::unique_ptr<SafetensorsFile>> files_;
  std::map<std::string, const SafetensorsFile*> owner_;
};

QuantConfig qc_of(const json& j) { return parse_quant_config(j, "ckpt/config.json"); }
const json kDeepSeek = {{"activation_scheme", "dynamic"}, {"fmt", "e4m3"}, {"quant_method", "fp8"},
                        {"weight_block_size", {128, 128}}};

std::vector<float> decode_all(const QuantWeight& w) {
  std::vector<float> out(size_t(w.rows() * w.cols()));
  decode_rows(w, 0, w.rows(), out.data());
  return out;
}

// Random FP8 codes without the NaN codes, and scales spread over several binades.
std::vector<uint8_t> fp8_codes(size_t n, std::mt19937& rng) {
  std::uniform_int_distribution<int> d(0, 255);
  std::vector<uint8_t> v(n);
  for (auto& c : v) do c = uint8_t(d(rng)); while ((c & 0x7F) == 0x7F);
  return v;
}
std::vector<float> scales(size_t n, std::mt19937& rng) {
  std::uniform_real_distribution<float> u(0.5f, 1.f);
  std::uniform_int_distribution<int> e(-12, 2);
  std::vector<float> v(n);
  for (auto& s : v) s = std::ldexp(u(rng), e(rng));
  return v;
}

int64_t cdiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

// ---- scalar codes --------------------------------------------------------------------------------

TEST(QuantCodes, Fp8E4M3EveryCode) {
  int nans = 0;
  double max_finite = 0;
  for (int c = 0; c < 256; ++c) {
    const float v = fp8_e4m3_to_f32(uint8_t(c));
    const double want = ref_e4m3(uint8_t(c));
    if (std::isnan(want)) {
      ++nans;
      EXPECT_TRUE(c == 0x7F || c == 0xFF) << c;
      EXPECT_TRUE(std::isnan(v)) << c;
      EXPECT_TRUE(fp8_e4m3_is_nan(uint8_t(c)));
      continue;
    }
    EXPECT_FALSE(fp8_e4m3_is_nan(uint8_t(c))) << c;
    EXPECT_EQ(double(v), want) << "code " << c;
    EXPECT_EQ(std::signbit(v), c >= 0x80) << c;  // ±0 keep their sign
    max_finite = std::max(max_finite, std::fabs(want));
  }
  EXPECT_EQ(nans, 2);  // e4m3fn: no infinities, one NaN per sign
  // The format's known constants, written out rather than derived.
  EXPECT_EQ(max_finite, 448.0);
  EXPECT_EQ(fp8_e4m3_to_f32(0x7E), 448.f);
  EXPECT_EQ(fp8_e4m3_to_f32(0xFE), -448.f);
  EXPECT_EQ(fp8_e4m3_to_f32(0x01), 0.001953125f);      // smallest subnormal 2^-9
  EXPECT_EQ(fp8_e4m3_to_f32(0x07), 0.013671875f);      // largest subnormal 7·2^-9
  EXPECT_EQ(fp8_e4m3_to_f32(0x08), 0.015625f);         // smallest normal 2^-6
  EXPECT_EQ(fp8_e4m3_to_f32(0x38), 1.f);
  EXPECT_EQ(fp8_e4m3_to_f32(0xC4), -3.f);
  EXPECT_EQ(fp8_e4m3_to_f32(0x77), 240.f);             // 2^7 · 1.875
}

TEST(QuantCodes, Fp4E2M1EveryCode) {
  const float listed[16] = {0, 0.5f, 1, 1.5f, 2, 3, 4, 6, -0.f, -0.5f, -1, -1.5f, -2, -3, -4, -6};  // OCP MX table
  for (int n = 0; n < 16; ++n) {
    EXPECT_EQ(double(fp4_e2m1_to_f32(uint8_t(n))), ref_e2m1(uint8_t(n))) << n;
    EXPECT_EQ(fp4_e2m1_to_f32(uint8_t(n)), listed[n]) << n;
    EXPECT_EQ(std::signbit(fp4_e2m1_to_f32(uint8_t(n))), n >= 8) << n;
    EXPECT_EQ(fp4_e2m1_to_f32(uint8_t(n | 0xF0)), listed[n]) << "high bits ignored";
  }
}

TEST(QuantCodes, E8M0) {
  EXPECT_EQ(double(e8m0_to_f32(0)), std::ldexp(1.0, -127));  // an fp32 subnormal, still exact
  EXPECT_GT(e8m0_to_f32(0), 0.f);
  EXPECT_EQ(e8m0_to_f32(127), 1.f);
  EXPECT_EQ(double(e8m0_to_f32(254)), std::ldexp(1.0, 127));
  EXPECT_TRUE(std::isnan(e8m0_to_f32(255)));
  EXPECT_TRUE(e8m0_is_nan(255));
  for (int s = 0; s < 255; ++s) {
    EXPECT_EQ(double(e8m0_to_f32(uint8_t(s))), ref_e8m0(uint8_t(s))) << s;
    EXPECT_FALSE(e8m0_is_nan(uint8_t(s)));
  }
}

TEST(QuantCodes, Int4NibbleOrder) {
  // q = 0..7 stored as q + 8 = 8..15, element j in nibble j: the int32 0xFEDCBA98, little-endian.
  const uint8_t word[4] = {0x98, 0xBA, 0xDC, 0xFE};
  for (int j = 0; j < 8; ++j) EXPECT_EQ(int4_packed_at(word, j), j) << j;
  // Two words: elements 8..15 come from the second; 0x0 is -8, 0xF is 7.
  const uint8_t two[8] = {0x00, 0x00, 0x00, 0x00, 0x0F, 0x00, 0x00, 0xF0};
  EXPECT_EQ(int4_packed_at(two, 0), -8);
  EXPECT_EQ(int4_packed_at(two, 8), 7);
  EXPECT_EQ(int4_packed_at(two, 9), -8);
  EXPECT_EQ(int4_packed_at(two, 15), 7);
}

// ---- config ----------------------------------------------------------------------------------------

TEST(QuantConfigParse, AsShipped) {
  QuantConfig c = qc_of(nullptr);
  EXPECT_EQ(c.method, QuantConfig::Method::kNone);
  c = qc_of(kDeepSeek);  // DeepSeek-V3 config.json
  EXPECT_EQ(c.method, QuantConfig::Method::kFp8);
  EXPECT_EQ(c.block_out, 128);
  EXPECT_EQ(c.block_in, 128);
  c = qc_of({{"quant_method", "fp8"}, {"weight_block_size", {64, 32}}});
  EXPECT_EQ(c.block_out, 64);
  EXPECT_EQ(c.block_in, 32);
  c = qc_of({{"quant_method", "fp8"}});
  EXPECT_EQ(c.block_out, 128) << "default block when the config names none";
  // Kimi-K2-Thinking's routed experts.
  c = qc_of({{"quant_method", "compressed-tensors"},
             {"format", "pack-quantized"},
             {"config_groups",
              {{"group_0",
                {{"targets", {"Linear"}},
                 {"weights",
                  {{"num_bits", 4}, {"group_size", 32}, {"symmetric", true}, {"strategy", "group"}, {"type", "int"}}}}}}},
             {"ignore", {"lm_head"}}});
  EXPECT_EQ(c.method, QuantConfig::Method::kCompressedTensors);
  EXPECT_TRUE(c.has_int4);
  EXPECT_FALSE(c.has_fp8);
  EXPECT_EQ(c.int4_group, 32);
  // An FP8-BLOCK compressed-tensors repo (llm-compressor's FP8_BLOCK scheme).
  c = qc_of({{"quant_method", "compressed-tensors"},
             {"format", "float-quantized"},
             {"config_groups",
              {{"group_0",
                {{"weights", {{"num_bits", 8}, {"type", "float"}, {"strategy", "block"}, {"block_structure", {128, 128}}}},
                 {"input_activations", {{"num_bits", 8}, {"type", "float"}, {"dynamic", true}}}}}}}});
  EXPECT_TRUE(c.has_fp8);
  EXPECT_EQ(c.block_out, 128);
  // What kvq-export writes for a model that had none: KV-cache scheme only, no weight groups.
  c = qc_of({{"quant_method", "compressed-tensors"},
             {"kv_cache_scheme", {{"num_bits", 8}, {"type", "float"}, {"strategy", "tensor"}}}});
  EXPECT_FALSE(c.has_fp8 || c.has_int4);
  c = qc_of({{"quant_method", "mxfp4"}, {"modules_to_not_convert", {"model.layers.*.self_attn"}}});  // gpt-oss
  EXPECT_EQ(c.method, QuantConfig::Method::kMxfp4);
  c = qc_of({{"quant_method", "modelopt"}, {"quantization", {{"quant_algo", "FP8"}, {"kv_cache_quant_algo", "FP8"}}}});
  EXPECT_TRUE(c.has_fp8);
  c = qc_of({{"quant_method", "modelopt"}, {"quant_algo", "FP8"}});
  EXPECT_TRUE(c.has_fp8);
}

TEST(QuantConfigParse, Refused) {
  auto bad = [](const json& j, std::vector<std::string> parts) {
    parts.push_back("ckpt/config.json");
    expect_error([&] { qc_of(j); }, parts);
  };
  bad({{"quant_method", "awq"}}, {"quantization_config.quant_method", "'awq'", "not supported"});
  bad({{"bits", 4}}, {"quantization_config.quant_method", "missing"});
  bad(json::array(), {"quantization_config", "not an object"});
  bad({{"quant_method", "fp8"}, {"weight_block_size", {128}}}, {"weight_block_size", "[128]"});
  bad({{"quant_method", "fp8"}, {"fmt", "e5m2"}}, {"quantization_config.fmt", "e5m2"});
  bad({{"quant_method", "modelopt"}, {"quant_algo", "NVFP4"}}, {"quantization_config.quant_algo", "NVFP4"});
  const auto ct = [](json weights, std::string format = "pack-quantized") {
    return json{{"quant_method", "compressed-tensors"}, {"format", format},
                {"config_groups", {{"group_0", {{"weights", std::move(weights)}}}}}};
  };
  bad(ct({{"num_bits", 4}, {"type", "int"}, {"symmetric", false}, {"strategy", "group"}, {"group_size", 32}}),
      {"config_groups.group_0.weights.symmetric", "false", "symmetric only"});
  bad(ct({{"num_bits", 8}, {"type", "int"}, {"strategy", "channel"}}), {"weights.num_bits", "8"});
  bad(ct({{"num_bits", 4}, {"type", "float"}}, "nvfp4-pack-quantized"), {"weights.num_bits", "4"});
  bad(ct({{"num_bits", 4}, {"type", "int"}, {"strategy", "group"}}, "marlin-24"), {"quantization_config.format", "marlin-24"});
  bad(ct({{"num_bits", 4}, {"type", "int"}, {"strategy", "tensor"}}), {"weights.strategy", "tensor"});
  bad(ct({{"num_bits", 8}, {"type", "float"}, {"strategy", "block"}}, "float-quantized"), {"block_structure", "missing"});
}

// ---- FP8 blocks (DeepSeek) -------------------------------------------------------------------------

struct Fp8Case {
  int64_t out, in, bo, bi;
};

class Fp8Blocks : public ::testing::TestWithParam<Fp8Case> {};

TEST_P(Fp8Blocks, MatchesBruteForce) {
  const auto [out, in, bo, bi] = GetParam();
  std::mt19937 rng(uint32_t(out * 1000 + in));
  const int64_t sr = cdiv(out, bo), sc = cdiv(in, bi);
  const std::vector<uint8_t> q = fp8_codes(size_t(out * in), rng);
  const std::vector<float> s = scales(size_t(sr * sc), rng);
  Ckpt ck;
  const std::string X = "model.layers.0.mlp.experts.3.down_proj.weight";
  ck.t[X] = f8({out, in}, q);
  ck.t[X + "_scale_inv"] = f32({sr, sc}, s);
  ck.second = {X + "_scale_inv"};  // the scale in another shard than its weight
  const QuantWeight w = describe_weight(ck.lookup(), qc_of({{"quant_method", "fp8"}, {"weight_block_size", {bo, bi}}}), X);
  EXPECT_EQ(w.format, WeightFormat::kFp8Block);
  EXPECT_EQ(w.shape, (std::vector<int64_t>{out, in}));
  EXPECT_NO_THROW(check_weight_shape(w, {out, in}));

  // Brute force: block by block, every element of the block (partial at the bottom and right).
  std::vector<double> ref(size_t(out * in), std::nan(""));
  for (int64_t b0 = 0; b0 < sr; ++b0)
    for (int64_t b1 = 0; b1 < sc; ++b1)
      for (int64_t i = b0 * bo; i < std::min(out, (b0 + 1) * bo); ++i)
        for (int64_t j = b1 * bi; j < std::min(in, (b1 + 1) * bi); ++j)
          ref[size_t(i * in + j)] = ref_e4m3(q[size_t(i * in + j)]) * double(s[size_t(b0 * sc + b1)]);

  // Decoded in uneven row chunks, as a parallel loader would split it.
  std::vector<float> got(size_t(out * in));
  const int64_t cuts[] = {0, std::min<int64_t>(out, 1), std::min<int64_t>(out, out / 3 + 1), out};
  for (int k = 0; k < 3; ++k) decode_rows(w, cuts[k], cuts[k + 1], got.data() + cuts[k] * in);
  int64_t bad = 0;
  for (size_t e = 0; e < ref.size(); ++e) bad += got[e] != float(ref[e]);
  EXPECT_EQ(bad, 0) << "of " << ref.size();

  if (sr > 1 && sc > 1) {
    // Negative controls: a reference reading the scale grid transposed (where it is square), or
    // one scale for the whole tensor, must disagree with the decode.
    int64_t diff_t = 0, diff_one = 0;
    for (int64_t i = 0; i < out; ++i)
      for (int64_t j = 0; j < in; ++j) {
        const double code = ref_e4m3(q[size_t(i * in + j)]);
        if (sr == sc) diff_t += got[size_t(i * in + j)] != float(code * s[size_t((j / bi) * sc + i / bo)]);
        diff_one += got[size_t(i * in + j)] != float(code * s[0]);
      }
    if (sr == sc) {
      EXPECT_GT(diff_t, 0);
    }
    EXPECT_GT(diff_one, 0);
  }
}

INSTANTIATE_TEST_SUITE_P(Shapes, Fp8Blocks,
                         ::testing::Values(Fp8Case{300, 200, 128, 128},  // partial blocks at both edges
                                           Fp8Case{256, 256, 128, 128},  // a square scale grid
                                           Fp8Case{128, 128, 128, 128},  // one block
                                           Fp8Case{7, 11, 3, 5},         // odd blocks
                                           Fp8Case{9, 96, 1, 32},        // row-wise groups
                                           Fp8Case{5, 3, 128, 128}),     // smaller than one block
                         [](const ::testing::TestParamInfo<Fp8Case>& i) {
                           const Fp8Case& c = i.param;
                           return std::to_string(c.out) + "x" + std::to_string(c.in) + "_blocks" +
                                  std::to_string(c.bo) + "x" + std::to_string(c.bi);
                         });

TEST(Fp8BlocksRefused, TransposedOrPerTensorScale) {
  Ckpt ck;
  const std::string X = "model.layers.1.self_attn.kv_b_proj.weight";
  std::mt19937 rng(3);
  ck.t[X] = f8({300, 200}, fp8_codes(300 * 200, rng));
  ck.t[X + "_scale_inv"] = f32({2, 3}, scales(6, rng));  // transposed: [ceil(in/128), ceil(out/128)]
  expect_error([&] { describe_weight(ck.lookup(), qc_of(kDeepSeek), X); },
               {"model-00001-of-00002.safetensors", X + "_scale_inv", "shape [2,3]", "[3,2] per 128x128 block", "[300,200]"});
  ck.t[X + "_scale_inv"] = f32({1}, {0.5f});  // a per-tensor scale where blocks are expected
  expect_error([&] { describe_weight(ck.lookup(), qc_of(kDeepSeek), X); }, {X + "_scale_inv", "shape [1]", "[3,2]"});
  ck.t[X + "_scale_inv"] = f32({3, 2}, scales(6, rng));
  const QuantWeight w = describe_weight(ck.lookup(), qc_of(kDeepSeek), X);
  expect_error([&] { check_weight_shape(w, {200, 300}); }, {X, "shape [300,200]", "FP8 blocks", "[200,300]"});
}

// ---- FP8 per tensor / per channel / blocks via weight_scale ----------------------------------------

TEST(Fp8Scale, PerTensorPerChannelAndBlock) {
  std::mt19937 rng(11);
  const int64_t out = 6, in = 10;
  const std::vector<uint8_t> q = fp8_codes(out * in, rng);
  const std::string X = "model.layers.0.self_attn.o_proj.weight";
  const json ct_fp8 = {{"quant_method", "compressed-tensors"}, {"format", "float-quantized"},
                       {"config_groups", {{"group_0", {{"weights", {{"num_bits", 8}, {"type", "float"}, {"strategy", "channel"}}}}}}}};
  const json modelopt = {{"quant_method", "modelopt"}, {"quantization", {{"quant_algo", "FP8"}}}};
  auto check = [&](const StEntry& scale, const json& qc, WeightFormat want, auto scale_of) {
    Ckpt ck;
    ck.t[X] = f8({out, in}, q);
    ck.t[X + "_scale"] = scale;
    ck.t["model.layers.0.self_attn.o_proj.input_scale"] = f32({}, {1e9f});  // activations: never read
    const QuantWeight w = describe_weight(ck.lookup(), qc_of(qc), X);
    EXPECT_EQ(w.format, want) << format_name(w.format);
    const std::vector<float> got = decode_all(w);
    for (int64_t i = 0; i < out; ++i)
      for (int64_t j = 0; j < in; ++j)
        EXPECT_EQ(got[size_t(i * in + j)], float(ref_e4m3(q[size_t(i * in + j)]) * scale_of(i, j))) << i << "," << j;
  };
  check(f32({}, {0.375f}), modelopt, WeightFormat::kFp8Tensor, [](int64_t, int64_t) { return 0.375; });
  check(f32({1}, {3.0f}), ct_fp8, WeightFormat::kFp8Tensor, [](int64_t, int64_t) { return 3.0; });
  const std::vector<float> ch = {0.5f, 0.25f, 2.f, 1.5f, 0.125f, 4.f};  // BF16-exact
  check(bf16({out, 1}, ch), ct_fp8, WeightFormat::kFp8Channel, [&](int64_t i, int64_t) { return double(ch[size_t(i)]); });
  const std::vector<float> blk = {0.5f, 0.25f, 2.f, 1.5f, 0.125f, 4.f};  // [2,3] blocks of 4x4
  check(f32({2, 3}, blk), {{"quant_method", "fp8"}, {"weight_block_size", {4, 4}}}, WeightFormat::kFp8Block,
        [&](int64_t i, int64_t j) { return double(blk[size_t((i / 4) * 3 + j / 4)]); });

  // Negative control: the per-channel scales applied per input column instead must disagree.
  Ckpt ck;
  ck.t[X] = f8({out, in}, q);
  ck.t[X + "_scale"] = bf16({out, 1}, ch);
  const std::vector<float> got = decode_all(describe_weight(ck.lookup(), qc_of(ct_fp8), X));
  int diff = 0;
  for (int64_t i = 0; i < out; ++i)
    for (int64_t j = 0; j < in; ++j)
      diff += got[size_t(i * in + j)] != float(ref_e4m3(q[size_t(i * in + j)]) * ch[size_t(j % out)]);
  EXPECT_GT(diff, 0);
  // A scale shape that is none of the forms.
  ck.t[X + "_scale"] = f32({1, in}, std::vector<float>(size_t(in), 1.f));
  expect_error([&] { describe_weight(ck.lookup(), qc_of(ct_fp8), X); },
               {X + "_scale", "shape [1,10]", "[] or [1] per tensor, [6,1] per channel"});
}

// ---- INT4 pack-quantized ---------------------------------------------------------------------------

json kimi_int4(int64_t group) {
  return {{"quant_method", "compressed-tensors"},
          {"format", "pack-quantized"},
          {"config_groups",
           {{"group_0", {{"weights", {{"num_bits", 4}, {"group_size", group}, {"symmetric", true}, {"strategy", "group"}, {"type", "int"}}}}}}}};
}

TEST(Int4Packed, HandPackedMatches) {
  for (const auto& [out, in, group] : std::vector<std::tuple<int64_t, int64_t, int64_t>>{{5, 70, 32}, {3, 64, 32}, {4, 24, 7}}) {
    std::mt19937 rng(static_cast<uint32_t>(in));
    std::uniform_int_distribution<int> d(-8, 7);
    std::vector<int> q(size_t(out * in));
    for (auto& v : q) v = d(rng);
    q[0] = -8;
    q[1] = 7;
    // Pack by hand: element j in nibble j%8 of word j/8, stored as q + 8; padding nibbles 0.
    const int64_t pc = cdiv(in, 8), ng = cdiv(in, group);
    std::vector<int32_t> packed(size_t(out * pc), 0);
    for (int64_t o = 0; o < out; ++o)
      for (int64_t j = 0; j < in; ++j) {
        uint32_t& word = reinterpret_cast<uint32_t&>(packed[size_t(o * pc + j / 8)]);
        word |= uint32_t(q[size_t(o * in + j)] + 8) << (4 * (j % 8));
      }
    std::vector<float> s(size_t(out * ng));
    for (size_t k = 0; k < s.size(); ++k) s[k] = std::ldexp(1.f + float(k % 4) / 4.f, -int(k % 5) - 3);  // BF16-exact
    Ckpt ck;
    const std::string X = "model.layers.2.mlp.experts.7.gate_proj.weight";
    ck.t[X + "_packed"] = i32({out, pc}, packed);
    ck.t[X + "_scale"] = bf16({out, ng}, s);
    ck.t[X + "_shape"] = i32({2}, {int32_t(out), int32_t(in)});
    ck.second = {X + "_scale"};
    TensorLookup lk = ck.lookup();
    EXPECT_TRUE(weight_present(lk, X));
    const QuantWeight w = describe_weight(lk, qc_of(kimi_int4(group)), X);
    EXPECT_EQ(w.format, WeightFormat::kInt4Packed);
    EXPECT_EQ(w.shape, (std::vector<int64_t>{out, in}));
    EXPECT_EQ(w.stored_tensors(), (std::vector<std::string>{X + "_packed", X + "_scale", X + "_shape"}));
    std::vector<float> got(size_t(out * in));
    decode_rows(w, 0, 2, got.data());
    decode_rows(w, 2, out, got.data() + 2 * in);
    for (int64_t o = 0; o < out; ++o)
      for (int64_t j = 0; j < in; ++j)
        ASSERT_EQ(got[size_t(o * in + j)], float(q[size_t(o * in + j)] * double(s[size_t(o * ng + j / group)])))
            << o << "," << j << " in=" << in;
  }
}

TEST(Int4Packed, Refused) {
  const std::string X = "model.layers.2.mlp.experts.0.up_proj.weight";
  auto base = [&](Ckpt& ck) {
    ck.t[X + "_packed"] = i32({4, 9}, std::vector<int32_t>(36, 0x76543210));
    ck.t[X + "_scale"] = bf16({4, 3}, std::vector<float>(12, 1.f));
    ck.t[X + "_shape"] = i32({2}, {4, 70});
  };
  {  // weight_shape disagrees with the packed tensor
    Ckpt ck;
    base(ck);
    ck.t[X + "_shape"] = i32({2}, {4, 90});
    expect_error([&] { describe_weight(ck.lookup(), qc_of(kimi_int4(32)), X); },
                 {".safetensors", X + "_shape", "[4,90]", "[4,9]"});
    ck.t[X + "_shape"] = i32({3}, {4, 70, 1});
    expect_error([&] { describe_weight(ck.lookup(), qc_of(kimi_int4(32)), X); }, {X + "_shape", "I32 [3]"});
    ck.t.erase(X + "_shape");
    expect_error([&] { describe_weight(ck.lookup(), qc_of(kimi_int4(32)), X); }, {X + "_shape", "missing"});
  }
  {  // scale for another group size
    Ckpt ck;
    base(ck);
    expect_error([&] { describe_weight(ck.lookup(), qc_of(kimi_int4(16)), X); },
                 {X + "_scale", "shape [4,3]", "[4,5]", "one scale per 16 inputs"});
    ck.t.erase(X + "_scale");
    expect_error([&] { describe_weight(ck.lookup(), qc_of(kimi_int4(32)), X); }, {X + "_scale", "missing"});
  }
  {  // asymmetric: a zero point
    Ckpt ck;
    base(ck);
    ck.t[X + "_zero_point"] = i32({1, 3}, {0, 0, 0});
    expect_error([&] { describe_weight(ck.lookup(), qc_of(kimi_int4(32)), X); },
                 {X + "_zero_point", "symmetric only"});
  }
  {  // packed INT4 without a config that declares it
    Ckpt ck;
    base(ck);
    expect_error([&] { describe_weight(ck.lookup(), qc_of(kDeepSeek), X); },
                 {X + "_packed", "INT4 pack-quantized", "quant_method 'fp8'"});
  }
}

// ---- MXFP4 (gpt-oss) ---------------------------------------------------------------------------------

TEST(Mxfp4, LowNibbleFirst) {
  const int64_t E = 2, out = 3, in = 64, G = in / 32;
  std::mt19937 rng(5);
  std::uniform_int_distribution<int> byte(0, 255), sc(118, 132);
  std::vector<uint8_t> blocks(size_t(E * out * G * 16)), scl(size_t(E * out * G));
  for (auto& b : blocks) b = uint8_t(byte(rng));
  for (auto& s : scl) s = uint8_t(sc(rng));
  scl[0] = 0;  // 2^-127 times a code: still exact in fp32
  Ckpt ck;
  const std::string P = "model.layers.0.mlp.experts.gate_up_proj";
  ck.t[P + "_blocks"] = u8({E, out, G, 16}, blocks);
  ck.t[P + "_scales"] = u8({E, out, G}, scl);
  ck.t[P + "_bias"] = bf16({E, out}, std::vector<float>(size_t(E * out), 0.f));
  TensorLookup lk = ck.lookup();
  const QuantConfig qc = qc_of({{"quant_method", "mxfp4"}});
  const QuantWeight w = describe_weight(lk, qc, P);
  EXPECT_EQ(w.format, WeightFormat::kMxfp4);
  EXPECT_EQ(w.shape, (std::vector<int64_t>{E, out, in}));
  EXPECT_EQ(w.rows(), E * out);
  auto ref = [&](int64_t e, int64_t r, int64_t c, bool low_first) {
    const uint8_t b = blocks[size_t(((e * out + r) * G + c / 32) * 16 + (c % 32) / 2)];
    const bool low = (c % 2 == 0) == low_first;
    return ref_e2m1(low ? (b & 0xF) : (b >> 4)) * ref_e8m0(scl[size_t((e * out + r) * G + c / 32)]);
  };
  int64_t diff_high_first = 0;
  for (int64_t e = 0; e < E; ++e) {  // one expert at a time
    std::vector<float> got(size_t(out * in));
    decode_rows(w, e * out, (e + 1) * out, got.data());
    for (int64_t r = 0; r < out; ++r)
      for (int64_t c = 0; c < in; ++c) {
        EXPECT_EQ(got[size_t(r * in + c)], float(ref(e, r, c, true))) << e << "," << r << "," << c;
        diff_high_first += got[size_t(r * in + c)] != float(ref(e, r, c, false));
      }
  }
  EXPECT_GT(diff_high_first, 0) << "a high-nibble-first reference must disagree";

  // Without the expert dim: [out, in/32, 16].
  Ckpt c2;
  c2.t["w_blocks"] = u8({out, G, 16}, std::vector<uint8_t>(blocks.begin(), blocks.begin() + out * G * 16));
  c2.t["w_scales"] = u8({out, G}, std::vector<uint8_t>(scl.begin(), scl.begin() + out * G));
  const QuantWeight w2 = describe_weight(c2.lookup(), qc, "w");
  EXPECT_EQ(w2.shape, (std::vector<int64_t>{out, in}));
  const std::vector<float> got2 = decode_all(w2);
  for (int64_t r = 0; r < out; ++r)
    for (int64_t c = 0; c < in; ++c) EXPECT_EQ(got2[size_t(r * in + c)], float(ref(0, r, c, true)));
}

TEST(Mxfp4, Refused) {
  const std::string P = "model.layers.3.mlp.experts.down_proj";
  Ckpt ck;
  ck.t[P + "_blocks"] = u8({2, 4, 1, 16}, std::vector<uint8_t>(128, 0x21));
  std::vector<uint8_t> s(8, 127);
  s[5] = 255;
  ck.t[P + "_scales"] = u8({2, 4, 1}, s);
  const QuantConfig qc = qc_of({{"quant_method", "mxfp4"}});
  const QuantWeight w = describe_weight(ck.lookup(), qc, P);
  std::vector<float> got(size_t(8 * 32));
  decode_rows(w, 0, 4, got.data());  // expert 0 is fine
  EXPECT_EQ(got[0], 0.5f);           // 0x21: low nibble 1 -> 0.5 first, then 2 -> 1.0
  EXPECT_EQ(got[1], 1.0f);
  expect_error([&] { decode_rows(w, 4, 8, got.data()); }, {".safetensors", P + "_scales", "NaN scale 255", "[1,1,0]"});
  ck.t[P + "_scales"] = u8({2, 4}, std::vector<uint8_t>(8, 127));
  expect_error([&] { describe_weight(ck.lookup(), qc, P); }, {P + "_scales", "U8 [2,4]", "[2,4,1]"});
  ck.t.erase(P + "_scales");
  expect_error([&] { describe_weight(ck.lookup(), qc, P); }, {P + "_scales", "missing"});
  ck.t[P + "_scales"] = u8({2, 4, 1}, std::vector<uint8_t>(8, 127));
  expect_error([&] { describe_weight(ck.lookup(), qc_of(kDeepSeek), P); }, {P + "_blocks", "MXFP4", "needs mxfp4"});
  // An overflowing product (6 · 2^127) is refused, not turned into inf.
  ck.t[P + "_blocks"] = u8({2, 4, 1, 16}, std::vector<uint8_t>(128, 0x77));
  ck.t[P + "_scales"] = u8({2, 4, 1}, std::vector<uint8_t>(8, 254));
  const QuantWeight big = describe_weight(ck.lookup(), qc, P);
  expect_error([&] { decode_rows(big, 0, 1, got.data()); }, {P + "_blocks", "[0,0,0]", "overflows fp32"});
}

// ---- the one-line errors of the FP8 path and the plain path ------------------------------------------

TEST(QuantErrors, OneLineEach) {
  const std::string X = "model.layers.0.self_attn.q_a_proj.weight";
  std::mt19937 rng(9);
  std::vector<uint8_t> q = fp8_codes(4 * 6, rng);
  Ckpt ck;
  ck.t[X] = f8({4, 6}, q);
  // No scale tensor at all.
  expect_error([&] { describe_weight(ck.lookup(), qc_of(kDeepSeek), X); },
               {"model-00001-of-00002.safetensors", X + "_scale_inv", "missing", X + "_scale)"});
  // FP8 data, but the config declares no quantization.
  ck.t[X + "_scale_inv"] = f32({1, 1}, {1.f});
  expect_error([&] { describe_weight(ck.lookup(), qc_of(nullptr), X); },
               {X, "F8_E4M3", "ckpt/config.json has no quantization_config"});
  // A scale of a non-float dtype.
  ck.t[X + "_scale_inv"] = u8({1, 1}, {1});
  expect_error([&] { describe_weight(ck.lookup(), qc_of(kDeepSeek), X); }, {X + "_scale_inv", "dtype U8", "not a scale dtype"});
  // NaN codes, found while decoding: each names the tensor and the element.
  for (uint8_t nan : {uint8_t(0x7F), uint8_t(0xFF)}) {
    q[1 * 6 + 2] = nan;
    ck.t[X] = f8({4, 6}, q);
    ck.t[X + "_scale_inv"] = f32({1, 1}, {1.f});
    const QuantWeight w = describe_weight(ck.lookup(), qc_of(kDeepSeek), X);
    std::vector<float> got(24);
    EXPECT_NO_THROW(decode_rows(w, 0, 1, got.data()));  // row 0 holds no NaN
    expect_error([&] { decode_rows(w, 0, 4, got.data()); },
                 {"model-00001-of-00002.safetensors", X, "NaN code", nan == 0x7F ? "0x7F" : "0xFF", "[1,2]"});
  }
  // A non-finite scale, and a product past fp32's range (only 448 · 1e36 is: the rest are 1.0).
  q.assign(24, 0x38);
  q[1 * 6 + 2] = 0x7E;  // 448
  ck.t[X] = f8({4, 6}, q);
  ck.t[X + "_scale_inv"] = f32({1, 1}, {std::numeric_limits<float>::infinity()});
  std::vector<float> got(24);
  expect_error([&] { decode_rows(describe_weight(ck.lookup(), qc_of(kDeepSeek), X), 0, 4, got.data()); },
               {X + "_scale_inv", "element [0,0]", "inf", "not a finite scale"});
  ck.t[X + "_scale_inv"] = f32({1, 1}, {1e36f});
  expect_error([&] { decode_rows(describe_weight(ck.lookup(), qc_of(kDeepSeek), X), 0, 4, got.data()); },
               {X, "[1,2]", "448", "overflows fp32"});
  // A tensor no file holds.
  expect_error([&] { describe_weight(ck.lookup(), qc_of(kDeepSeek), "model.layers.0.self_attn.q_b_proj.weight"); },
               {"q_b_proj.weight", "missing"});
  // An index that names a shard lacking the tensor.
  const TensorLookup lk = ck.lookup();
  const SafetensorsFile* first = lk.find(X);
  const TensorLookup liar{[&](const std::string&) { return first; }, "idx"};
  expect_error([&] { describe_weight(liar, qc_of(kDeepSeek), "model.layers.9.mlp.down_proj.weight"); },
               {"model-00001-of-00002.safetensors", "model.layers.9.mlp.down_proj.weight", "index names this file"});
  // An integer dtype where a weight should be.
  ck.t["lm_head.weight"] = i32({2, 2}, {1, 2, 3, 4});
  expect_error([&] { describe_weight(ck.lookup(), qc_of(kDeepSeek), "lm_head.weight"); },
               {"lm_head.weight", "dtype I32", "not a weight dtype"});
}

TEST(QuantPlain, FloatWeightsAsTheyAre) {
  Ckpt ck;
  const std::vector<float> v = {1.5f, -2.f, 0.25f, 3.f, 0.5f, -0.125f};
  ck.t["model.embed_tokens.weight"] = bf16({2, 3}, v);  // DeepSeek leaves these unquantized
  ck.t["model.norm.weight"] = f32({3}, {1.f, 2.f, 3.f});
  TensorLookup lk = ck.lookup();
  const QuantWeight w = describe_weight(lk, qc_of(kDeepSeek), "model.embed_tokens.weight");
  EXPECT_EQ(w.format, WeightFormat::kPlain);
  EXPECT_EQ(decode_all(w), v);
  const QuantWeight n = describe_weight(lk, qc_of(kDeepSeek), "model.norm.weight");
  EXPECT_EQ(n.rows(), 1);
  EXPECT_EQ(decode_all(n), (std::vector<float>{1.f, 2.f, 3.f}));
  // A scale beside a float weight is refused, not ignored.
  ck.t["model.embed_tokens.weight_scale_inv"] = f32({1, 1}, {2.f});
  expect_error([&] { describe_weight(ck.lookup(), qc_of(kDeepSeek), "model.embed_tokens.weight"); },
               {"model.embed_tokens.weight_scale_inv", "BF16", "not F8_E4M3"});
}

// ---- the safetensors reader with the new dtypes --------------------------------------------------------

TEST(QuantSafetensors, NewDtypesHeaderAndFloatLoads) {
  TempDir dir;
  StMap m;
  m["a"] = f8({3}, {0x38, 0x40, 0x7E});
  m["b"] = u8({2, 2}, {1, 2, 3, 4});
  m["c"] = i32({2}, {-1, 7});
  m["d"] = entry("F8_E5M2", {2}, "\x3c\x40");
  m["e"] = entry("I8", {2}, "\x80\x7f");
  const std::string path = dir / "x.safetensors";
  kvq::test::write_bytes(path, kvq::test::st_serialize(m));
  const SafetensorsFile f(path);
  EXPECT_EQ(f.stored_bytes("a"), 3u);
  EXPECT_EQ(f.raw_bytes("a")[2], 0x7E);
  EXPECT_EQ(f.raw_bytes("b")[3], 4);
  int32_t c1;
  std::memcpy(&c1, f.raw_bytes("c") + 4, 4);
  EXPECT_EQ(c1, 7);
  EXPECT_EQ(f.raw_bytes("e")[0], 0x80);
  // Ordinary float loads still refuse them, with the message they always had.
  expect_error([&] { f.check("a", {3}); }, {"x.safetensors", "tensor 'a'", "dtype F8_E4M3 is not supported (F32, F16, BF16)"});
  expect_error([&] { f.check("b", {2, 2}); }, {"tensor 'b'", "dtype U8 is not supported"});
  // A span that does not match the new dtype's size is refused on open.
  m["a"] = f8({4}, {0x38, 0x40, 0x7E});
  kvq::test::write_bytes(path, kvq::test::st_serialize(m));
  expect_error([&] { SafetensorsFile g(path); }, {"x.safetensors", "tensor 'a'", "F8_E4M3 [4] needs 4"});
}

}  // namespace
