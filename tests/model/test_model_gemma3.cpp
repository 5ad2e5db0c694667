// Gemma 3 (gemma3_text, and gemma3: the multimodal wrapper with the text fields under text_config
// and the text tensors under language_model.model. (transformers 4.50) or model.language_model. (v5),
// beside vision_tower / multi_modal_projector tensors that must be ignored): a tiny checkpoint
// written here (hf_tiny.hpp), kvq's fp32 forward against hf_reference.hpp's float64 forward written
// from MODEL-FAMILIES-2026.md §4.1 (transformers' modeling_gemma3.py): every RMSNorm scales by
// (1 + w); the embedding x sqrt(hidden) rounded to BF16; four norms per layer (input,
// post_attention on the attention output, pre_feedforward, post_feedforward on the MLP output);
// q_norm / k_norm per head before RoPE; split-half RoPE over head_dim with rope_local_base_freq on
// the sliding layers and rope_theta (linear scaling where rope_scaling says, on those layers only)
// on the full ones; the window i - W < j <= i on the sliding layers (layer_types, or the default
// rule with sliding_window_pattern); scores x query_pre_attn_scalar^-0.5; GQA; GeGLU with the tanh
// GELU; tied head without scale. Tolerance as the other families: max |logit - reference| <= 1e-4 ·
// max |reference logit|, over prompts (BOS first) longer than 2W. Negative controls (each must move
// the reference by > 1e-2, so the comparison would see kvq doing it): norms as w, the global RoPE on
// the local layers, the local RoPE on the global ones, the linear factor on every layer, the window
// off by one either way, 1/sqrt(head_dim), the erf GELU, the q/k norms skipped, the sandwich norms
// skipped, post_attention_layernorm read as Llama's pre-MLP norm; the exact sqrt(hidden) moves it by
// at most BF16's relative rounding (< 2e-3), so that one must move it by > 5 · kTol.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <iostream>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

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
using nlohmann::json;

constexpr double kTol = 1e-4;
constexpr double kControl = 1e-2;
constexpr double kEmbedControl = 5 * kTol;  // the exact-sqrt control: BF16 rounding is < 2^-9 relative
constexpr int kWindow = 6;
constexpr int kLayers = 7;   // default rule: layers 0-4 sliding, 5 full, 6 sliding
constexpr int kPrompt = 20;  // > 2 · kWindow
constexpr int kBos = 2;

// hidden 112: sqrt(112) = 10.583 rounds to 10.5625 in BF16 (-1.9e-3, near the largest relative
// rounding); head_dim 32 != hidden / heads (28); query_pre_attn_scalar 48 != head_dim; GQA groups of 2.
hf::Spec spec(uint32_t seed, const std::string& family = "gemma3_text") {
  hf::Spec s;
  s.family = family;
  s.hidden = 112;
  s.layers = kLayers;
  s.heads = 4;
  s.kv_heads = 2;
  s.head_dim = 32;
  s.inter = 160;
  s.vocab = 80;
  s.max_pos = 32768;
  s.eps = 1e-6;
  s.theta = 1e6;
  s.rope_local_theta = 1e4;
  s.query_pre_attn_scalar = 48;
  s.sliding_window = kWindow;
  s.bos_id = kBos;
  s.eos_id = 1;
  s.tied = true;
  s.seed = seed;
  // Norm weights N(0, 0.3) as offsets (so w vs 1 + w differs by ~1 per element); q/k norms N(0, 0.5).
  s.scale = 0.15;
  s.embed_scale = 0.4;
  s.norm_jitter = 0.3;
  s.qk_norm_jitter = 0.5;
  return s;
}

// A prompt as Gemma sees it: BOS, then seeded ids (never BOS again).
std::vector<int> prompt(int T, int vocab, uint32_t seed) { return test::bos_prompt(T, vocab, seed, kBos); }

// The text fields of a config: text_config for gemma3, the top level for gemma3_text.
json& text_fields(json& cfg) { return cfg.contains("text_config") ? cfg["text_config"] : cfg; }

// ---------------------------------------------------------------- the test side's own checks
// (independent of kvq: they hold before kvq opens gemma3)

