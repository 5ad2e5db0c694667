// gpt-oss (gpt_oss): a tiny checkpoint written here in the HF root layout (hf_tiny.hpp: BF16
// attention, router, norms, embedding and head; the experts in MXFP4 as shipped, U8 blocks and
// scales, from the test's own encoder), kvq's fp32 forward against hf_reference.hpp's float64
// forward written from MODEL-FAMILIES-2026.md §3 (OpenAI's gpt_oss/torch/model.py, transformers'
// modeling_gpt_oss.py): per-head attention sinks, even layers sliding over W keys and odd layers
// full (from layer_types, or HF's default rule when the config has none), YaRN without truncation
// with cos/sin x (0.1 ln F + 1), q/k/v/o biases, the router's softmax over its top-k logits (with
// bias), interleaved gate/up rows with biases, the clamped SwiGLU (gate <= 7, |up| <= 7, alpha
// 1.702, up + 1) and the down bias inside the weighted sum. Tolerance as the other families:
// max |logit - reference| <= 1e-4 · max |reference logit|, over prompts longer than 2W. Negative
// controls (each must miss by > 1e-2): sinks dropped, the window one key wider, MXFP4 nibbles read
// high first, the clamp dropped, softmax over all experts before the top-k, gate/up as halves,
// YaRN truncated (floor/ceil), no attention factor, the window on the other layers.
#include <gtest/gtest.h>

#include <limits>

#include <nlohmann/json.hpp>
#include <random>

#include "bf16_bound.hpp"
#include "family_test_util.hpp"
#include "hf_reference.hpp"
#include "hf_tiny.hpp"
#include "kvq/model/model.hpp"
#include "model_test_util.hpp"

