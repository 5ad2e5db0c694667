// Qwen3.5 / Qwen3.6 (qwen3_5 dense, qwen3_5_moe): a hybrid decoder of Gated DeltaNet layers (no KV
// cache: a fixed-size state) and gated full-attention layers. A tiny checkpoint written here in the
// hub's multimodal layout (hf_tiny.hpp: text fields under text_config, tensors under
// model.language_model., beside model.visual.* and mtp.* tensors that must be ignored), kvq's fp32
// forward against hf_reference.hpp's float64 forward written from MODEL-FAMILIES-2026.md §1
// (transformers' modeling_qwen3_5.py / modular_qwen3_5_moe.py): (1 + w) RMSNorms (input,
// post_attention, final, q/k); no embedding scale; each layer's type from layer_types or the rule
// (l + 1) % full_attention_interval == 0 → full_attention. Full attention: q_proj rows per head
// [query (hd) | gate (hd)], q/k norms before RoPE, split-half RoPE over the first head_dim ·
// partial_rotary_factor dims, scale hd^-0.5, GQA, output x sigmoid(gate) before o_proj. Gated
// DeltaNet: in_proj_qkv → causal depthwise conv (kernel 4, zero left padding) → silu → split q, k,
// v; q/k L2-normed, q x dk^-0.5; value head j uses q/k head j / (Hv/Hk); beta = sigmoid(in_proj_b
// x), g = −exp(A_log) · softplus(in_proj_a x + dt_bias); per token S *= exp(g), δ = (v − Sᵀk) · beta,
// S += k ⊗ δ, o = Sᵀq; rmsnorm(o) · w · silu(in_proj_z x) (plain w); out_proj. MLP: SwiGLU; MoE:
// softmax over all experts, top-k, always renormalised, plus the shared expert x
// sigmoid(shared_expert_gate · x). kvq's layers are the KV layers: n_layers counts the
// full-attention layers, attn_layer_index maps them to decoder layers, captures name them.
// Tolerance as the other families: max |logit − reference| <= 1e-4 · max |reference logit| over
// prompts (BOS first) of ~20 tokens, greedy ids equal. Negative controls (each must move the
// reference by > 1e-2, so the comparison would see kvq doing it): the output gate left out, q/gate
// read as halves, RoPE pairing i with i + head_dim/2, RoPE over every dim, the decay after the delta
// update, the GDN output norm as (1 + w), the other norms as w, eps 1e-5 (kvq's default) for the
// config's 1e-6, value heads mapped modulo, the conv one token ahead or reversed, q and k swapped in
// the split, the silu after the conv / the L2 norm / the q scale / the z gate left out, the q/k norms
// skipped; MoE: the router not renormalised, the shared-expert gate or the shared expert left out.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <iostream>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "bf16_bound.hpp"
#include "family_test_util.hpp"
#include "hf_reference.hpp"
#include "hf_tiny.hpp"
#include "hybrid_test_util.hpp"
#include "kvq/model/capture.hpp"
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
constexpr int kLayers = 8;  // default rule (interval 4): full attention at 3 and 7, the rest DeltaNet
constexpr int kPrompt = 20;
constexpr int kBos = 3;
const std::string kPre = "model.language_model.";

// test::hybrid_spec's shape (head_dim 64 of which 16 rotate, GQA groups of 2, DeltaNet 2 q/k heads
// serving 4 value heads, dk = dv = 16) and scales; see there why lin_qk_overlap.
hf::Spec spec(uint32_t seed, const std::string& family = "qwen3_5") {
  return test::hybrid_spec(seed, family, kLayers, kBos);
}

// BOS, then seeded ids (never BOS again).
std::vector<int> prompt(int T, int vocab, uint32_t seed) { return test::bos_prompt(T, vocab, seed, kBos); }

using Shape = std::vector<int64_t>;

// ---------------------------------------------------------------- the test side's own checks
// (independent of kvq: they hold before kvq opens qwen3_5)