// §4.1: sqrt(hidden) is cast to the weight dtype before the multiply.
TEST(Gemma3Reference, EmbedScaleIsRoundedToBf16) {
  EXPECT_EQ(hf::bf16_round(std::sqrt(3072.0)), 55.5);  // the doc's example (12B)
  EXPECT_EQ(hf::bf16_round(std::sqrt(2304.0)), 48.0);  // 2B-sized: exact
  EXPECT_EQ(hf::bf16_round(std::sqrt(1152.0)), 34.0);  // 1B: 33.94
  EXPECT_EQ(hf::bf16_round(std::sqrt(640.0)), 25.25);  // 270M: 25.30
  EXPECT_EQ(hf::bf16_round(std::sqrt(5376.0)), 73.5);  // 27B: 73.32
  const ref::Model m = make_checkpoint(spec(1)).m;
  EXPECT_EQ(m.embed_multiplier, 10.5625);
  EXPECT_DOUBLE_EQ(m.embed_multiplier_exact, std::sqrt(112.0));
  // The reference applies it: the first layer's input is E[tok] · 10.5625 (trace of q pre-RoPE is
  // downstream of a norm, so check through a zero-layer model: logits = E · norm(E[tok] · c)).
  ref::Model z = m;
  z.layers.clear();
  for (double& w : z.final_norm) w = 0;  // (1 + 0): the plain norm, scale-free
  const ref::Vec a = ref::forward(z, {5});
  ref::Vec x(z.embed.begin() + 5 * 112, z.embed.begin() + 6 * 112);
  double ss = 0;
  for (double& e : x) {
    e *= 10.5625;
    ss += e * e;
  }
  const double inv = 1 / std::sqrt(ss / 112 + z.eps);
  for (int v = 0; v < 80; v += 13) {
    double want = 0;
    for (int d = 0; d < 112; ++d) want += z.embed[size_t(v * 112 + d)] * x[size_t(d)] * inv;
    EXPECT_NEAR(a[size_t(v)], want, 1e-12) << v;  // tied head, no output scale
  }
}

TEST(Gemma3Reference, GeluTanhAndNorm) {
  // gelu_pytorch_tanh at a few points (computed from the formula in Python), and the erf form
  // (the control) differs there.
  EXPECT_NEAR(ref::detail::gelu_tanh(1.0), 0.8411919906082768, 1e-15);
  EXPECT_NEAR(ref::detail::gelu_tanh(-2.0), -0.04540230591222494, 1e-15);
  EXPECT_NEAR(ref::detail::gelu_tanh(3.0), 2.996362607918227, 1e-14);
  EXPECT_NEAR(ref::detail::gelu_erf(1.0), 0.8413447460685429, 1e-15);
  // Gemma3RMSNorm: x · rsqrt(mean x² + eps) · (1 + w); w = 0 is the identity scale.
  const ref::Vec w = {0.0, -0.5, 1.0};
  const double x[3] = {1.0, 2.0, 2.0}, r = 1 / std::sqrt(3.0 + 1e-6);
  double out[3];
  ref::detail::rms_norm(x, w, 3, 1e-6, out, 1.0);
  EXPECT_DOUBLE_EQ(out[0], 1 * r * 1.0);
  EXPECT_DOUBLE_EQ(out[1], 2 * r * 0.5);
  EXPECT_DOUBLE_EQ(out[2], 2 * r * 2.0);
}

