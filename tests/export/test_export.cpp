// kvq-export: the safetensors writer read back through kvq's own reader, the vLLM scales against
// hand-computed values, the ModelOpt config, the JSON outputs against schemas/ with a real
// validator (python3-jsonschema), and the CLI's refusals (exit 2, one line, nothing written).
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <set>

#include "kvq/export/modelopt.hpp"
#include "kvq/export/safetensors_writer.hpp"
#include "kvq/export/vllm.hpp"
#include "kvq/util/atomic_file.hpp"
#include "kvq/util/error.hpp"
#include "run_cmd.hpp"
#include "safetensors.hpp"

using namespace kvq;
using namespace kvq::exporter;
using json = nlohmann::json;
namespace fs = std::filesystem;

namespace {

uint32_t bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
float from_bits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

std::string fresh_dir(const std::string& name) {
  const std::string d = test::temp_path(name);
  fs::remove_all(d);
  return d;
}

template <class F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

// L = 2 layers, 2 KV heads, 4 query heads, d = 4. Maxima chosen so amax / 448 is exact in fp32 except
// k_amax[2] = 1 (1/448, rounded: see ScaleFormula).
CalibFile calib_with_amax() {
  CalibFile c;
  MomentShape sh{2, 2, 4, 4};
  c.prov.tool_version = "test";
  c.prov.model_path = "m";
  c.prov.model_config_sha256 = std::string(64, 'a');
  c.prov.architecture = "llama";
  c.prov.pairing = RopePairing::kSplitHalf;
  c.prov.rotary_dim = 4;
  c.prov.rope_theta = 10000;
  c.prov.rope_inv_freq = rope_default_inv_freq(c.prov.rope_theta, c.prov.rotary_dim);
  c.prov.head_dim = 4;
  c.prov.n_layers = 2;
  c.prov.n_heads = 4;
  c.prov.n_kv_heads = 2;
  c.prov.gqa_map = {0, 0, 1, 1};
  c.prov.corpus = {{"c.txt", std::string(64, 'b'), 10, 0}};
  c.prov.seq_len = 3;
  c.prov.samples = 2;
  c.prov.holdout = 1;
  c.prov.batch_size = 1;
  c.prov.reservoir_tokens = 2;
  c.moments = Moments(sh);
  for (auto* s : {&c.moments.k, &c.moments.v, &c.moments.q}) {
    for (size_t i = 0; i < s->count.size(); ++i) s->count[i] = int64_t(3 + i);
    for (size_t i = 0; i < s->sum.size(); ++i) s->sum[i] = 0.25 * double(i) - 1;
    for (size_t i = 0; i < s->gram.size(); ++i) s->gram[i] = std::sqrt(double(i) + 1);
  }
  c.moments.k_amax = {448.f, 224.f, 1.f, 7.f};          // [layer][kv head]
  c.moments.v_amax = {896.f, 3.5f, 56.f, 0.5f};
  c.moments.q_amax = {44.8f, 448.f, 112.f, 14.f, 28.f, 56.f, 3.5f, 1792.f};  // [layer][query head]
  c.calib_offsets = {0, 2};
  c.holdout_offsets = {4};
  c.windows_done = 2;
  c.reservoir.capacity = 2;
  c.reservoir.seen = 6;
  c.reservoir.rng_state = {1, 2, 3, 4};
  c.reservoir.source = {0, 1, 1, 2};
  c.reservoir.q.assign(2 * 2 * 4 * 4, 0.5f);
  c.reservoir.k.assign(2 * 2 * 2 * 4, 0.25f);
  c.reservoir.v.assign(2 * 2 * 2 * 4, -0.25f);
  c.holdout.windows = 1;
  c.holdout.ids = {1, 5, 6};
  c.holdout.positions = {0, 1, 2};
  c.holdout.q.assign(2 * 1 * 3 * 4 * 4, 1.f);
  c.holdout.k.assign(2 * 1 * 3 * 2 * 4, 2.f);
  c.holdout.v.assign(2 * 1 * 3 * 2 * 4, 3.f);
  return c;
}

// 1/448 = 2^-6 / 7; 1/7 = 1.001001...b * 2^-3, 23 fraction bits 00100100100100100100100 then 1001..:
// rounds up -> fraction 0x124925, exponent -9 -> 0x3b124925.
constexpr uint32_t kOneOver448 = 0x3b124925u;

bool have_jsonschema() { return test::run_cmd("python3 -c 'import jsonschema'").status == 0; }
int validate(const std::string& json_path, const std::string& schema_name, std::string* err = nullptr) {
  const std::string check =
      "python3 -c 'import json,sys,jsonschema; s=json.load(open(sys.argv[2])); "
      "jsonschema.Draft202012Validator.check_schema(s); jsonschema.validate(json.load(open(sys.argv[1])), s, "
      "cls=jsonschema.Draft202012Validator)' ";
  auto r = test::run_cmd(check + json_path + " " + std::string(KVQ_SOURCE_DIR) + "/schemas/" + schema_name);
  if (err) *err = r.err;
  return r.status;
}
int validate_doc(const json& doc, const std::string& schema_name, std::string* err = nullptr) {
  static int n = 0;
  const std::string p = test::temp_path("doc" + std::to_string(n++) + ".json");
  test::write_text(p, doc.dump());
  return validate(p, schema_name, err);
}

std::vector<float> read_all(const detail::SafetensorsFile& f, const std::string& name, int64_t n) {
  std::vector<float> out(static_cast<size_t>(n));
  f.read_f32(name, 0, n, out.data());
  return out;
}

}  // namespace