// The checkpoints as written: config nesting and keys, tensor names and shapes per layer type, the
// expert layouts, the tied head, the tensors a reader must ignore.
TEST(Qwen3_5Reference, CheckpointLayout) {
  {
    const hf::Spec s = spec(1);
    const json c = hf::make_config(s);
    EXPECT_EQ(c["model_type"], "qwen3_5");
    EXPECT_EQ(c["architectures"], json::array({"Qwen3_5ForConditionalGeneration"}));
    EXPECT_TRUE(c["vision_config"].is_object());
    EXPECT_FALSE(c.contains("num_hidden_layers"));
    EXPECT_FALSE(c.contains("hidden_size"));
    EXPECT_EQ(c["tie_word_embeddings"], false);
    const json& t = c["text_config"];
    EXPECT_EQ(t["model_type"], "qwen3_5_text");
    EXPECT_EQ(t["num_hidden_layers"], kLayers);
    EXPECT_EQ(t["hidden_size"], 64);
    EXPECT_EQ(t["num_attention_heads"], 4);
    EXPECT_EQ(t["num_key_value_heads"], 2);
    EXPECT_EQ(t["head_dim"], 64);
    EXPECT_EQ(t["intermediate_size"], 96);
    EXPECT_EQ(t["rms_norm_eps"], 1e-6);
    EXPECT_EQ(t["attention_bias"], false);
    EXPECT_EQ(t["tie_word_embeddings"], false);
    EXPECT_EQ(t["linear_conv_kernel_dim"], 4);
    EXPECT_EQ(t["linear_key_head_dim"], 16);
    EXPECT_EQ(t["linear_value_head_dim"], 16);
    EXPECT_EQ(t["linear_num_key_heads"], 2);
    EXPECT_EQ(t["linear_num_value_heads"], 4);
    EXPECT_EQ(t["full_attention_interval"], 4);
    const char* lin = "linear_attention";
    EXPECT_EQ(t["layer_types"], json::array({lin, lin, lin, "full_attention", lin, lin, lin, "full_attention"}));
    EXPECT_EQ(t["rope_parameters"], (json{{"rope_type", "default"},
                                          {"rope_theta", 1e6},
                                          {"partial_rotary_factor", 0.25},
                                          {"mrope_section", {3, 3, 2}},
                                          {"mrope_interleaved", true}}));
    EXPECT_FALSE(t.contains("rope_theta"));
    EXPECT_FALSE(t.contains("partial_rotary_factor"));
    EXPECT_FALSE(t.contains("num_experts"));

    const hf::TensorMap w = hf::make_weights(s);
    auto shape = [&](const std::string& n) { return w.count(n) ? w.at(n).shape : Shape{-1}; };
    EXPECT_EQ(shape(kPre + "embed_tokens.weight"), (Shape{80, 64}));
    EXPECT_EQ(shape(kPre + "norm.weight"), (Shape{64}));
    EXPECT_EQ(shape("lm_head.weight"), (Shape{80, 64}));
    const std::string a = kPre + "layers.3.self_attn.", g = kPre + "layers.2.linear_attn.";
    EXPECT_EQ(shape(a + "q_proj.weight"), (Shape{512, 64}));  // 4 heads x [query 64 | gate 64]
    EXPECT_EQ(shape(a + "k_proj.weight"), (Shape{128, 64}));
    EXPECT_EQ(shape(a + "v_proj.weight"), (Shape{128, 64}));
    EXPECT_EQ(shape(a + "o_proj.weight"), (Shape{64, 256}));
    EXPECT_EQ(shape(a + "q_norm.weight"), (Shape{64}));
    EXPECT_EQ(shape(a + "k_norm.weight"), (Shape{64}));
    EXPECT_EQ(w.count(a + "q_proj.bias"), 0u);
    EXPECT_EQ(shape(g + "in_proj_qkv.weight"), (Shape{128, 64}));
    EXPECT_EQ(shape(g + "in_proj_z.weight"), (Shape{64, 64}));
    EXPECT_EQ(shape(g + "in_proj_b.weight"), (Shape{4, 64}));
    EXPECT_EQ(shape(g + "in_proj_a.weight"), (Shape{4, 64}));
    EXPECT_EQ(shape(g + "conv1d.weight"), (Shape{128, 1, 4}));
    EXPECT_EQ(shape(g + "dt_bias"), (Shape{4}));
    EXPECT_EQ(shape(g + "A_log"), (Shape{4}));
    EXPECT_EQ(shape(g + "norm.weight"), (Shape{16}));
    EXPECT_EQ(shape(g + "out_proj.weight"), (Shape{64, 64}));
    for (int l = 0; l < kLayers; ++l) {  // one mixer per layer, by its type
      const std::string p = kPre + "layers." + std::to_string(l) + ".";
      const bool full = l == 3 || l == 7;
      EXPECT_EQ(w.count(p + "self_attn.q_proj.weight"), full ? 1u : 0u) << l;
      EXPECT_EQ(w.count(p + "linear_attn.in_proj_qkv.weight"), full ? 0u : 1u) << l;
      EXPECT_EQ(shape(p + "mlp.gate_proj.weight"), (Shape{96, 64})) << l;
      EXPECT_EQ(shape(p + "mlp.down_proj.weight"), (Shape{64, 96})) << l;
      EXPECT_EQ(shape(p + "input_layernorm.weight"), (Shape{64})) << l;
      EXPECT_EQ(shape(p + "post_attention_layernorm.weight"), (Shape{64})) << l;
    }
    EXPECT_EQ(w.count("model.layers.0.input_layernorm.weight"), 0u);
    // The tensors a reader must ignore are there.
    for (const char* n : {"model.visual.patch_embed.proj.weight", "model.visual.blocks.0.attn.qkv.weight",
                          "mtp.fc.weight", "mtp.norm.weight", "mtp.layers.0.input_layernorm.weight",
                          "mtp.layers.0.self_attn.q_proj.weight", "mtp.layers.0.mlp.gate_proj.weight"})
      EXPECT_EQ(w.count(n), 1u) << n;
    // (1 + w) norm weights are offsets centred on 0; the DeltaNet's output norm (plain w) sits near 1.
    double sum = 0, ss = 0, gsum = 0;
    int n = 0, gn = 0;
    for (const auto& [name, t] : w) {
      if (name.rfind(kPre, 0) != 0) continue;
      if (name.find("linear_attn.norm.") != std::string::npos) {
        for (double v : t.v) gsum += v, ++gn;
      } else if (name.find("layernorm") != std::string::npos || name.find("_norm.") != std::string::npos ||
                 name == kPre + "norm.weight") {
        for (double v : t.v) sum += v, ss += v * v, ++n;
      }
    }
    EXPECT_LT(std::abs(sum / n), 0.05);
    EXPECT_GT(std::sqrt(ss / n), 0.25);
    EXPECT_NEAR(gsum / gn, 1.0, 0.1);
  }
  {  // the MoE: fused experts by default; tied; classic RoPE keys; no layer_types
    hf::Spec s = spec(1, "qwen3_5_moe");
    s.tied = true;
    s.classic_rope = true;
    s.write_layer_types = false;
    const json c = hf::make_config(s);
    EXPECT_EQ(c["model_type"], "qwen3_5_moe");
    EXPECT_EQ(c["architectures"], json::array({"Qwen3_5MoeForConditionalGeneration"}));
    EXPECT_EQ(c["tie_word_embeddings"], true);
    const json& t = c["text_config"];
    EXPECT_EQ(t["model_type"], "qwen3_5_moe_text");
    EXPECT_EQ(t["tie_word_embeddings"], true);
    EXPECT_EQ(t["num_experts"], 8);
    EXPECT_EQ(t["num_experts_per_tok"], 2);
    EXPECT_EQ(t["moe_intermediate_size"], 32);
    EXPECT_EQ(t["shared_expert_intermediate_size"], 48);
    EXPECT_FALSE(t.contains("intermediate_size"));
    EXPECT_FALSE(t.contains("norm_topk_prob"));
    EXPECT_FALSE(t.contains("layer_types"));
    EXPECT_FALSE(t.contains("rope_parameters"));
    EXPECT_EQ(t["rope_theta"], 1e6);
    EXPECT_EQ(t["partial_rotary_factor"], 0.25);
    const hf::TensorMap w = hf::make_weights(s);
    auto shape = [&](const std::string& n) { return w.count(n) ? w.at(n).shape : Shape{-1}; };
    const std::string p = kPre + "layers.5.mlp.";
    EXPECT_EQ(shape(p + "gate.weight"), (Shape{8, 64}));
    EXPECT_EQ(shape(p + "experts.gate_up_proj"), (Shape{8, 64, 64}));  // [E, 2I, hidden]
    EXPECT_EQ(shape(p + "experts.down_proj"), (Shape{8, 64, 32}));     // [E, hidden, I]
    EXPECT_EQ(shape(p + "shared_expert.gate_proj.weight"), (Shape{48, 64}));
    EXPECT_EQ(shape(p + "shared_expert.up_proj.weight"), (Shape{48, 64}));
    EXPECT_EQ(shape(p + "shared_expert.down_proj.weight"), (Shape{64, 48}));
    EXPECT_EQ(shape(p + "shared_expert_gate.weight"), (Shape{1, 64}));
    EXPECT_EQ(w.count(p + "experts.0.gate_proj.weight"), 0u);
    EXPECT_EQ(w.count(p + "gate_proj.weight"), 0u);
    EXPECT_EQ(w.count("lm_head.weight"), 0u);
    for (const char* n : {"mtp.layers.0.mlp.gate.weight", "mtp.layers.0.mlp.experts.0.gate_proj.weight",
                          "mtp.layers.0.mlp.experts.0.down_proj.weight", "model.visual.merger.linear_fc1.weight"})
      EXPECT_EQ(w.count(n), 1u) << n;

    // Per-expert keys: the same values re-filed (gate = rows [0, I) of gate_up, up = rows [I, 2I)).
    hf::Spec k = s;
    k.per_expert_keys = true;
    const hf::TensorMap x = hf::make_weights(k);
    EXPECT_EQ(x.count(p + "experts.gate_up_proj"), 0u);
    EXPECT_EQ(x.count(p + "experts.down_proj"), 0u);
    const hf::Tensor& gu = w.at(p + "experts.gate_up_proj");
    for (int e : {0, 7}) {
      const std::string q = p + "experts." + std::to_string(e) + ".";
      ASSERT_EQ(x.at(q + "gate_proj.weight").shape, (Shape{32, 64}));
      ASSERT_EQ(x.at(q + "up_proj.weight").shape, (Shape{32, 64}));
      ASSERT_EQ(x.at(q + "down_proj.weight").shape, (Shape{64, 32}));
      EXPECT_EQ(x.at(q + "gate_proj.weight").v[5], gu.v[size_t(e) * 64 * 64 + 5]);
      EXPECT_EQ(x.at(q + "up_proj.weight").v[5], gu.v[size_t(e) * 64 * 64 + 32 * 64 + 5]);
      EXPECT_EQ(x.at(q + "down_proj.weight").v[70], w.at(p + "experts.down_proj").v[size_t(e) * 64 * 32 + 70]);
    }
    const auto ids = prompt(12, s.vocab, 4);
    EXPECT_EQ(ref::forward(ref::from_hf(k, x), ids), ref::forward(ref::from_hf(s, w), ids));
    // Every text tensor other than the experts has the same values under either layout.
    for (const auto& [name, t] : w) {
      if (name.find(".experts.") == std::string::npos) {
        EXPECT_EQ(x.at(name).v, t.v) << name;
      }
    }
  }
  {  // one seed, one set of weights: tied drops lm_head only; the rope form changes no tensor
    hf::Spec a = spec(2), b = spec(2);
    b.tied = true;
    b.classic_rope = true;
    const hf::TensorMap wa = hf::make_weights(a), wb = hf::make_weights(b);
    for (const auto& [name, t] : wb) EXPECT_EQ(wa.at(name).v, t.v) << name;
    EXPECT_EQ(wa.size(), wb.size() + 1);
  }
}