// The checkpoints as written: config keys and nesting, layer types, tensor names and prefixes.
TEST(Gemma3Reference, CheckpointLayout) {
  {
    const hf::Spec s = spec(1);
    const json c = hf::make_config(s);
    EXPECT_EQ(c["model_type"], "gemma3_text");
    EXPECT_EQ(c["architectures"], json::array({"Gemma3ForCausalLM"}));
    EXPECT_EQ(c["layer_types"], json::array({"sliding_attention", "sliding_attention", "sliding_attention",
                                             "sliding_attention", "sliding_attention", "full_attention",
                                             "sliding_attention"}));
    EXPECT_FALSE(c.contains("sliding_window_pattern"));
    EXPECT_EQ(c["hidden_activation"], "gelu_pytorch_tanh");
    EXPECT_EQ(c["query_pre_attn_scalar"], 48.0);
    EXPECT_EQ(c["head_dim"], 32);
    EXPECT_EQ(c["rope_theta"], 1e6);
    EXPECT_EQ(c["rope_local_base_freq"], 1e4);
    EXPECT_TRUE(c["rope_scaling"].is_null());
    EXPECT_TRUE(c["final_logit_softcapping"].is_null());
    EXPECT_TRUE(c["attn_logit_softcapping"].is_null());
    EXPECT_EQ(c["sliding_window"], kWindow);
    EXPECT_EQ(c["tie_word_embeddings"], true);
    EXPECT_EQ(c["bos_token_id"], 2);
    EXPECT_EQ(c["eos_token_id"], 1);
    EXPECT_EQ(c["pad_token_id"], 0);
    const hf::TensorMap w = hf::make_weights(s);
    EXPECT_EQ(w.count("lm_head.weight"), 0u);
    for (const char* n : {"input_layernorm", "post_attention_layernorm", "pre_feedforward_layernorm",
                          "post_feedforward_layernorm"})
      EXPECT_EQ(w.at(std::string("model.layers.6.") + n + ".weight").shape, (std::vector<int64_t>{112})) << n;
    EXPECT_EQ(w.at("model.layers.0.self_attn.q_proj.weight").shape, (std::vector<int64_t>{128, 112}));
    EXPECT_EQ(w.at("model.layers.0.self_attn.k_proj.weight").shape, (std::vector<int64_t>{64, 112}));
    EXPECT_EQ(w.at("model.layers.0.self_attn.o_proj.weight").shape, (std::vector<int64_t>{112, 128}));
    EXPECT_EQ(w.at("model.layers.0.self_attn.q_norm.weight").shape, (std::vector<int64_t>{32}));
    EXPECT_EQ(w.at("model.layers.0.self_attn.k_norm.weight").shape, (std::vector<int64_t>{32}));
    EXPECT_EQ(w.count("model.layers.0.self_attn.q_proj.bias"), 0u);
    // Norm weights are offsets centred on 0 (mean ~0, spread ~0.3), not 1 + jitter.
    double sum = 0, ss = 0;
    int n = 0;
    for (const auto& [name, t] : w)
      if (name.find("layernorm") != std::string::npos || name.find("_norm.") != std::string::npos)
        for (double v : t.v) sum += v, ss += v * v, ++n;
    EXPECT_LT(std::abs(sum / n), 0.05);
    EXPECT_GT(std::sqrt(ss / n), 0.25);
  }
  {  // no layer_types; the 4.50 form with sliding_window_pattern 3; linear scaling
    hf::Spec s = spec(1);
    s.write_layer_types = false;
    s.write_sliding_window_pattern = true;
    s.sliding_window_pattern = 3;
    s.rope_linear_factor = 8.0;
    const json c = hf::make_config(s);
    EXPECT_FALSE(c.contains("layer_types"));
    EXPECT_EQ(c["sliding_window_pattern"], 3);
    EXPECT_EQ(c["rope_scaling"], (json{{"rope_type", "linear"}, {"factor", 8.0}}));
    std::vector<int> win;
    for (int l = 0; l < kLayers; ++l) win.push_back(s.window_of(l));
    EXPECT_EQ(win, (std::vector<int>{6, 6, 0, 6, 6, 0, 6}));
  }
  for (const std::string pre : {"language_model.model.", "model.language_model."}) {
    hf::Spec s = spec(1, "gemma3");
    s.language_prefix = pre;
    const json c = hf::make_config(s);
    EXPECT_EQ(c["model_type"], "gemma3");
    EXPECT_EQ(c["architectures"], json::array({"Gemma3ForConditionalGeneration"}));
    EXPECT_EQ(c["text_config"]["model_type"], "gemma3_text");
    EXPECT_EQ(c["text_config"]["num_hidden_layers"], kLayers);
    EXPECT_FALSE(c.contains("num_hidden_layers"));
    EXPECT_TRUE(c["vision_config"].is_object());
    const hf::TensorMap w = hf::make_weights(s);
    EXPECT_EQ(w.count(pre + "embed_tokens.weight"), 1u);
    EXPECT_EQ(w.count(pre + "layers.6.mlp.down_proj.weight"), 1u);
    EXPECT_EQ(w.count(pre + "norm.weight"), 1u);
    EXPECT_EQ(w.count("model.embed_tokens.weight"), 0u);
    const std::string mm = pre == "model.language_model." ? "model." : "";
    EXPECT_EQ(w.count(mm + "vision_tower.vision_model.post_layernorm.weight"), 1u);
    EXPECT_EQ(w.count(mm + "multi_modal_projector.mm_input_projection_weight"), 1u);
    // The same seed gives the same text weights under either family / prefix.
    EXPECT_EQ(w.at(pre + "layers.3.self_attn.k_norm.weight").v,
              hf::make_weights(spec(1)).at("model.layers.3.self_attn.k_norm.weight").v);
  }
}