// ---- safetensors writer --------------------------------------------------------------------------

TEST(Safetensors, RoundTripThroughKvqReader) {
  const std::vector<float> a = {1.f, -0.f, 3.5f, from_bits(0x00000001u), std::numeric_limits<float>::max(),
                                -1e-38f};
  const std::vector<float> b = {0.25f};
  const std::vector<float> c(7 * 3, 0.f);
  std::vector<float> cc = c;
  for (size_t i = 0; i < cc.size(); ++i) cc[i] = float(i) * 0.1f - 1.f;
  const std::vector<StTensor> ts = {f32_tensor("z.last", {2, 3}, a), f32_tensor("a.first", {1}, b),
                                    f32_tensor("m.mid", {7, 1, 3}, cc)};
  const std::string path = test::temp_path("rt.safetensors");
  write_safetensors(path, ts, {{"format", "pt"}, {"who", "kvq test"}});

  detail::SafetensorsFile f(path);
  std::set<std::string> names;
  for (const auto& [n, info] : f.tensors()) names.insert(n);
  EXPECT_EQ(names, (std::set<std::string>{"a.first", "m.mid", "z.last"}));
  for (const auto& t : ts) {
    const auto* info = f.find(t.name);
    ASSERT_NE(info, nullptr) << t.name;
    EXPECT_EQ(info->dtype, "F32");
    EXPECT_EQ(info->shape, t.shape);
    f.check(t.name, t.shape);
  }
  auto same_bits = [](const std::vector<float>& x, const std::vector<float>& y) {
    if (x.size() != y.size()) return false;
    for (size_t i = 0; i < x.size(); ++i)
      if (bits(x[i]) != bits(y[i])) return false;
    return true;
  };
  EXPECT_TRUE(same_bits(read_all(f, "z.last", 6), a));
  EXPECT_TRUE(same_bits(read_all(f, "a.first", 1), b));
  EXPECT_TRUE(same_bits(read_all(f, "m.mid", 21), cc));

  // The layout itself, read by hand: u64 LE length, a header padded to 8, metadata as given.
  const std::string bytes = read_file(path);
  ASSERT_GE(bytes.size(), 8u);
  uint64_t n = 0;
  for (int i = 0; i < 8; ++i) n |= uint64_t(uint8_t(bytes[size_t(i)])) << (8 * i);
  EXPECT_EQ(n % 8, 0u);
  EXPECT_EQ(bytes.size(), 8 + n + (6 + 1 + 21) * 4);
  const json h = json::parse(bytes.substr(8, n));
  EXPECT_EQ(h["__metadata__"], (json{{"format", "pt"}, {"who", "kvq test"}}));
  EXPECT_EQ(h["a.first"]["data_offsets"], (json{0, 4}));  // name order: a.first, m.mid, z.last
  EXPECT_EQ(h["m.mid"]["data_offsets"], (json{4, 88}));
  EXPECT_EQ(h["z.last"]["data_offsets"], (json{88, 112}));

  // Input order does not matter.
  const std::vector<StTensor> rev = {ts[2], ts[1], ts[0]};
  EXPECT_EQ(safetensors_bytes(rev, {{"who", "kvq test"}, {"format", "pt"}}), bytes);
}