// configuration_qwen3_5.py __post_init__: without layer_types, layer l is "linear_attention" if
// (l + 1) % full_attention_interval else "full_attention". The written list is that rule's; the
// reference's attention layers (kvq's KV layers) follow it, and so do the tensors.
TEST(Qwen3_5Reference, DefaultLayerTypesRule) {
  hf::Spec s = spec(1);
  s.write_layer_types = false;
  const json c = hf::make_config(s);
  EXPECT_FALSE(c["text_config"].contains("layer_types"));
  EXPECT_EQ(c["text_config"]["full_attention_interval"], 4);
  std::vector<std::string> types;
  for (int l = 0; l < kLayers; ++l) types.push_back(s.layer_type(l));
  EXPECT_EQ(json(types), hf::make_config(spec(1))["text_config"]["layer_types"]);
  EXPECT_EQ(make_checkpoint(s).m.attn_layers(), (std::vector<int>{3, 7}));
  s.full_attention_interval = 3;
  EXPECT_EQ(hf::make_config(s)["text_config"]["full_attention_interval"], 3);
  EXPECT_EQ(make_checkpoint(s).m.attn_layers(), (std::vector<int>{2, 5}));
  const hf::TensorMap w = hf::make_weights(s);
  EXPECT_EQ(w.count(kPre + "layers.5.self_attn.o_proj.weight"), 1u);
  EXPECT_EQ(w.count(kPre + "layers.3.linear_attn.out_proj.weight"), 1u);
  EXPECT_EQ(w.count(kPre + "layers.3.self_attn.o_proj.weight"), 0u);
  // A written list wins over the rule.
  s.write_layer_types = true;
  s.layer_types = {"full_attention",   "linear_attention", "linear_attention", "full_attention",
                   "linear_attention", "linear_attention", "linear_attention", "full_attention"};
  EXPECT_EQ(make_checkpoint(s).m.attn_layers(), (std::vector<int>{0, 3, 7}));
  EXPECT_EQ(hf::make_config(s)["text_config"]["layer_types"][0], "full_attention");
}