// The reference's per-layer geometry, checked by invariances: the linear factor only reaches the
// full layers, rope_local_base_freq only the sliding ones, and the window includes the query itself
// (at T = W it has no effect; at T = W + 1 it drops key 0 from the last query).
TEST(Gemma3Reference, PerLayerRopeAndWindow) {
  const auto ids = prompt(kPrompt, 80, 3);
  {  // every layer sliding: the linear factor changes nothing
    hf::Spec s = spec(2);
    s.layer_types.assign(kLayers, "sliding_attention");
    const Checkpoint a = make_checkpoint(s);
    s.rope_linear_factor = 8.0;
    const Checkpoint b = make_checkpoint(s);
    EXPECT_EQ(ref::forward(a.m, ids), ref::forward(b.m, ids));
    s.rope_local_theta = 5e4;  // but the local base does
    EXPECT_GT(control(a, ids, make_checkpoint(s).m), kControl);
  }
  {  // every layer full: rope_local_base_freq changes nothing, the factor does
    hf::Spec s = spec(2);
    s.layer_types.assign(kLayers, "full_attention");
    const Checkpoint a = make_checkpoint(s);
    s.rope_local_theta = 5e4;
    EXPECT_EQ(ref::forward(a.m, ids), ref::forward(make_checkpoint(s).m, ids));
    s.rope_linear_factor = 8.0;
    EXPECT_GT(control(a, ids, make_checkpoint(s).m), kControl);
  }
  const Checkpoint ck = make_checkpoint(spec(2));
  ref::Options off;
  off.ignore_window = true;
  const std::vector<int> w(ids.begin(), ids.begin() + kWindow), w1(ids.begin(), ids.begin() + kWindow + 1);
  EXPECT_EQ(ref::forward(ck.m, w, off), ref::forward(ck.m, w));
  const ref::Vec a = ref::forward(ck.m, w1, off), b = ref::forward(ck.m, w1);
  EXPECT_TRUE(std::equal(a.begin(), a.begin() + kWindow * 80, b.begin()));
  EXPECT_GT(ref::rel_max_diff(ref::Vec(a.begin() + kWindow * 80, a.end()), ref::Vec(b.begin() + kWindow * 80, b.end())),
            1e-3);
}

// The tanh and erf GELUs differ by < 2e-4 where the GELU is not small (|x| < 2.5), too little to
// show through a random model's logits (the erf control moves them by ~4e-5 < kTol). They differ by
// 10-40 % relative on x in [-4, -3]: this checkpoint puts the MLP there. Every embedding row gets
// a constant 3 in dim 0 (x bf16(sqrt(hidden)) ≈ 32 in the stream, which keeps dim 0 of the
// pre-MLP norm's output near +5), each gate row reads dim 0 with weight -0.65 ± 0.05 and the other
// dims with a sixth of their weight, so most gate pre-activations sit in [-4, -3] (not deeper:
// 1 + tanh cancels in fp32 there); the post-MLP norm scales the small GeGLU output back up. The
// final norm's w[0] = -1 keeps the constant dim out of the tied head. (Measured: the erf control
// moves the logits by 1.5e-2 .. 1.8e-2.)
Checkpoint gelu_probe(uint32_t seed) {
  const hf::Spec s = spec(seed);
  hf::TensorMap w = hf::make_weights(s);
  std::mt19937 rng(seed);
  std::normal_distribution<double> g(0.0, 1.0);
  const int64_t D = s.hidden;
  for (int64_t v = 0; v < s.vocab; ++v) w.at("model.embed_tokens.weight").v[size_t(v * D)] = 3.0;
  w.at("model.norm.weight").v[0] = -1.0;
  for (int l = 0; l < s.layers; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    w.at(p + "pre_feedforward_layernorm.weight").v[0] = 0.0;
    hf::Tensor& gate = w.at(p + "mlp.gate_proj.weight");
    for (int64_t i = 0; i < s.inter; ++i)
      for (int64_t d = 0; d < D; ++d) {
        double& x = gate.v[size_t(i * D + d)];
        x = hf::bf16_round(d == 0 ? -0.65 + 0.05 * g(rng) : x / 6);
      }
  }
  Checkpoint ck{s, std::move(w), {}};
  ck.m = ref::from_hf(s, ck.w);
  return ck;
}