TEST(Safetensors, NoMetadataAndNoFileOnFailure) {
  const std::string bytes = safetensors_bytes({f32_tensor("x", {2}, {1.f, 2.f})});
  uint64_t n = 0;
  for (int i = 0; i < 8; ++i) n |= uint64_t(uint8_t(bytes[size_t(i)])) << (8 * i);
  EXPECT_FALSE(json::parse(bytes.substr(8, n)).contains("__metadata__"));
  const std::string bad = test::temp_path("no_such_dir") + "/x.safetensors";
  EXPECT_THROW(write_safetensors(bad, {f32_tensor("x", {1}, {1.f})}), Error);
  EXPECT_FALSE(fs::exists(bad));
}

// ---- vLLM scales --------------------------------------------------------------------------------

TEST(VllmScales, ScaleFormulaPerHead) {
  VllmOptions o;
  o.strategy = ScaleStrategy::kAttnHead;
  const VllmScales s = vllm_scales(calib_with_amax(), "c.h5", o);
  ASSERT_EQ(s.k.size(), 4u);
  ASSERT_EQ(s.q.size(), 8u);
  // amax / 448 by hand.
  EXPECT_EQ(bits(s.k[0]), bits(1.f));
  EXPECT_EQ(bits(s.k[1]), bits(0.5f));
  EXPECT_EQ(bits(s.k[2]), kOneOver448);
  EXPECT_EQ(bits(s.k[3]), bits(0.015625f));
  EXPECT_EQ(s.v[0], 2.f);
  EXPECT_EQ(s.v[1], 0.0078125f);
  EXPECT_EQ(s.v[2], 0.125f);
  EXPECT_EQ(bits(s.v[3]), 0x3a924925u);  // 0.5/448 = 2^-1 * (1/448): kOneOver448 with exponent - 1
  const std::vector<float> q_rest(s.q.begin() + 1, s.q.end());
  EXPECT_EQ(q_rest, (std::vector<float>{1.f, 0.25f, 0.03125f, 0.0625f, 0.125f, 0.0078125f, 4.f}));
  // 44.8f / 448: 44.8f = 0x42333333 = 11744051 * 2^-18; / 448 = 11744051 / 7 * 2^-24 = 1677721.571.. * 2^-24
  // -> 23-bit normalisation: 1677721.571 * 2^-24 = 13421772.57 * 2^-27 -> rounds to 13421773 = 0xCCCCCD,
  // exponent -27 + 23 = -4: 0x3dcccccd (the fp32 nearest 0.1).
  EXPECT_EQ(bits(s.q[0]), 0x3dcccccdu);
}

TEST(VllmScales, TensorStrategyTakesMaxOverHeadsAndMargin) {
  VllmOptions o;
  o.margin = 1.25;
  const VllmScales s = vllm_scales(calib_with_amax(), "c.h5", o);
  // Layer 0: K max(448, 224) = 448 -> 448 * 1.25 / 448 = 1.25; layer 1: max(1, 7) -> 7 * 1.25 / 448.
  EXPECT_EQ(s.k, (std::vector<float>{1.25f, 0.01953125f}));
  EXPECT_EQ(s.v, (std::vector<float>{2.5f, 0.15625f}));          // 896, 56
  EXPECT_EQ(s.q, (std::vector<float>{1.25f, 5.f}));              // 448, 1792
  // Legacy per-layer scale: max of the layer's k and v scales.
  EXPECT_EQ(s.kv_layer_scale(0), 2.5f);
  EXPECT_EQ(s.kv_layer_scale(1), 0.15625f);
}