// The causal depthwise conv (§1.4 step 1): out_t = silu(Σ_j W[j] · m_{t-3+j}), zero left padding, tap
// 3 on the current token. One channel, W = (1, 2, 3, 4), m = (1, 10, 100):
//   t0: 4·1 = 4;  t1: 3·1 + 4·10 = 43;  t2: 2·1 + 3·10 + 4·100 = 432   (then silu).
// A second channel (W = (0.5, 0, 0, -1), m = (2, -3, 5)) keeps its own taps: -2, 3, -5.
TEST(Qwen3_5Reference, CausalConvByHand) {
  const ref::Vec m = {1, 2, 10, -3, 100, 5};  // [T = 3][C = 2]
  const ref::Vec W = {1, 2, 3, 4, 0.5, 0, 0, -1};
  ref::Options raw;
  raw.skip_conv_silu = true;
  EXPECT_EQ(ref::detail::causal_conv_silu(m, W, 3, 2, 4, raw), (ref::Vec{4, -2, 43, 3, 432, -5}));
  const ref::Vec y = ref::detail::causal_conv_silu(m, W, 3, 2, 4);
  EXPECT_DOUBLE_EQ(y[0], 4 / (1 + std::exp(-4.0)));
  EXPECT_DOUBLE_EQ(y[3], 3 / (1 + std::exp(-3.0)));
  EXPECT_DOUBLE_EQ(y[5], -5 / (1 + std::exp(5.0)));
  // The controls: taps reversed (tap 0 on the current token: t2 = 3·1 + 2·10 + 1·100 = 123), one
  // token ahead (t0 = 3·1 + 4·10 = 43).
  raw.conv_reversed = true;
  EXPECT_EQ(ref::detail::causal_conv_silu(m, W, 3, 2, 4, raw)[4], 123);
  raw.conv_reversed = false;
  raw.conv_ahead = true;
  EXPECT_EQ(ref::detail::causal_conv_silu(m, W, 3, 2, 4, raw)[0], 43);
}

// One value head, two tokens, dk = dv = 2, worked by hand (§1.4 steps 4-5):
//   q1 = (2, 0) → L2 (1, 0) → x 2^-1/2;  k1 = (1, 0);  v1 = (2, 4);  beta1 = 0.5;  exp(g1) = 0.5
//     S = 0.5 · 0 = 0;  kv_mem = 0;  δ = (2, 4) · 0.5 = (1, 2);  S = k1 ⊗ δ = [[1, 2], [0, 0]]
//     o1 = Sᵀ q1 = (1, 2) / √2
//   q2 = (0, 3) → (0, 1) / √2;  k2 = (3, 4) → (0.6, 0.8);  v2 = (1, -1);  beta2 = 0.8;  exp(g2) = 0.8
//     S = 0.8 S = [[0.8, 1.6], [0, 0]];  kv_mem = Sᵀ k2 = (0.48, 0.96)
//     δ = ((1, -1) − (0.48, 0.96)) · 0.8 = (0.416, -1.568)
//     S += k2 ⊗ δ = [[0.8 + 0.2496, 1.6 − 0.9408], [0.3328, −1.2544]]
//     o2 = Sᵀ q2 = (0.3328, −1.2544) / √2
// (the L2 norm's eps 1e-6 under the root moves these by < 1e-6). With the decay after the update
// instead: o1 = 0.5 · (1, 2) / √2.
TEST(Qwen3_5Reference, DeltaNetStepByHand) {
  const ref::Vec q = {2, 0, 0, 3}, k = {1, 0, 3, 4}, v = {2, 4, 1, -1}, g = {std::log(0.5), std::log(0.8)},
                 beta = {0.5, 0.8};
  const double r2 = std::sqrt(2.0);
  const ref::Vec o = ref::detail::gated_delta_rule(q, k, v, g, beta, 2, 1, 1, 2, 2);
  ASSERT_EQ(o.size(), 4u);
  EXPECT_NEAR(o[0], 1 / r2, 1e-6);
  EXPECT_NEAR(o[1], 2 / r2, 1e-6);
  EXPECT_NEAR(o[2], 0.3328 / r2, 1e-6);
  EXPECT_NEAR(o[3], -1.2544 / r2, 1e-6);
  ref::Options after;
  after.decay_after_update = true;
  const ref::Vec oa = ref::detail::gated_delta_rule(q, k, v, g, beta, 2, 1, 1, 2, 2, after);
  EXPECT_NEAR(oa[0], 0.5 / r2, 1e-6);
  EXPECT_NEAR(oa[1], 1 / r2, 1e-6);
  ref::Options unscaled;
  unscaled.drop_q_scale = true;
  EXPECT_NEAR(ref::detail::gated_delta_rule(q, k, v, g, beta, 2, 1, 1, 2, 2, unscaled)[3], -1.2544, 1e-6);

  // Grouped heads: Hk = 2 q/k heads, Hv = 4 value heads; value head j uses q/k head j / 2 (HF
  // repeat_interleave), so each value head equals the one-head rule on its own q/k head.
  std::mt19937 rng(5);
  std::normal_distribution<double> n(0.0, 1.0);
  const int T = 5, Hk = 2, Hv = 4, d = 3;
  ref::Vec Q(T * Hk * d), K(T * Hk * d), Vv(T * Hv * d), G(T * Hv), B(T * Hv);
  for (ref::Vec* x : {&Q, &K, &Vv}) for (double& e : *x) e = n(rng);
  for (double& e : G) e = -std::abs(n(rng));
  for (double& e : B) e = 1 / (1 + std::exp(-n(rng)));
  for (bool modulo : {false, true}) {
    ref::Options o;
    o.v_head_modulo = modulo;
    const ref::Vec all = ref::detail::gated_delta_rule(Q, K, Vv, G, B, T, Hk, Hv, d, d, o);
    for (int j = 0; j < Hv; ++j) {
      const int kh = modulo ? j % Hk : j / 2;
      ref::Vec q1, k1, v1, g1, b1;
      for (int t = 0; t < T; ++t) {
        for (int i = 0; i < d; ++i) {
          q1.push_back(Q[size_t((t * Hk + kh) * d + i)]);
          k1.push_back(K[size_t((t * Hk + kh) * d + i)]);
          v1.push_back(Vv[size_t((t * Hv + j) * d + i)]);
        }
        g1.push_back(G[size_t(t * Hv + j)]);
        b1.push_back(B[size_t(t * Hv + j)]);
      }
      const ref::Vec one = ref::detail::gated_delta_rule(q1, k1, v1, g1, b1, T, 1, 1, d, d);
      for (int t = 0; t < T; ++t)
        for (int i = 0; i < d; ++i)
          EXPECT_EQ(all[size_t((t * Hv + j) * d + i)], one[size_t(t * d + i)]) << "head " << j << " t " << t;
    }
  }
}