// Every feature of the reference changes the logits of the test's checkpoints by > 1e-2 (the exact
// sqrt(hidden) by > 5e-4), so the comparison with kvq below can see each one missing.
TEST(Gemma3Reference, EveryFeatureMatters) {
  for (uint32_t seed : {1u, 2u}) {
    hf::Spec s = spec(seed);
    s.rope_linear_factor = 8.0;
    const Checkpoint ck = make_checkpoint(s);
    const auto ids = prompt(kPrompt, s.vocab, 100 + seed);
    auto off = [&](void (*set)(ref::Options&)) {
      ref::Options o;
      set(o);
      return control(ck, ids, o);
    };
    struct Row {
      const char* what;
      double d, floor;
    };
    std::vector<Row> rows = {
        {"norms as w, not 1 + w", off([](ref::Options& o) { o.norm_as_w = true; }), kControl},
        {"global RoPE on the local layers", off([](ref::Options& o) { o.global_rope_on_local = true; }), kControl},
        {"local RoPE on the global layers", off([](ref::Options& o) { o.local_rope_on_global = true; }), kControl},
        {"linear factor on every layer", off([](ref::Options& o) { o.scale_rope_everywhere = true; }), kControl},
        {"window W + 1", off([](ref::Options& o) { o.window_plus_one = true; }), kControl},
        {"window W - 1", off([](ref::Options& o) { o.window_minus_one = true; }), kControl},
        {"no window", off([](ref::Options& o) { o.ignore_window = true; }), kControl},
        {"1/sqrt(head_dim)", off([](ref::Options& o) { o.scale_by_head_dim = true; }), kControl},
        {"q/k norms skipped", off([](ref::Options& o) { o.skip_qk_norm = true; }), kControl},
        {"sandwich norms skipped", off([](ref::Options& o) { o.skip_sandwich_norm = true; }), kControl},
        {"exact sqrt(hidden)", off([](ref::Options& o) { o.exact_embed_scale = true; }), kEmbedControl},
    };
    ref::Model other = ck.m;
    other.rope_linear_factor = 1.0;
    rows.push_back({"rope_scaling ignored", control(ck, ids, other), kControl});
    other = ck.m;
    other.embed_multiplier = 1.0;
    rows.push_back({"no embedding scale", control(ck, ids, other), kControl});
    other = ck.m;
    for (auto& L : other.layers) L.post_attn_norm.swap(L.ffn_norm);  // Llama's meaning of the name
    rows.push_back({"post_attention_layernorm as the pre-MLP norm", control(ck, ids, other), kControl});
    other = ck.m;
    for (size_t l = 0; l < other.layers.size(); ++l) {  // the rule off by one: l % 6 == 0 full
      other.layers[l].window = l % 6 ? kWindow : 0;
      other.layers[l].local_rope = l % 6 != 0;
    }
    rows.push_back({"layer types from l % 6", control(ck, ids, other), kControl});
    other = ck.m;
    for (double& e : other.lm_head) e *= ck.m.embed_multiplier;  // the head scaled like the input
    rows.push_back({"head x sqrt(hidden)", control(ck, ids, other), kControl});
    const Checkpoint probe = gelu_probe(seed);
    ref::Options erf;
    erf.erf_gelu = true;
    rows.push_back({"erf GELU (the GELU probe)", control(probe, ids, erf), kControl});
    for (const Row& r : rows) {
      std::cout << "[ info ] seed " << seed << " control '" << r.what << "': " << r.d << "\n";
      EXPECT_GT(r.d, r.floor) << r.what;
    }
  }
}

// ---------------------------------------------------------------- kvq against the reference

TEST(Gemma3, ConfigFields) {
  for (const std::string family : {"gemma3_text", "gemma3"}) {
    SCOPED_TRACE(family);
    Fixture f(spec(1, family));
    const ModelConfig& c = f.model.config();
    EXPECT_NE(c.architecture.find("gemma3"), std::string::npos) << c.architecture;
    EXPECT_EQ(c.hidden_size, 112);
    EXPECT_EQ(c.n_layers, kLayers);
    EXPECT_EQ(c.n_heads, 4);
    EXPECT_EQ(c.n_kv_heads, 2);
    EXPECT_EQ(c.head_dim, 32);
    EXPECT_EQ(c.intermediate_size, 160);
    EXPECT_EQ(c.vocab_size, 80);
    EXPECT_TRUE(c.tie_word_embeddings);
    EXPECT_EQ(c.bos_id, 2);
    EXPECT_EQ(c.eos_id, 1);
    EXPECT_EQ(c.layer_window, (std::vector<int>{kWindow, kWindow, kWindow, kWindow, kWindow, 0, kWindow}));
  }
}