namespace kvq {
namespace {

namespace hf = test::hf;
namespace ref = test::ref;
using test::argmax_rows;
using test::Checkpoint;
using test::control;
using test::Fixture;
using test::kvq_logits;
using test::make_checkpoint;
using test::seeded_ids;
using nlohmann::json;

constexpr double kTol = 1e-4;
constexpr double kControl = 1e-2;
constexpr int kWindow = 6;
constexpr int kPrompt = 20;  // > 2 · kWindow

// head_dim 16 != hidden / heads (64 / 6): from the config; GQA groups of 3; D and I multiples of 32.
hf::Spec spec(uint32_t seed) {
  hf::Spec s;
  s.family = "gpt_oss";
  s.hidden = 64;
  s.layers = 4;
  s.heads = 6;
  s.kv_heads = 2;
  s.head_dim = 16;
  s.inter = 64;
  s.experts = 4;
  s.top_k = 2;
  s.vocab = 64;
  s.max_pos = 131072;
  s.theta = 150000.0;
  s.yarn_factor = 32.0;
  s.yarn_original = 1024;  // low ≈ 1.09, high ≈ 3.42 at d = 16: the ramp's ends are not integers
  s.eps = 1e-5;
  s.sliding_window = kWindow;
  s.bos_id = 60;
  s.eos_id = 61;
  s.seed = seed;
  // Scales: the gate/up pre-activations (x normed to unit rms, 64 inputs) have std ~0.5 · 8 = 4,
  // so the clamp at 7 bites for a good share of them; sinks N(0, 1.5), of the order of the
  // attention logits. (Measured: every control of EveryFeatureMatters misses by >= 0.03, and a 1e-7
  // relative change of the weights moves the logits by ~1e-6, well inside kTol.)
  s.scale = 0.2;
  s.embed_scale = 1.0;
  s.norm_jitter = 0.1;
  s.gate_up_scale = 0.5;
  s.bias_scale = 0.3;
  s.router_scale = 0.5;
  s.sink_scale = 1.5;
  return s;
}

// ---------------------------------------------------------------- the test side's own checks
// (independent of kvq: they hold before kvq opens gpt_oss)

// MODEL-FAMILIES-2026.md §3.4: E2M1 LUT, E8M0 scale 2^(u - 127), LOW nibble = even element.
TEST(GptOssReference, Mxfp4RoundTripsEveryValue) {
  const double lut[16] = {0, 0.5, 1, 1.5, 2, 3, 4, 6, -0.0, -0.5, -1, -1.5, -2, -3, -4, -6};
  for (int c = 0; c < 16; ++c) EXPECT_EQ(hf::fp4_value(c), lut[c]) << c;
  // Every code at every position (even and odd), under scales 2^-20 .. 2^20: a group holding all 16
  // values (amax 6 · 2^e, so its scale is 2^e) decodes back exactly and re-encodes to the same bytes.
  for (int e = -20; e <= 20; ++e)
    for (int shift = 0; shift < 16; ++shift) {
      std::vector<double> w(64);
      for (int t = 0; t < 64; ++t) w[size_t(t)] = std::ldexp(lut[(t + shift) % 16], e);
      std::vector<uint8_t> blocks(2 * 16), scales(2);
      hf::mxfp4_encode(w.data(), 1, 64, blocks.data(), scales.data());
      EXPECT_EQ(scales[0], uint8_t(127 + e));
      EXPECT_EQ(scales[1], uint8_t(127 + e));
      for (int t = 0; t < 64; ++t) {
        const int code = (t + shift) % 16, byte = blocks[size_t(t / 2)];
        // -0 is written as +0's code; every other value has exactly one code
        EXPECT_EQ(t % 2 ? byte >> 4 : byte & 0xF, code == 8 ? 0 : code) << "e " << e << " t " << t;
      }
      std::vector<double> back(64);
      hf::mxfp4_decode(blocks.data(), scales.data(), 1, 64, back.data());
      EXPECT_EQ(back, w) << "e " << e << " shift " << shift;
      std::vector<uint8_t> again(32), again_s(2);
      hf::mxfp4_encode(back.data(), 1, 64, again.data(), again_s.data());
      EXPECT_EQ(again, blocks);
    }
  // A hand-made byte: 0x92 under scale 128 (2^1) is [LUT[2], LUT[9]] · 2 = [2, -1]; read high nibble
  // first it is [-1, 2].
  std::vector<uint8_t> b(16, 0), sc = {128};
  b[0] = 0x92;
  std::vector<double> w(32);
  hf::mxfp4_decode(b.data(), sc.data(), 1, 32, w.data());
  EXPECT_EQ(w[0], 2.0);
  EXPECT_EQ(w[1], -1.0);
  EXPECT_EQ(w[2], 0.0);
  hf::mxfp4_decode(b.data(), sc.data(), 1, 32, w.data(), true);
  EXPECT_EQ(w[0], -1.0);
  EXPECT_EQ(w[1], 2.0);
  // Rounding to the nearest value: 2.4 -> 2, 2.6 -> 3, 5.1 -> 6, -0.3 -> -0.5, 0.2 -> 0.
  EXPECT_EQ(hf::fp4_value(hf::fp4_nearest(2.4)), 2.0);
  EXPECT_EQ(hf::fp4_value(hf::fp4_nearest(2.6)), 3.0);
  EXPECT_EQ(hf::fp4_value(hf::fp4_nearest(5.1)), 6.0);
  EXPECT_EQ(hf::fp4_value(hf::fp4_nearest(-0.3)), -0.5);
  EXPECT_EQ(hf::fp4_value(hf::fp4_nearest(0.2)), 0.0);
}

// The checkpoint as written: config keys, the shapes and dtypes of §3.4; the values the reference
// reads are the decode of the written bytes.
TEST(GptOssReference, CheckpointLayout) {
  const hf::Spec s = spec(1);
  const hf::TensorMap w = hf::make_weights(s);
  const json c = hf::make_config(s);
  EXPECT_EQ(c["model_type"], "gpt_oss");
  EXPECT_EQ(c["architectures"], json::array({"GptOssForCausalLM"}));
  EXPECT_EQ(c["layer_types"], json::array({"sliding_attention", "full_attention", "sliding_attention", "full_attention"}));
  EXPECT_EQ(c["rope_scaling"]["rope_type"], "yarn");
  EXPECT_EQ(c["rope_scaling"]["truncate"], false);
  EXPECT_EQ(c["quantization_config"]["quant_method"], "mxfp4");
  const std::string x = "model.layers.3.mlp.experts.";
  EXPECT_EQ(w.at(x + "gate_up_proj_blocks").shape, (std::vector<int64_t>{4, 128, 2, 16}));
  EXPECT_EQ(w.at(x + "gate_up_proj_blocks").dtype, "U8");
  EXPECT_EQ(w.at(x + "gate_up_proj_scales").shape, (std::vector<int64_t>{4, 128, 2}));
  EXPECT_EQ(w.at(x + "gate_up_proj_bias").shape, (std::vector<int64_t>{4, 128}));
  EXPECT_EQ(w.at(x + "down_proj_blocks").shape, (std::vector<int64_t>{4, 64, 2, 16}));
  EXPECT_EQ(w.at(x + "down_proj_scales").shape, (std::vector<int64_t>{4, 64, 2}));
  EXPECT_EQ(w.at(x + "down_proj_bias").shape, (std::vector<int64_t>{4, 64}));
  EXPECT_EQ(w.at("model.layers.0.self_attn.sinks").shape, (std::vector<int64_t>{6}));
  EXPECT_EQ(w.at("model.layers.0.self_attn.o_proj.bias").shape, (std::vector<int64_t>{64}));
  EXPECT_FALSE(w.at(x + "gate_up_proj").write);
  std::vector<double> dec(w.at(x + "down_proj").v.size());
  hf::mxfp4_decode(w.at(x + "down_proj_blocks").raw.data(), w.at(x + "down_proj_scales").raw.data(), 4 * 64, 64, dec.data());
  EXPECT_EQ(dec, w.at(x + "down_proj").v);
  EXPECT_EQ(hf::make_config([] {
              hf::Spec t = spec(1);
              t.write_layer_types = false;
              return t;
            }())
                .contains("layer_types"),
            false);
}

// §3.2's numbers for the real config (θ 150000, F 32, original 4096, d 64).
TEST(GptOssReference, YarnMatchesTheDocNumbers) {
  const ref::Yarn y = ref::yarn(150000.0, 64, 32.0, 4096.0, 32.0, 1.0, false);
  EXPECT_NEAR(y.low, 8.09, 0.005);
  EXPECT_NEAR(y.high, 17.40, 0.005);
  EXPECT_NEAR(y.attention_factor, 1.3466, 5e-5);
  ASSERT_EQ(y.inv_freq.size(), 32u);
  for (int i = 0; i < 32; ++i) {
    const double base = std::pow(150000.0, -2.0 * i / 64);
    if (i <= 8) {
      EXPECT_DOUBLE_EQ(y.inv_freq[size_t(i)], base) << i;  // below low: extrapolation
    } else if (i >= 18) {
      EXPECT_DOUBLE_EQ(y.inv_freq[size_t(i)], base / 32.0) << i;  // above high: interpolation
    } else {
      const double ramp = (i - y.low) / (y.high - y.low);
      EXPECT_NEAR(y.inv_freq[size_t(i)], base * (1 - ramp) + base / 32 * ramp, 1e-15) << i;
      EXPECT_LT(y.inv_freq[size_t(i)], base);
      EXPECT_GT(y.inv_freq[size_t(i)], base / 32.0);
    }
  }
  // truncate = true floors and ceils (8, 18): a different ramp at every dim in between
  const ref::Yarn t = ref::yarn(150000.0, 64, 32.0, 4096.0, 32.0, 1.0, true);
  EXPECT_EQ(t.low, 8.0);
  EXPECT_EQ(t.high, 18.0);
  for (int i = 9; i <= 17; ++i) EXPECT_NE(t.inv_freq[size_t(i)], y.inv_freq[size_t(i)]) << i;
}

// Every feature of the reference changes the logits of the test's checkpoint by > 1e-2, so the
// comparison with kvq below can see each one missing.
TEST(GptOssReference, EveryFeatureMatters) {
  for (uint32_t seed : {1u, 2u}) {
    const Checkpoint ck = make_checkpoint(spec(seed));
    const auto ids = seeded_ids(kPrompt, ck.s.vocab, 100 + seed);
    auto off = [&](void (*set)(ref::Options&)) {
      ref::Options o;
      set(o);
      return control(ck, ids, o);
    };
    EXPECT_GT(off([](ref::Options& o) { o.drop_sinks = true; }), kControl) << "sinks must matter";
    EXPECT_GT(off([](ref::Options& o) { o.window_plus_one = true; }), kControl) << "window W vs W + 1";
    EXPECT_GT(off([](ref::Options& o) { o.ignore_window = true; }), kControl) << "the window must matter";
    EXPECT_GT(off([](ref::Options& o) { o.swap_nibbles = true; }), kControl) << "nibble order must matter";
    EXPECT_GT(off([](ref::Options& o) { o.drop_swiglu_clamp = true; }), kControl) << "the clamp must bite";
    EXPECT_GT(off([](ref::Options& o) { o.softmax_before_topk = true; }), kControl) << "softmax of the top-k";
    EXPECT_GT(off([](ref::Options& o) { o.gate_up_halves = true; }), kControl) << "interleaved gate/up";
    ref::Model other = ck.m;
    const ref::Yarn trunc = ref::yarn(ck.s.theta, ck.s.head_dim, ck.s.yarn_factor, ck.s.yarn_original, 32.0, 1.0, true);
    other.inv_freq = trunc.inv_freq;
    EXPECT_GT(control(ck, ids, other), kControl) << "YaRN truncate false vs true";
    other = ck.m;
    other.attention_factor = 1.0;
    EXPECT_GT(control(ck, ids, other), kControl) << "the attention factor must matter";
    other = ck.m;
    for (size_t l = 0; l < other.layers.size(); ++l) other.layers[l].window = l % 2 ? kWindow : 0;
    EXPECT_GT(control(ck, ids, other), kControl) << "which layers slide must matter";
    other = ck.m;
    for (auto& L : other.layers) L.router_logit_bias.assign(L.router_logit_bias.size(), 0.0);
    EXPECT_GT(control(ck, ids, other), kControl) << "the router bias must matter";
    other = ck.m;
    for (auto& L : other.layers) L.down_bias.assign(L.down_bias.size(), 0.0);
    EXPECT_GT(control(ck, ids, other), kControl) << "the down bias must matter";
  }
}

// ---------------------------------------------------------------- kvq against the reference

TEST(GptOss, ConfigFields) {
  Fixture f(spec(1));
  const ModelConfig& c = f.model.config();
  EXPECT_EQ(c.architecture, "gpt_oss");
  EXPECT_EQ(c.n_layers, 4);
  EXPECT_EQ(c.n_heads, 6);
  EXPECT_EQ(c.n_kv_heads, 2);
  EXPECT_EQ(c.head_dim, 16);
  EXPECT_EQ(c.rotary_dim, 16);
  EXPECT_EQ(c.pairing, RopePairing::kSplitHalf);
  EXPECT_TRUE(c.qkv_bias);
  EXPECT_TRUE(c.o_bias);
  EXPECT_FALSE(c.qk_norm);
  EXPECT_FALSE(c.tie_word_embeddings);
  EXPECT_EQ(c.n_experts, 4);
  EXPECT_EQ(c.n_experts_per_tok, 2);
  EXPECT_EQ(c.layer_window, (std::vector<int>{kWindow, 0, kWindow, 0}));
  EXPECT_EQ(c.layer_moe, (std::vector<uint8_t>{1, 1, 1, 1}));
  EXPECT_FALSE(c.rope_scaling.truncate);
  EXPECT_DOUBLE_EQ(c.rope_scaling.factor, 32.0);
}

TEST(GptOss, ForwardMatchesReference) {
  // layer_types written, left out (HF's default: even layers slide), and the other way round (odd
  // layers slide: kvq must read the list, not the rule).
  for (int variant = 0; variant < 3; ++variant) {
    hf::Spec s = spec(7 + uint32_t(variant));
    if (variant == 1) s.write_layer_types = false;
    if (variant == 2) s.layer_types = {"full_attention", "sliding_attention", "full_attention", "sliding_attention"};
    Fixture f(s);
    double worst = 0;
    for (uint32_t seed : {11u, 12u, 13u}) {
      const auto ids = seeded_ids(kPrompt + int(seed % 3), s.vocab, seed);
      const double d = f.compare(ids);
      worst = std::max(worst, d);
      EXPECT_LT(d, kTol) << "variant " << variant << " prompt seed " << seed;
    }
    std::cout << "[ info ] gpt_oss variant " << variant << " max rel diff " << worst << "\n";
  }
}

TEST(GptOss, StreamedEqualsWholeAndGreedyMatches) {
  const hf::Spec s = spec(3);
  Fixture whole(s), streamed(s, true);
  const auto ids = seeded_ids(kPrompt, s.vocab, 5);
  EXPECT_TRUE(at::equal(at::tensor(kvq_logits(whole.model, ids)), at::tensor(kvq_logits(streamed.model, ids))));
  std::vector<int> a = seeded_ids(5, s.vocab, 9), b = a;
  for (int step = 0; step < 2 * kWindow + 2; ++step) {  // past the window
    const ref::Vec k = kvq_logits(whole.model, a), r = ref::forward(whole.ck.m, b);
    a.push_back(int(argmax_rows(k, s.vocab).back()));
    b.push_back(int(argmax_rows(r, s.vocab).back()));
  }
  EXPECT_EQ(a, b);
}

TEST(GptOss, BadInputsRefusedInOneLine) {
  const hf::Spec s = spec(1);
  const hf::TensorMap w = hf::make_weights(s);
  struct Case {
    json patch;
    std::vector<std::string> parts;
  };
  const std::vector<Case> cases = {
      {{{"layer_types", {"sliding_attention", "full_attention", "sliding_attention"}}}, {"config.json", "layer_types"}},
      {{{"layer_types", {"sliding_attention", "full_attention", "chunked_attention", "full_attention"}}},
       {"config.json", "layer_types", "chunked_attention"}},
      {{{"sliding_window", 0}}, {"config.json", "sliding_window"}},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.patch.dump());
    test::TempDir dir;
    json cfg = hf::make_config(s);
    cfg.update(c.patch);
    hf::write_model(dir.str(), cfg, w, 2);
    test::expect_error([&] { Model::load(dir.str()); }, c.parts);
  }
  {  // sinks [H + 1]
    SCOPED_TRACE("sinks [H + 1]");
    hf::TensorMap bad = w;
    hf::Tensor& t = bad.at("model.layers.2.self_attn.sinks");
    t.shape = {s.heads + 1};
    t.v.push_back(0.5);
    test::TempDir dir;
    hf::write_model(dir.str(), hf::make_config(s), bad, 2);
    test::expect_error([&] { Model::load(dir.str()); }, {"self_attn.sinks"});
  }
  {
    SCOPED_TRACE("a NaN sink");
    hf::TensorMap bad = w;
    bad.at("model.layers.1.self_attn.sinks").v[2] = std::numeric_limits<double>::quiet_NaN();
    test::TempDir dir;
    hf::write_model(dir.str(), hf::make_config(s), bad, 2);
    test::expect_error([&] { Model::load(dir.str()); }, {"model.layers.1.self_attn.sinks", "head 2", "not finite"});
  }
}

// ---------------------------------------------------------------- dequantized checkpoints

// A dequantized gpt-oss checkpoint (HF's GptOssExperts layout, no quantization_config): the experts
// as plain BF16 tensors gate_up_proj [E, in, 2I] (columns interleaved gate, up) and down_proj
// [E, I, out], the transposes of the MXFP4 blocks' [E, out, in], written here from the same decoded
// values. kvq must compute the same logits bit for bit (fp32 and BF16, whole and streamed); with
// the experts written untransposed it must not.
hf::TensorMap dequantized(const hf::Spec& s, const hf::TensorMap& w, bool transpose = true) {
  hf::TensorMap out;
  for (const auto& [name, t] : w)
    if (name.size() < 7 || (name.compare(name.size() - 7, 7, "_blocks") != 0 && name.compare(name.size() - 7, 7, "_scales") != 0))
      out[name] = t;
  for (int l = 0; l < s.layers; ++l)
    for (const char* x : {"gate_up_proj", "down_proj"}) {
      hf::Tensor& t = out.at("model.layers." + std::to_string(l) + ".mlp.experts." + x);
      const int64_t E = t.shape[0], o = t.shape[1], in = t.shape[2];
      if (transpose) {
        std::vector<double> v(t.v.size());
        for (int64_t e = 0; e < E; ++e)
          for (int64_t r = 0; r < o; ++r)
            for (int64_t c = 0; c < in; ++c) v[size_t((e * in + c) * o + r)] = t.v[size_t((e * o + r) * in + c)];
        t.v = std::move(v);
      }
      t.shape = {E, in, o};
      t.write = true;
    }
  return out;
}

TEST(GptOss, DequantizedCheckpointGivesTheSameLogits) {
  const hf::Spec s = spec(3);
  const Checkpoint ck = make_checkpoint(s);
  nlohmann::json cfg = hf::make_config(s);
  cfg.erase("quantization_config");
  const auto ids = seeded_ids(kPrompt, s.vocab, 31);
  for (Precision p : {Precision::kFp32, Precision::kBf16})
    for (bool stream : {false, true}) {
      SCOPED_TRACE(std::string(precision_name(p)) + (stream ? " streamed" : " whole"));
      test::TempDir a, b;
      hf::write_model(a.str(), hf::make_config(s), ck.w, 2);
      hf::write_model(b.str(), cfg, dequantized(s, ck.w), 2);
      Model::LoadOptions lo;
      lo.stream = stream;
      lo.precision = p;
      const Model mx = Model::load(a.str(), lo), plain = Model::load(b.str(), lo);
      EXPECT_EQ(kvq_logits(plain, ids), kvq_logits(mx, ids));
    }
  // Negative control: the same values written out-major (untransposed) under the plain names give
  // other logits (the tiny model has hidden == intermediate, so the shapes alone cannot tell).
  ASSERT_EQ(s.hidden, s.inter);
  test::TempDir c;
  hf::write_model(c.str(), cfg, dequantized(s, ck.w, false), 2);
  EXPECT_GT(ref::rel_max_diff(kvq_logits(Model::load(c.str()), ids), ref::forward(ck.m, ids)), kControl);
  // Both forms of one tensor is ambiguous: refused, naming it.
  hf::TensorMap both = dequantized(s, ck.w);
  for (const auto& [name, t] : ck.w)
    if (name.find("_blocks") != std::string::npos || name.find("_scales") != std::string::npos) both[name] = t;
  test::TempDir d;
  hf::write_model(d.str(), hf::make_config(s), both, 2);
  test::expect_error([&] { Model::load(d.str()); }, {"gate_up_proj", "MXFP4 blocks"});
}

// ---------------------------------------------------------------- protected cache (kvq-eval)

// kvq-eval's protected cache (ProtectedKv: keys before `sink` and the last `recent` read in full,
// the rest coded) runs its own attention kernel; with sinks it must put them in the same softmax.
// A coder that leaves the rows as they are gives the plain forward (whose sinks the reference
// checks) up to fp32 order; one that zeroes the coded values must not.
class KeepRows : public ProtectedKv {
 public:
  void code(LayerKv&) override {}
};
class ZeroValues : public ProtectedKv {
 public:
  void code(LayerKv& kv) override {
    std::fill(kv.v, kv.v + size_t(kv.batch) * kv.seq * kv.n_kv_heads * kv.v_dim(), 0.f);
  }
};

TEST(GptOss, ProtectedCachePutsTheSinksInItsSoftmax) {
  const hf::Spec s = spec(3);
  Fixture f(s, false, Precision::kFp32);
  const auto ids = seeded_ids(kPrompt, s.vocab, 21);
  auto logits = [&](ProtectedKv* p) {
    Model::ForwardOptions o;
    o.protected_kv = p;
    return kvq_logits(f.model, ids, o);
  };
  const ref::Vec plain = kvq_logits(f.model, ids);
  KeepRows keep;
  keep.sink = 1;
  keep.recent = 3;
  EXPECT_LT(ref::rel_max_diff(logits(&keep), plain), 1e-5);
  ZeroValues zero;
  zero.sink = 1;
  zero.recent = 3;
  EXPECT_GT(ref::rel_max_diff(logits(&zero), plain), kControl);
}

// ---------------------------------------------------------------- BF16 forward

// gpt-oss in BF16: in effect (differs from the plain reference by more than the fp32 tolerance;
// the difference is printed, not bounded: a top-k router picks other experts under BF16-sized
// changes) and streamed = whole, bit for bit.
TEST(Bf16Forward, GptOssStreamedEqualsWhole) {
  const hf::Spec s = spec(3);
  Fixture f(s, false, Precision::kBf16), streamed(s, true, Precision::kBf16);
  double plain = 0;
  for (uint32_t seed : {11u, 12u}) {
    const auto ids = seeded_ids(kPrompt, s.vocab, seed);
    plain = std::max(plain, ref::rel_max_diff(kvq_logits(f.model, ids), ref::forward(f.ck.m, ids)));
  }
  std::cout << "[ info ] gpt_oss BF16 vs the plain reference " << plain << " (not bounded: top-k router)\n";
  EXPECT_GT(plain, test::kBf16Floor);
  const auto ids = seeded_ids(kPrompt, s.vocab, 5);
  EXPECT_TRUE(at::equal(at::tensor(kvq_logits(f.model, ids)), at::tensor(kvq_logits(streamed.model, ids))));
}

// Against the BF16-emulated reference (bf16_bound.hpp: every projection, the experts' included,
// rounds its input and product, bias after; their MXFP4 weights are exact in BF16). This model is
// not held to the other families' 1e-5: its clamped experts and top-k router make the BF16 forward
// chaotic, and the emulation itself moves by 2e-3 .. 1.4e-2 when its products are perturbed by 1e-6
// relative (fp32 accumulation's size of error) before rounding. So the test measures that spread
// per prompt and holds kvq to it: kvq's distance to the emulation at most 3x the largest spread and
// its median at most 2x the spread's median, while the plain (unrounded) reference is > 5x farther (11x here).
TEST(Bf16Forward, GptOssMatchesTheEmulatedReferenceWithinItsOwnSpread) {
  const hf::Spec s = spec(3);
  Fixture f(s, false, Precision::kBf16);
  std::vector<std::vector<int>> prompts;
  for (uint32_t seed = 100; seed < 106; ++seed) prompts.push_back(seeded_ids(14, s.vocab, seed));
  const test::Bf16Spread b = test::measure_bf16_spread(f.model, f.ck.m, prompts);
  const std::vector<double>& got_d = b.got;
  const std::vector<double>& spread = b.spread;
  const std::vector<double>& plain = b.plain;
  using test::median;
  const double max_spread = *std::max_element(spread.begin(), spread.end());
  std::cout << "[ info ] gpt_oss BF16: kvq vs emulated median " << median(got_d) << " max "
            << *std::max_element(got_d.begin(), got_d.end()) << "; emulation's own spread median " << median(spread)
            << " max " << max_spread << "; plain reference median " << median(plain) << "\n";
  EXPECT_LE(*std::max_element(got_d.begin(), got_d.end()), 3 * max_spread);
  EXPECT_LE(median(got_d), 2 * median(spread));
  EXPECT_GT(median(plain), 5 * median(got_d));
}

}  // namespace
}  // namespace kvq