// The reference is causal: a prefix's logits are the full prompt's first rows, bit for bit (the
// conv, the recurrence and the attention read no later token).
TEST(Qwen3_5Reference, IsCausal) {
  for (const std::string family : {"qwen3_5", "qwen3_5_moe"}) {
    const Checkpoint ck = make_checkpoint(spec(3, family));
    const auto ids = prompt(kPrompt, ck.s.vocab, 9);
    const ref::Vec all = ref::forward(ck.m, ids);
    for (int t : {1, 2, 7, 13}) {
      const ref::Vec pre = ref::forward(ck.m, std::vector<int>(ids.begin(), ids.begin() + t));
      EXPECT_TRUE(std::equal(pre.begin(), pre.end(), all.begin())) << family << " prefix " << t;
    }
  }
}

// Every feature of the reference changes the logits of the test's checkpoints by > 1e-2, so the
// comparison with kvq below can see each one missing.
TEST(Qwen3_5Reference, EveryFeatureMatters) {
  for (const std::string family : {"qwen3_5", "qwen3_5_moe"})
    for (uint32_t seed : {1u, 2u}) {
      const Checkpoint ck = make_checkpoint(spec(seed, family));
      const auto ids = prompt(kPrompt, ck.s.vocab, 100 + seed);
      struct Row {
        const char* what;
        std::function<void(ref::Options&)> set;
      };
      const std::vector<Row> rows = {
          {"output gate left out", [](ref::Options& o) { o.skip_output_gate = true; }},
          {"q/gate as halves", [](ref::Options& o) { o.gate_halves = true; }},
          {"RoPE pairs i with i + head_dim/2", [](ref::Options& o) { o.rope_pair_half_head = true; }},
          {"norms as w, not 1 + w", [](ref::Options& o) { o.norm_as_w = true; }},
          {"q/k norms skipped", [](ref::Options& o) { o.skip_qk_norm = true; }},
          {"decay after the delta update", [](ref::Options& o) { o.decay_after_update = true; }},
          {"GDN output norm as 1 + w", [](ref::Options& o) { o.gdn_norm_one_plus_w = true; }},
          {"value head -> q/k head modulo", [](ref::Options& o) { o.v_head_modulo = true; }},
          {"conv one token ahead", [](ref::Options& o) { o.conv_ahead = true; }},
          {"conv taps reversed", [](ref::Options& o) { o.conv_reversed = true; }},
          {"no silu after the conv", [](ref::Options& o) { o.skip_conv_silu = true; }},
          {"q/k L2 norm left out", [](ref::Options& o) { o.skip_l2norm = true; }},
          {"q and k swapped in the split", [](ref::Options& o) { o.swap_qk_split = true; }},
          {"q scale dk^-0.5 left out", [](ref::Options& o) { o.drop_q_scale = true; }},
          {"silu(z) gate left out", [](ref::Options& o) { o.skip_z_gate = true; }},
      };
      std::vector<std::pair<std::string, double>> d;
      for (const Row& r : rows) {
        ref::Options o;
        r.set(o);
        d.emplace_back(r.what, control(ck, ids, o));
      }
      ref::Model other = ck.m;  // RoPE over the whole head instead of head_dim · 0.25
      other.inv_freq = ref::default_inv_freq(ck.s.theta, ck.s.head_dim);
      d.emplace_back("RoPE over every dim", control(ck, ids, other));
      other = ck.m;
      other.eps = 1e-5;  // kvq's ModelConfig default: rms_norm_eps must be read
      d.emplace_back("eps 1e-5 instead of the config's 1e-6", control(ck, ids, other));
      if (family == "qwen3_5_moe") {
        ref::Options o;
        o.flip_norm_topk_prob = true;
        d.emplace_back("router not renormalised", control(ck, ids, o));
        o = {};
        o.drop_shared_gate = true;
        d.emplace_back("shared-expert gate left out", control(ck, ids, o));
        other = ck.m;
        for (auto& L : other.layers) L.shared.gate.clear();
        d.emplace_back("shared expert left out", control(ck, ids, other));
      }
      for (const auto& [what, x] : d) {
        std::cout << "[ info ] " << family << " seed " << seed << " control '" << what << "': " << x << "\n";
        EXPECT_GT(x, kControl) << family << " seed " << seed << ": " << what;
      }
    }
}

// ---------------------------------------------------------------- kvq against the reference