struct Variant {
  const char* what;
  std::string family = "gemma3_text";
  std::string prefix = "language_model.model.";
  int layer_form = 0;  // 0: layer_types written; 1: none (default rule); 2: sliding_window_pattern 3;
                       // 3: layer_types unlike the rule (kvq must read the list)
  double linear = 0;
};

hf::Spec variant_spec(const Variant& v, uint32_t seed) {
  hf::Spec s = spec(seed, v.family);
  s.language_prefix = v.prefix;
  s.rope_linear_factor = v.linear;
  if (v.layer_form == 1) s.write_layer_types = false;
  if (v.layer_form == 2) {
    s.write_layer_types = false;
    s.write_sliding_window_pattern = true;
    s.sliding_window_pattern = 3;
  }
  if (v.layer_form == 3)
    s.layer_types = {"full_attention",    "sliding_attention", "sliding_attention", "full_attention",
                     "sliding_attention", "sliding_attention", "full_attention"};
  return s;
}

const std::vector<Variant>& variants() {
  static const std::vector<Variant> v = {
      {"text, layer_types", "gemma3_text", "", 0, 0},
      {"text, default layer types", "gemma3_text", "", 1, 0},
      {"text, sliding_window_pattern 3", "gemma3_text", "", 2, 0},
      {"text, layer_types unlike the rule", "gemma3_text", "", 3, 0},
      {"text, linear x8", "gemma3_text", "", 0, 8.0},
      {"text, default layer types, linear x8", "gemma3_text", "", 1, 8.0},
      {"gemma3 4.50 prefix", "gemma3", "language_model.model.", 0, 0},
      {"gemma3 4.50 prefix, linear x8, pattern", "gemma3", "language_model.model.", 2, 8.0},
      {"gemma3 v5 prefix", "gemma3", "model.language_model.", 1, 0},
      {"gemma3 v5 prefix, linear x8, odd types", "gemma3", "model.language_model.", 3, 8.0},
  };
  return v;
}

TEST(Gemma3, ForwardMatchesReference) {
  test::forward_matches_reference(variants(), variant_spec, prompt, kPrompt, kTol, "gemma3");
}

// The GELU probe (see gelu_probe): kvq's MLP is the tanh form.
TEST(Gemma3, GeluIsTheTanhForm) {
  const Checkpoint ck = gelu_probe(1);
  test::TempDir dir;
  hf::write_model(dir.str(), hf::make_config(ck.s), ck.w, 2);
  const Model m = Model::load(dir.str());
  for (uint32_t seed : {11u, 12u}) {
    const auto ids = prompt(kPrompt, ck.s.vocab, seed);
    const ref::Vec got = kvq_logits(m, ids), want = ref::forward(ck.m, ids);
    std::cout << "[ info ] gemma3 GELU probe max rel diff " << ref::rel_max_diff(got, want) << "\n";
    EXPECT_LT(ref::rel_max_diff(got, want), kTol);
    EXPECT_EQ(argmax_rows(got, ck.s.vocab), argmax_rows(want, ck.s.vocab));
  }
}

TEST(Gemma3, StreamedEqualsWholeAndGreedyMatches) {
  for (const Variant& v : {variants()[4], variants()[7], variants()[9]}) {
    SCOPED_TRACE(v.what);
    const hf::Spec s = variant_spec(v, 3);
    Fixture whole(s), streamed(s, true);
    const auto ids = prompt(kPrompt, s.vocab, 5);
    EXPECT_TRUE(at::equal(at::tensor(kvq_logits(whole.model, ids)), at::tensor(kvq_logits(streamed.model, ids))));
    EXPECT_LT(streamed.compare(ids), kTol);
    std::vector<int> a = prompt(5, s.vocab, 9), b = a;
    for (int step = 0; step < 2 * kWindow + 2; ++step) {  // past the window
      a.push_back(int(argmax_rows(kvq_logits(whole.model, a), s.vocab).back()));
      b.push_back(int(argmax_rows(ref::forward(whole.ck.m, b), s.vocab).back()));
    }
    EXPECT_EQ(a, b);
  }
}