TEST(VllmScales, HeadThatNeverFiredIsNamed) {
  CalibFile c = calib_with_amax();
  c.moments.k_amax[3] = 0.f;
  const std::string e = error_of([&] { vllm_scales(c, "cal.kvqcal.h5", VllmOptions{}); });
  EXPECT_NE(e.find("cal.kvqcal.h5"), std::string::npos) << e;
  EXPECT_NE(e.find("amax_k"), std::string::npos) << e;
  EXPECT_NE(e.find("layer 1 KV head 1"), std::string::npos) << e;
  EXPECT_NE(e.find("never fired"), std::string::npos) << e;
  EXPECT_EQ(e.find('\n'), std::string::npos);

  c = calib_with_amax();
  c.moments.q_amax[6] = std::numeric_limits<float>::quiet_NaN();
  const std::string eq = error_of([&] { vllm_scales(c, "cal.kvqcal.h5", VllmOptions{}); });
  EXPECT_NE(eq.find("layer 1 query head 2"), std::string::npos) << eq;
  EXPECT_NE(eq.find("amax_q"), std::string::npos) << eq;

  c = calib_with_amax();
  c.moments.v_amax[0] = std::numeric_limits<float>::infinity();
  EXPECT_NE(error_of([&] { vllm_scales(c, "x", VllmOptions{}); }).find("layer 0 KV head 0"), std::string::npos);
}

TEST(VllmScales, MissingMaximaAndBadMargin) {
  CalibFile c = calib_with_amax();
  c.moments.k_amax.clear();
  c.moments.v_amax.clear();
  c.moments.q_amax.clear();
  const std::string e = error_of([&] { vllm_scales(c, "old.kvqcal.h5", VllmOptions{}); });
  EXPECT_NE(e.find("old.kvqcal.h5"), std::string::npos) << e;
  EXPECT_NE(e.find("lacks activation maxima"), std::string::npos) << e;
  EXPECT_NE(e.find("recapture"), std::string::npos) << e;

  for (double m : {0.0, -1.0, std::nan(""), std::numeric_limits<double>::infinity()}) {
    VllmOptions o;
    o.margin = m;
    EXPECT_NE(error_of([&] { vllm_scales(calib_with_amax(), "c", o); }).find("--margin"), std::string::npos) << m;
  }
  // A margin so large the scale overflows fp32 is refused, not written as inf.
  VllmOptions o;
  o.margin = 1e300;
  EXPECT_NE(error_of([&] { vllm_scales(calib_with_amax(), "c", o); }).find("not a finite fp32"), std::string::npos);
}