// kvq's layers are the layers with a KV cache: n_layers counts the full-attention layers,
// attn_layer_index names their decoder layers, n_decoder_layers counts them all.
TEST(Qwen3_5, ConfigFields) {
  {
    hf::Spec s = spec(1);
    s.write_layer_types = false;
    s.head_dim = 256;  // Qwen3.5's: 64 of it rotating
    Fixture f(s);
    const ModelConfig& c = f.model.config();
    EXPECT_NE(c.architecture.find("qwen3_5"), std::string::npos) << c.architecture;
    EXPECT_EQ(c.hidden_size, 64);
    EXPECT_EQ(c.n_layers, 2);
    EXPECT_EQ(c.n_decoder_layers, kLayers);
    EXPECT_EQ(c.attn_layer_index, (std::vector<int>{3, 7}));
    EXPECT_EQ(c.n_heads, 4);
    EXPECT_EQ(c.n_kv_heads, 2);
    EXPECT_EQ(c.head_dim, 256);
    EXPECT_EQ(c.rotary_dim, 64);
    EXPECT_EQ(c.pairing, RopePairing::kSplitHalf);
    EXPECT_DOUBLE_EQ(c.rope_theta, 1e6);
    EXPECT_DOUBLE_EQ(c.rms_norm_eps, 1e-6);
    EXPECT_FALSE(c.qkv_bias);
    EXPECT_FALSE(c.tie_word_embeddings);
    EXPECT_EQ(c.intermediate_size, 96);
    EXPECT_EQ(c.vocab_size, 80);
    EXPECT_EQ(c.n_experts, 0);
    EXPECT_EQ(c.bos_id, kBos);
    EXPECT_EQ(c.eos_id, 1);
    EXPECT_LT(f.compare(prompt(12, s.vocab, 2)), kTol);
  }
  {
    hf::Spec s = spec(1, "qwen3_5_moe");
    s.tied = true;
    s.layer_types = {"full_attention",   "linear_attention", "linear_attention", "full_attention",
                     "linear_attention", "linear_attention", "linear_attention", "full_attention"};
    Fixture f(s);
    const ModelConfig& c = f.model.config();
    EXPECT_NE(c.architecture.find("qwen3_5_moe"), std::string::npos) << c.architecture;
    EXPECT_EQ(c.n_layers, 3);
    EXPECT_EQ(c.n_decoder_layers, kLayers);
    EXPECT_EQ(c.attn_layer_index, (std::vector<int>{0, 3, 7}));
    EXPECT_EQ(c.head_dim, 64);
    EXPECT_EQ(c.rotary_dim, 16);
    EXPECT_TRUE(c.tie_word_embeddings);
    EXPECT_EQ(c.n_experts, 8);
    EXPECT_EQ(c.n_experts_per_tok, 2);
    EXPECT_EQ(c.moe_intermediate_size, 32);
    EXPECT_TRUE(c.norm_topk_prob);  // Qwen3.5-MoE always renormalises (the key is gone)
    for (int d = 0; d < kLayers; ++d) EXPECT_TRUE(c.is_moe_layer(d)) << "decoder layer " << d;
  }
}

// The checkpoints kvq must read alike: {what, family, tied, layer_types written (else the default
// rule), classic RoPE keys (else rope_parameters), per-expert keys (else fused), layer_types unlike
// the rule, linear key heads (of 4 value heads)}.
struct Variant {
  const char* what;
  std::string family = "qwen3_5";
  bool tied = false, write_layer_types = true, classic_rope = false, per_expert_keys = false, odd_types = false;
  int lin_k_heads = 2;  // of 4 value heads
};

hf::Spec variant_spec(const Variant& v, uint32_t seed) {
  hf::Spec s = spec(seed, v.family);
  s.tied = v.tied;
  s.write_layer_types = v.write_layer_types;
  s.classic_rope = v.classic_rope;
  s.per_expert_keys = v.per_expert_keys;
  s.lin_k_heads = v.lin_k_heads;
  if (v.odd_types)  // unlike the rule: kvq must read the list
    s.layer_types = {"full_attention",   "linear_attention", "linear_attention", "full_attention",
                     "linear_attention", "full_attention",   "linear_attention", "linear_attention"};
  return s;
}

const std::vector<Variant>& variants() {
  static const std::vector<Variant> v = {
      {"dense, untied, layer_types, v5 rope", "qwen3_5", false, true, false, false, false, 2},
      {"dense, tied, default rule", "qwen3_5", true, false, false, false, false, 2},
      {"dense, classic rope keys", "qwen3_5", false, true, true, false, false, 2},
      {"dense, key heads = value heads", "qwen3_5", true, true, false, false, false, 4},
      {"dense, layer_types unlike the rule", "qwen3_5", false, true, false, false, true, 2},
      {"moe, fused experts, layer_types", "qwen3_5_moe", false, true, false, false, false, 2},
      {"moe, per-expert keys, default rule, classic rope", "qwen3_5_moe", false, false, true, true, false, 2},
      {"moe, tied, key heads = value heads, odd types", "qwen3_5_moe", true, true, false, false, true, 4},
  };
  return v;
}

TEST(Qwen3_5, ForwardMatchesReference) {
  test::forward_matches_reference(variants(), variant_spec, prompt, kPrompt, kTol, "qwen3_5");
}

TEST(Qwen3_5, StreamedEqualsWholeAndGreedyMatches) {
  for (const Variant& v : {variants()[1], variants()[6], variants()[7]}) {
    SCOPED_TRACE(v.what);
    const hf::Spec s = variant_spec(v, 3);
    test::expect_streamed_equals_whole_and_greedy(s, prompt(kPrompt, s.vocab, 5), prompt(5, s.vocab, 9), kTol);
  }
}

// The two expert layouts of one checkpoint (fused [E, 2I, D] / [E, D, I] tensors, per-expert keys)
// hold the same values: kvq's logits agree bit for bit, whole and streamed.
TEST(Qwen3_5, ExpertLayoutsGiveTheSameLogits) {
  hf::Spec fused = spec(5, "qwen3_5_moe"), split = fused;
  split.per_expert_keys = true;
  const auto ids = prompt(kPrompt, fused.vocab, 21);
  for (bool stream : {false, true}) {
    SCOPED_TRACE(stream ? "streamed" : "whole");
    Fixture a(fused, stream), b(split, stream);
    EXPECT_EQ(kvq_logits(a.model, ids), kvq_logits(b.model, ids));
  }
}