// transformers 5 writes the RoPE per layer type: rope_parameters {"full_attention": {rope_type,
// factor, rope_theta}, "sliding_attention": {rope_type, rope_theta}} in place of rope_theta,
// rope_local_base_freq and rope_scaling. The same checkpoint under either form gives kvq's logits
// bit for bit. Both thetas are off the readers' defaults (1e4), so a field read from the wrong
// place shows. Negative controls (each must move the logits by > 1e-2): the linear factor left out
// of full_attention, the sliding_attention theta left out (the default 1e4).
TEST(Gemma3, RopeParametersFormEqualsTheClassicForm) {
  for (const std::string family : {"gemma3_text", "gemma3"}) {
    SCOPED_TRACE(family);
    hf::Spec s = spec(4, family);
    s.theta = 5e5;
    s.rope_local_theta = 100.0;  // far from the default, so the control below moves the logits
    s.rope_linear_factor = 8.0;
    const hf::TensorMap w = hf::make_weights(s);
    json classic = hf::make_config(s);
    ASSERT_EQ(text_fields(classic)["rope_scaling"], (json{{"rope_type", "linear"}, {"factor", 8.0}}));
    auto v5 = [&](const json& full, const json& sliding) {
      json cfg = classic;
      json& t = text_fields(cfg);
      for (const char* k : {"rope_theta", "rope_local_base_freq", "rope_scaling"}) EXPECT_EQ(t.erase(k), 1u) << k;
      t["rope_parameters"] = {{"full_attention", full}, {"sliding_attention", sliding}};
      return cfg;
    };
    const json full = {{"rope_type", "linear"}, {"factor", 8.0}, {"rope_theta", s.theta}};
    const json sliding = {{"rope_type", "default"}, {"rope_theta", s.rope_local_theta}};
    auto logits = [&](const json& cfg, const std::vector<int>& ids) {
      test::TempDir dir;
      hf::write_model(dir.str(), cfg, w, 2);
      return kvq_logits(Model::load(dir.str()), ids);
    };
    const ref::Model want = ref::from_hf(s, w);
    for (uint32_t seed : {21u, 22u}) {
      const auto ids = prompt(kPrompt, s.vocab, seed);
      const ref::Vec a = logits(classic, ids), b = logits(v5(full, sliding), ids);
      EXPECT_TRUE(a == b) << "rope_parameters form differs from the classic form by " << ref::rel_max_diff(b, a);
      const double to_ref = ref::rel_max_diff(a, ref::forward(want, ids));
      EXPECT_LT(to_ref, kTol);
      const double no_factor = ref::rel_max_diff(logits(v5({{"rope_type", "default"}, {"rope_theta", s.theta}}, sliding), ids), a);
      const double no_local = ref::rel_max_diff(logits(v5(full, {{"rope_type", "default"}}), ids), a);
      std::cout << "[ info ] gemma3 " << family << " rope_parameters form, prompt seed " << seed
                << ": max |classic - v5| " << ref::rel_max_diff(b, a) << ", classic vs reference " << to_ref
                << "; controls: factor left out " << no_factor << ", sliding rope_theta left out " << no_local << "\n";
      EXPECT_GT(no_factor, kControl);
      EXPECT_GT(no_local, kControl);
    }
  }
}