TEST(VllmScales, TensorsHaveVllmNamesShapesAndValues) {
  for (ScaleStrategy st : {ScaleStrategy::kTensor, ScaleStrategy::kAttnHead}) {
    VllmOptions o;
    o.strategy = st;
    const VllmScales s = vllm_scales(calib_with_amax(), "c", o);
    const std::string path = test::temp_path(std::string("scales_") + to_string(st) + ".safetensors");
    write_safetensors(path, vllm_tensors(s));
    detail::SafetensorsFile f(path);
    const int64_t kv = st == ScaleStrategy::kTensor ? 1 : 2, q = st == ScaleStrategy::kTensor ? 1 : 4;
    std::set<std::string> expected, found;
    for (int l = 0; l < 2; ++l)
      for (const char* w : {"k_scale", "v_scale", "q_scale"})
        expected.insert("model.layers." + std::to_string(l) + ".self_attn." + w);
    for (const auto& [n, info] : f.tensors()) found.insert(n);
    EXPECT_EQ(found, expected);
    for (int l = 0; l < 2; ++l) {
      const std::string p = "model.layers." + std::to_string(l) + ".self_attn.";
      for (const auto& [w, n] : {std::pair<std::string, int64_t>{"k_scale", kv}, {"v_scale", kv}, {"q_scale", q}}) {
        const auto* info = f.find(p + w);
        ASSERT_NE(info, nullptr);
        EXPECT_EQ(info->dtype, "F32");
        EXPECT_EQ(info->shape, (std::vector<int64_t>{n}));
      }
    }
    if (st == ScaleStrategy::kTensor) {
      EXPECT_EQ(read_all(f, "model.layers.0.self_attn.k_scale", 1), (std::vector<float>{1.f}));
      EXPECT_EQ(read_all(f, "model.layers.1.self_attn.v_scale", 1), (std::vector<float>{0.125f}));
      EXPECT_EQ(read_all(f, "model.layers.1.self_attn.q_scale", 1), (std::vector<float>{4.f}));
    } else {
      const auto k1 = read_all(f, "model.layers.1.self_attn.k_scale", 2);
      EXPECT_EQ(bits(k1[0]), kOneOver448);
      EXPECT_EQ(k1[1], 0.015625f);
      EXPECT_EQ(read_all(f, "model.layers.0.self_attn.q_scale", 4)[3], 0.03125f);
    }
  }
}

TEST(VllmScales, LegacyFileLayout) {
  const VllmScales s = vllm_scales(calib_with_amax(), "c", VllmOptions{});
  const json j = vllm_legacy_scales(s, "llama", 2);
  EXPECT_EQ(j["model_type"], "llama");
  EXPECT_EQ(j["kv_cache"]["dtype"], "float8_e4m3fn");
  // Layer 0: max(k 1, v 2) = 2; layer 1: max(k 7/448, v 56/448) = 0.125. Same for both ranks.
  const json layers = {{"0", 2.0}, {"1", 0.125}};
  EXPECT_EQ(j["kv_cache"]["scaling_factor"], (json{{"0", layers}, {"1", layers}}));
}

// ---- ModelOpt -------------------------------------------------------------------------------------

namespace {

AllocFile layer_precision(const std::vector<MinifloatFormat>& per_layer, int kv_heads = 2) {
  AllocFile a;
  a.method = a.v_method = "layer-precision";
  a.calib = calib_with_amax().prov;
  a.calib.n_layers = int(per_layer.size());
  for (Side side : {Side::kK, Side::kV})
    for (int l = 0; l < int(per_layer.size()); ++l)
      for (int h = 0; h < kv_heads; ++h) {
        HeadDecision d;
        d.layer = l;
        d.kv_head = h;
        d.side = side;
        d.kind = CodingKind::kMinifloat;
        d.minifloat = per_layer[size_t(l)];
        d.scale = 0.5f;
        a.heads.push_back(d);
      }
  return a;
}

constexpr MinifloatFormat kF8 = MinifloatFormat::kFp8E4M3, kF4 = MinifloatFormat::kNvfp4;

}  // namespace

TEST(ModelOpt, UniformAndMixed) {
  const json u = modelopt_config_json(layer_precision({kF8, kF8, kF8}));
  EXPECT_EQ(u["producer"]["name"], "kvq");
  // ModelOpt's KV-cache-only export (Model-Optimizer tests/unit/torch/export/test_get_quantization.py):
  // an empty weight-layer map and the per-layer KV map even when every layer agrees.
  EXPECT_EQ(u["quantization"],
            (json{{"quant_algo", nullptr},
                  {"quantized_layers", json::object()},
                  {"kv_cache_quant_algo", "FP8"},
                  {"kv_cache_quantized_layers",
                   {{"model.layers.0.self_attn", {{"quant_algo", "FP8"}}},
                    {"model.layers.1.self_attn", {{"quant_algo", "FP8"}}},
                    {"model.layers.2.self_attn", {{"quant_algo", "FP8"}}}}},
                  {"kv_cache_schema_version", 1}}));
  const json u4 = modelopt_config_json(layer_precision({kF4, kF4}));
  EXPECT_EQ(u4["quantization"]["kv_cache_quant_algo"], "NVFP4");

  const json m = modelopt_config_json(layer_precision({kF8, kF4, kF8, kF4, kF4}));
  const json expected = {{"quant_algo", nullptr},
                         {"quantized_layers", json::object()},
                         {"kv_cache_quant_algo", "MIXED_PRECISION"},
                         {"kv_cache_quantized_layers",
                          {{"model.layers.0.self_attn", {{"quant_algo", "FP8"}}},
                           {"model.layers.1.self_attn", {{"quant_algo", "NVFP4"}}},
                           {"model.layers.2.self_attn", {{"quant_algo", "FP8"}}},
                           {"model.layers.3.self_attn", {{"quant_algo", "NVFP4"}}},
                           {"model.layers.4.self_attn", {{"quant_algo", "NVFP4"}}}}},
                         {"kv_cache_schema_version", 1}};
  EXPECT_EQ(m["quantization"], expected);
}