// transformers 5 writes the RoPE as rope_parameters {rope_type, rope_theta, partial_rotary_factor,
// mrope_section, mrope_interleaved}; older converters the top-level rope_theta and
// partial_rotary_factor. Without partial_rotary_factor anywhere, Qwen3_5TextConfig.__post_init__
// sets 0.25 (kwargs.setdefault("partial_rotary_factor", 0.25), which convert_rope_params_to_dict
// then copies into rope_parameters). The same weights under each form give kvq's logits bit for
// bit. Controls (each must move them by > 1e-2): partial_rotary_factor 0.5, rope_theta 1e4.
TEST(Qwen3_5, RopeFormsGiveTheSameLogits) {
  const hf::Spec s = spec(4);
  const hf::TensorMap w = hf::make_weights(s);
  const json v5 = hf::make_config(s);
  json classic = v5, bare = v5, half = v5, theta = v5;
  {
    json& t = classic["text_config"];
    t.erase("rope_parameters");
    t["rope_theta"] = s.theta;
    t["partial_rotary_factor"] = s.partial_rotary_factor;
  }
  bare["text_config"]["rope_parameters"].erase("partial_rotary_factor");
  half["text_config"]["rope_parameters"]["partial_rotary_factor"] = 0.5;
  theta["text_config"]["rope_parameters"]["rope_theta"] = 1e4;
  auto logits = [&](const json& cfg, const std::vector<int>& ids) {
    test::TempDir dir;
    hf::write_model(dir.str(), cfg, w, 2);
    return kvq_logits(Model::load(dir.str()), ids);
  };
  const ref::Model want = ref::from_hf(s, w);
  for (uint32_t seed : {21u, 22u}) {
    const auto ids = prompt(kPrompt, s.vocab, seed);
    const ref::Vec a = logits(v5, ids);
    EXPECT_LT(ref::rel_max_diff(a, ref::forward(want, ids)), kTol);
    EXPECT_TRUE(a == logits(classic, ids)) << "classic keys differ from rope_parameters";
    EXPECT_TRUE(a == logits(bare, ids)) << "partial_rotary_factor absent: 0.25";
    const double dh = ref::rel_max_diff(logits(half, ids), a), dt = ref::rel_max_diff(logits(theta, ids), a);
    std::cout << "[ info ] qwen3_5 rope forms, prompt seed " << seed << ": controls partial 0.5 " << dh
              << ", theta 1e4 " << dt << "\n";
    EXPECT_GT(dh, kControl);
    EXPECT_GT(dt, kControl);
  }
}

// Qwen3.5-0.8B ties its embeddings and says so at the multimodal config's top level: a text_config
// without the key takes the top level's; one with the key keeps its own (here false: lm_head is absent,
// so the load must fail naming it).
TEST(Qwen3_5, TieWordEmbeddingsFromTheTopLevel) {
  hf::Spec s = spec(6);
  s.tied = true;
  const hf::TensorMap w = hf::make_weights(s);
  ASSERT_EQ(w.count("lm_head.weight"), 0u);
  json cfg = hf::make_config(s);
  cfg["text_config"].erase("tie_word_embeddings");
  cfg["tie_word_embeddings"] = true;
  const auto ids = prompt(kPrompt, s.vocab, 61);
  {
    test::TempDir dir;
    hf::write_model(dir.str(), cfg, w, 2);
    EXPECT_LT(ref::rel_max_diff(kvq_logits(Model::load(dir.str()), ids), ref::forward(ref::from_hf(s, w), ids)), kTol);
  }
  cfg["text_config"]["tie_word_embeddings"] = false;
  test::TempDir dir;
  hf::write_model(dir.str(), cfg, w, 2);
  test::expect_error([&] { Model::load(dir.str()); }, {"lm_head.weight"});
}

// The official -FP8 repos: DeepSeek-style 128x128 block FP8 (here 16x12 blocks, so both edges are
// partial) on every projection, the Gated DeltaNet's fused in_proj_* included; the conv, norms,
// dt_bias / A_log and the embedding stay BF16; quantization_config at the multimodal config's top
// level. The reference runs on the dequantized weights; the BF16 weights before quantizing miss.
TEST(Qwen3_5, Fp8BlockCheckpointMatchesReference) {
  const hf::Spec s = spec(7);
  hf::TensorMap w = hf::make_weights(s);
  auto pick = [](const std::string& n) {
    auto ends = [&](const std::string& tail) {
      return n.size() > tail.size() && n.compare(n.size() - tail.size(), tail.size(), tail) == 0;
    };
    return n.rfind("model.language_model.", 0) == 0 && (ends("_proj.weight") || n.find(".in_proj_") != std::string::npos);
  };
  hf::quantize_fp8_blocks(w, 16, 12, pick);
  int n_fp8 = 0;
  for (const auto& [name, t] : w) n_fp8 += t.dtype == "F8_E4M3";
  EXPECT_EQ(w.at("model.language_model.layers.0.linear_attn.in_proj_qkv.weight").dtype, "F8_E4M3");
  EXPECT_EQ(w.at("model.language_model.layers.0.linear_attn.conv1d.weight").dtype, "BF16");
  json cfg = hf::make_config(s);
  cfg["quantization_config"] = {{"quant_method", "fp8"}, {"fmt", "e4m3"}, {"activation_scheme", "dynamic"},
                                {"weight_block_size", {16, 12}}};
  test::TempDir dir;
  hf::write_model(dir.str(), cfg, w, 3);
  const ref::Model want = ref::from_hf(s, w), plain = ref::from_hf(s, hf::make_weights(s));
  for (const bool stream : {false, true}) {
    Model::LoadOptions lo;
    lo.stream = stream;
    const Model m = Model::load(dir.str(), lo);
    const auto ids = prompt(kPrompt, s.vocab, 71);
    const ref::Vec got = kvq_logits(m, ids);
    const double d = ref::rel_max_diff(got, ref::forward(want, ids)), d_plain = ref::rel_max_diff(got, ref::forward(plain, ids));
    std::cout << "[ info ] qwen3_5 FP8 blocks (" << n_fp8 << " tensors" << (stream ? ", streamed" : "") << "): " << d
              << ", against the unquantized weights " << d_plain << "\n";
    EXPECT_LT(d, kTol);
    EXPECT_EQ(argmax_rows(got, s.vocab), argmax_rows(ref::forward(want, ids), s.vocab));
    EXPECT_GT(d_plain, 1e-3);
  }
}