TEST(Gemma3, BadInputsRefusedInOneLine) {
  struct Case {
    json patch;  // merged into the text fields
    std::vector<std::string> parts;
  };
  const std::vector<Case> cases = {
      {{{"layer_types", json::array({"sliding_attention", "sliding_attention", "sliding_attention", "sliding_attention",
                                     "sliding_attention", "full_attention"})}},
       {"config.json", "layer_types"}},
      {{{"sliding_window", 0}}, {"config.json", "sliding_window"}},
      {{{"final_logit_softcapping", 30.0}}, {"config.json", "final_logit_softcapping"}},
      {{{"hidden_activation", "relu"}}, {"config.json", "hidden_activation", "relu"}},
  };
  for (const std::string family : {"gemma3_text", "gemma3"}) {
    const hf::Spec s = spec(1, family);
    const hf::TensorMap w = hf::make_weights(s);
    for (const Case& c : cases) {
      SCOPED_TRACE(family + " " + c.patch.dump());
      test::TempDir dir;
      json cfg = hf::make_config(s);
      text_fields(cfg).update(c.patch);
      hf::write_model(dir.str(), cfg, w, 2);
      test::expect_error([&] { Model::load(dir.str()); }, c.parts);
    }
    const std::string p = s.text_prefix() + "layers.3.";
    {
      SCOPED_TRACE(family + " q_norm [head_dim + 1]");
      hf::TensorMap bad = w;
      hf::Tensor& t = bad.at(p + "self_attn.q_norm.weight");
      t.shape = {s.head_dim + 1};
      t.v.push_back(0.0);
      test::TempDir dir;
      hf::write_model(dir.str(), hf::make_config(s), bad, 2);
      test::expect_error([&] { Model::load(dir.str()); }, {p + "self_attn.q_norm.weight"});
    }
    {
      SCOPED_TRACE(family + " no post_feedforward_layernorm");
      hf::TensorMap bad = w;
      bad.erase(p + "post_feedforward_layernorm.weight");
      test::TempDir dir;
      hf::write_model(dir.str(), hf::make_config(s), bad, 2);
      test::expect_error([&] { Model::load(dir.str()); }, {p + "post_feedforward_layernorm.weight"});
    }
  }
}

// ---------------------------------------------------------------- BF16 forward

// Gemma 3 in BF16. The BF16-emulated reference (bf16_bound.hpp) cannot be met to the other
// families' 1e-5 here: the emulation itself moves by up to ~1e-3 when its products are perturbed by
// 1e-6 relative (fp32 accumulation's size of error) before rounding — a few elements rounding the
// other way, amplified by the four (1 + w) norms per layer and the q/k norms. So, as for gpt_oss,
// the test measures that spread per prompt and holds kvq to it: kvq's distance to the emulation at
// most 3x the largest spread and its median at most 3x the spread's median; the plain reference is
// held to the roundoff bound and the floor; greedy ids equal; streamed = whole, bit for bit.
TEST(Bf16Forward, Gemma3MatchesTheEmulatedReferenceWithinItsOwnSpread) {
  using test::median;
  for (const Variant& v : {variants()[4], variants()[9]}) {
    SCOPED_TRACE(v.what);
    const hf::Spec s = variant_spec(v, 3);
    Fixture f(s, false, Precision::kBf16), streamed(s, true, Precision::kBf16);
    std::vector<std::vector<int>> prompts;
    for (uint32_t seed = 100; seed < 106; ++seed) prompts.push_back(prompt(14, s.vocab, seed));
    const test::Bf16Spread m = test::measure_bf16_spread(f.model, f.ck.m, prompts);
    const std::vector<double>& got_d = m.got;
    const std::vector<double>& spread = m.spread;
    const std::vector<double>& plain = m.plain;
    const double max_spread = *std::max_element(spread.begin(), spread.end());
    const double max_plain = *std::max_element(plain.begin(), plain.end());
    std::cout << "[ info ] gemma3 '" << v.what << "' BF16: kvq vs emulated median " << median(got_d) << " max "
              << *std::max_element(got_d.begin(), got_d.end()) << "; emulation's own spread median " << median(spread)
              << " max " << max_spread << "; plain reference median " << median(plain) << " max " << max_plain
              << " (bound " << test::bf16_logit_bound(s.layers) << ")\n";
    EXPECT_LE(*std::max_element(got_d.begin(), got_d.end()), 3 * max_spread);
    EXPECT_LE(median(got_d), 3 * median(spread));
    EXPECT_LT(max_plain, test::bf16_logit_bound(s.layers));
    EXPECT_GT(max_plain, test::kBf16Floor) << "BF16 is not in effect";
    const auto ids = prompt(kPrompt, s.vocab, 5);
    EXPECT_TRUE(at::equal(at::tensor(kvq_logits(f.model, ids)), at::tensor(kvq_logits(streamed.model, ids))));
    std::vector<int> a = prompt(5, s.vocab, 9), b = a;
    for (int step = 0; step < 8; ++step) {
      a.push_back(int(argmax_rows(kvq_logits(f.model, a), s.vocab).back()));
      b.push_back(int(argmax_rows(ref::forward(f.ck.m, b), s.vocab).back()));
    }
    EXPECT_EQ(a, b);
  }
}

}  // namespace
}  // namespace kvq