TEST(ModelOpt, RefusesWhatItCannotExpress) {
  AllocFile a = layer_precision({kF8, kF4});
  for (auto& h : a.heads)
    if (h.layer == 1 && h.side == Side::kV && h.kv_head == 1) h.minifloat = kF8;
  std::string e = error_of([&] { layer_formats(a, "a.kvqalloc.h5"); });
  EXPECT_NE(e.find("a.kvqalloc.h5"), std::string::npos) << e;
  EXPECT_NE(e.find("layer 1 V head 1"), std::string::npos) << e;
  EXPECT_NE(e.find("one KV-cache format per layer"), std::string::npos) << e;

  a = layer_precision({kF8, kF4});
  a.method = a.v_method = "block-gtq";
  EXPECT_NE(error_of([&] { layer_formats(a, "a"); }).find("'block-gtq'"), std::string::npos);

  a = layer_precision({kF8, kF4});
  a.heads[0].kind = CodingKind::kTqGroups;
  EXPECT_NE(error_of([&] { layer_formats(a, "a"); }).find("not a minifloat"), std::string::npos);

  a = layer_precision({kF8, kF4});
  a.calib.n_layers = 3;
  EXPECT_NE(error_of([&] { layer_formats(a, "a"); }).find("layer 2 has no decisions"), std::string::npos);
}

// ---- JSON against schemas/ -------------------------------------------------------------------------

TEST(ExportSchemas, OutputsValidateAndSchemasAreStrict) {
  if (!have_jsonschema()) GTEST_SKIP() << "needs python3-jsonschema (scripts/test installs it)";
  std::string err;
  for (ScaleStrategy st : {ScaleStrategy::kTensor, ScaleStrategy::kAttnHead})
    EXPECT_EQ(validate_doc(vllm_kv_cache_scheme(st), "vllm-kv-cache-scheme.schema.json", &err), 0) << err;
  const VllmScales s = vllm_scales(calib_with_amax(), "c", VllmOptions{});
  const json legacy = vllm_legacy_scales(s, "llama", 4);
  EXPECT_EQ(validate_doc(legacy, "vllm-kv-cache-scales.schema.json", &err), 0) << err;
  const json uni = modelopt_config_json(layer_precision({kF8, kF8}));
  const json mixed = modelopt_config_json(layer_precision({kF4, kF8}));
  EXPECT_EQ(validate_doc(uni, "modelopt-hf-quant-config.schema.json", &err), 0) << err;
  EXPECT_EQ(validate_doc(mixed, "modelopt-hf-quant-config.schema.json", &err), 0) << err;

  // Strictness: each mutation must be rejected.
  json bad = vllm_kv_cache_scheme(ScaleStrategy::kTensor);
  bad["kv_cache_scheme"]["strategy"] = "channel";
  EXPECT_NE(validate_doc(bad, "vllm-kv-cache-scheme.schema.json"), 0);
  bad = vllm_kv_cache_scheme(ScaleStrategy::kTensor);
  bad["kv_cache_scheme"]["extra"] = 1;
  EXPECT_NE(validate_doc(bad, "vllm-kv-cache-scheme.schema.json"), 0);
  bad = legacy;
  bad["kv_cache"]["scaling_factor"]["0"]["1"] = 0.0;
  EXPECT_NE(validate_doc(bad, "vllm-kv-cache-scales.schema.json"), 0);
  bad = legacy;
  bad["kv_cache"]["dtype"] = "fp8";
  EXPECT_NE(validate_doc(bad, "vllm-kv-cache-scales.schema.json"), 0);
  bad = mixed;
  bad["quantization"].erase("kv_cache_schema_version");
  EXPECT_NE(validate_doc(bad, "modelopt-hf-quant-config.schema.json"), 0);
  bad = uni;
  bad["quantization"].erase("kv_cache_quantized_layers");
  EXPECT_NE(validate_doc(bad, "modelopt-hf-quant-config.schema.json"), 0);
  bad = uni;
  bad["quantization"]["quantized_layers"]["model.layers.0.self_attn.q_proj"] = {{"quant_algo", "FP8"}};
  EXPECT_NE(validate_doc(bad, "modelopt-hf-quant-config.schema.json"), 0);
  bad = mixed;
  bad["quantization"]["kv_cache_quantized_layers"]["model.layers.0.self_attn"]["quant_algo"] = "INT8";
  EXPECT_NE(validate_doc(bad, "modelopt-hf-quant-config.schema.json"), 0);
}