// kvq's captures name its KV layers: the observer sees n_layers layers, layer l being decoder layer
// attn_layer_index[l], with the query heads' pre-RoPE q after q_norm (not the gate rows), the
// pre-RoPE k after k_norm and v, as the reference's trace of that attention layer has them.
TEST(Qwen3_5, CapturesAreTheAttentionLayers) {
  for (const Variant& v : {variants()[0], variants()[7]}) {
    SCOPED_TRACE(v.what);
    Fixture f(variant_spec(v, 2));
    const auto ids = prompt(12, f.ck.s.vocab, 3);
    ASSERT_NO_FATAL_FAILURE(test::expect_captures_are_attention_layers(f, ids, kTol));
  }
}

TEST(Qwen3_5, BadInputsRefusedInOneLine) {
  struct Case {
    json patch;  // merged into text_config
    std::vector<std::string> parts;
  };
  const json seven = json::array({"linear_attention", "linear_attention", "linear_attention", "full_attention",
                                  "linear_attention", "linear_attention", "full_attention"});
  json mamba = hf::make_config(spec(1))["text_config"]["layer_types"];
  mamba[5] = "mamba";
  json none = json::array();
  for (int l = 0; l < kLayers; ++l) none.push_back("linear_attention");
  const std::vector<Case> cases = {
      {{{"layer_types", seven}}, {"config.json", "layer_types"}},
      {{{"layer_types", mamba}}, {"config.json", "layer_types", "mamba"}},
      {{{"linear_num_value_heads", 3}}, {"config.json", "linear_num_value_heads"}},
      {{{"layer_types", none}}, {"config.json", "layer_types"}},
  };
  for (const std::string family : {"qwen3_5", "qwen3_5_moe"}) {
    const hf::Spec s = spec(1, family);
    const hf::TensorMap w = hf::make_weights(s);
    for (const Case& c : cases) {
      SCOPED_TRACE(family + " " + c.patch.dump());
      test::TempDir dir;
      json cfg = hf::make_config(s);
      cfg["text_config"].update(c.patch);
      hf::write_model(dir.str(), cfg, w, 2);
      test::expect_error([&] { Model::load(dir.str()); }, c.parts);
    }
    {
      const std::string n = kPre + "layers.1.linear_attn.A_log";
      SCOPED_TRACE(family + " no " + n);
      hf::TensorMap bad = w;
      bad.erase(n);
      test::TempDir dir;
      hf::write_model(dir.str(), hf::make_config(s), bad, 2);
      test::expect_error([&] { Model::load(dir.str()); }, {n});
    }
    {
      const std::string n = kPre + "layers.2.linear_attn.conv1d.weight";
      SCOPED_TRACE(family + " " + n + " [conv_dim, 1, 3]");
      hf::TensorMap bad = w;
      hf::Tensor& t = bad.at(n);
      t.shape = {t.shape[0], 1, 3};
      t.v.resize(size_t(t.shape[0]) * 3);
      test::TempDir dir;
      hf::write_model(dir.str(), hf::make_config(s), bad, 2);
      test::expect_error([&] { Model::load(dir.str()); }, {n});
    }
  }
}

// ---------------------------------------------------------------- BF16 forward

// Qwen3.5 in BF16. The Gated DeltaNet makes this forward chaotic under BF16 roundoff: its output
// norm rescales o = Sᵀq, a small sum (mean o² ~ 1e-4 here), so a relative rounding error in its
// inputs grows before the norm scales it back to unit size, six layers in a row. Measured on these
// models: the BF16-emulated reference moves by up to 1e-2 (dense) / 1e-1 (MoE, whose router then
// picks other experts) of max |logit| when its products are perturbed by 1e-6 relative (fp32
// accumulation's size of error) before rounding, and it differs from the plain reference by up to
// 0.10 (dense) / 0.67 (MoE). So, as for gemma3 and gpt_oss, the test measures that spread per prompt
// and holds kvq to it: kvq's distance to the emulation at most 3x the largest spread and its median
// at most 3x the spread's median; the plain difference is printed and must exceed the floor (BF16 in
// effect), not bounded; streamed = whole, bit for bit. Greedy ids are not compared (a 1e-2 move flips
// near-tied argmaxes). The check does see a misplaced rounding: with shared_expert_gate rounded as a
// projection (kvq keeps it in fp32, like the router), the MoE's median missed by 8x.
TEST(Bf16Forward, Qwen3_5MatchesTheEmulatedReferenceWithinItsOwnSpread) {
  using test::median;
  for (const Variant& v : {variants()[1], variants()[5]}) {
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
    std::cout << "[ info ] qwen3_5 '" << v.what << "' BF16: kvq vs emulated median " << median(got_d) << " max "
              << *std::max_element(got_d.begin(), got_d.end()) << "; emulation's own spread median " << median(spread)
              << " max " << max_spread << "; plain reference median " << median(plain) << " max "
              << *std::max_element(plain.begin(), plain.end()) << " (bound " << test::bf16_logit_bound(s.layers)
              << ", not held)\n";
    EXPECT_LE(*std::max_element(got_d.begin(), got_d.end()), 3 * max_spread);
    EXPECT_LE(median(got_d), 3 * median(spread));
    EXPECT_GT(*std::min_element(plain.begin(), plain.end()), test::kBf16Floor) << "BF16 is not in effect";
    const auto ids = prompt(kPrompt, s.vocab, 5);
    EXPECT_TRUE(at::equal(at::tensor(kvq_logits(f.model, ids)), at::tensor(kvq_logits(streamed.model, ids))));
  }
}

}  // namespace
}  // namespace kvq