// ---- the CLI ---------------------------------------------------------------------------------------

namespace {

// Bounded: a hung tool fails the test instead of stalling the suite.
test::CmdResult kvq_export(const std::string& args) {
  return test::run_cmd("timeout 120 " + test::bin("kvq-export") + " " + args);
}

void expect_refused(const test::CmdResult& r, const std::string& out_dir, const std::vector<std::string>& parts) {
  EXPECT_EQ(r.status, 2) << r.err;
  EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
  EXPECT_NE(r.err.find("kvq-export: error: "), std::string::npos) << r.err;
  for (const auto& p : parts) EXPECT_NE(r.err.find(p), std::string::npos) << p << " in: " << r.err;
  EXPECT_FALSE(fs::exists(out_dir)) << out_dir;
}

}  // namespace

TEST(ExportCli, HelpAndUsage) {
  auto r = kvq_export("--help > /dev/null");
  EXPECT_EQ(r.status, 0) << r.err;
  r = test::run_cmd("timeout 120 " + test::bin("kvq-export") + " vllm --help > " + test::temp_path("help.txt"));
  EXPECT_EQ(r.status, 0);
  const std::string help = read_file(test::temp_path("help.txt"));
  for (const char* w : {"--calib", "--strategy", "--margin", "--tp", "--out"})
    EXPECT_NE(help.find(w), std::string::npos) << w;
  expect_refused(kvq_export(""), fresh_dir("none"), {});
}

TEST(ExportCli, RefusesBadInputAndWritesNothing) {
  const std::string out = fresh_dir("refused");
  expect_refused(kvq_export("vllm --calib " + test::temp_path("missing.kvqcal.h5") + " --out " + out), out,
                 {"missing.kvqcal.h5"});
  const std::string garbage = test::temp_path("garbage.kvqcal.h5");
  test::write_text(garbage, "not an hdf5 file at all");
  expect_refused(kvq_export("vllm --calib " + garbage + " --out " + out), out, {"garbage.kvqcal.h5"});

  CalibFile old = calib_with_amax();
  old.moments.k_amax.clear();
  old.moments.v_amax.clear();
  old.moments.q_amax.clear();
  const std::string old_path = test::temp_path("old.kvqcal.h5");
  write_calib(old_path, old);
  expect_refused(kvq_export("vllm --calib " + old_path + " --out " + out), out,
                 {"old.kvqcal.h5", "lacks activation maxima", "recapture"});

  for (const char* m : {"0", "-1", "abc", "nan"})
    expect_refused(kvq_export("vllm --calib " + old_path + " --margin " + m + " --out " + out), out, {"--margin"});
  expect_refused(kvq_export("vllm --calib " + old_path + " --strategy channel --out " + out), out, {"--strategy"});
  expect_refused(kvq_export("vllm --calib " + old_path + " --tp 0 --out " + out), out, {"--tp"});
  expect_refused(kvq_export("modelopt --alloc " + test::temp_path("missing.kvqalloc.h5") + " --out " + out), out,
                 {"missing.kvqalloc.h5"});
}

TEST(ExportCli, VllmEndToEnd) {
  const std::string cal = test::temp_path("amax.kvqcal.h5");
  write_calib(cal, calib_with_amax());
  if (!read_calib(cal, false).moments.has_amax())
    GTEST_SKIP() << "write_calib/read_calib do not carry activation maxima yet (calibration format version 3)";
  const std::string out = fresh_dir("vllm_out");
  auto r = kvq_export("vllm -q --calib " + cal + " --strategy attn_head --tp 2 --out " + out);
  ASSERT_EQ(r.status, 0) << r.err;
  detail::SafetensorsFile f(out + "/kv_scales.safetensors");
  EXPECT_EQ(f.tensors().size(), 6u);
  EXPECT_EQ(f.find("model.layers.1.self_attn.q_scale")->shape, (std::vector<int64_t>{4}));
  EXPECT_EQ(bits(read_all(f, "model.layers.1.self_attn.k_scale", 2)[0]), kOneOver448);
  const json scheme = json::parse(read_file(out + "/kv_cache_scheme.json"));
  EXPECT_EQ(scheme["kv_cache_scheme"]["strategy"], "attn_head");
  const json legacy = json::parse(read_file(out + "/kv_cache_scales.json"));
  EXPECT_EQ(legacy["kv_cache"]["scaling_factor"]["1"]["0"], 2.0);
  if (have_jsonschema()) {
    std::string err;
    EXPECT_EQ(validate(out + "/kv_cache_scheme.json", "vllm-kv-cache-scheme.schema.json", &err), 0) << err;
    EXPECT_EQ(validate(out + "/kv_cache_scales.json", "vllm-kv-cache-scales.schema.json", &err), 0) << err;
  }
  // A head that never fired: refused, nothing written.
  CalibFile z = calib_with_amax();
  z.moments.v_amax[1] = 0.f;
  const std::string zc = test::temp_path("zero.kvqcal.h5");
  write_calib(zc, z);
  const std::string out2 = fresh_dir("vllm_zero");
  expect_refused(kvq_export("vllm --calib " + zc + " --out " + out2), out2, {"layer 0 KV head 1", "never fired"});
}

TEST(ExportCli, ModelOptEndToEnd) {
  const AllocFile a = layer_precision({kF8, kF4});
  const std::string path = test::temp_path("lp.kvqalloc.h5");
  try {
    write_alloc(path, a);
    const AllocFile back = read_alloc(path);
    if (back.heads.empty() || back.heads[0].kind != CodingKind::kMinifloat)
      GTEST_SKIP() << "the allocation file does not carry minifloat decisions yet";
  } catch (const std::exception& e) {
    GTEST_SKIP() << "write_alloc/read_alloc do not support layer-precision allocations yet: " << e.what();
  }
  const std::string out = fresh_dir("mo_out");
  auto r = kvq_export("modelopt -q --alloc " + path + " --out " + out);
  ASSERT_EQ(r.status, 0) << r.err;
  const json j = json::parse(read_file(out + "/hf_quant_config.json"));
  EXPECT_EQ(j["quantization"]["kv_cache_quant_algo"], "MIXED_PRECISION");
  EXPECT_EQ(j["quantization"]["kv_cache_quantized_layers"]["model.layers.1.self_attn"]["quant_algo"], "NVFP4");
  if (have_jsonschema()) {
    std::string err;
    EXPECT_EQ(validate(out + "/hf_quant_config.json", "modelopt-hf-quant-config.schema.json", &err), 0) << err;
  }
}
