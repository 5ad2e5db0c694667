// Qwen3-Next (qwen3_next, Qwen3NextForCausalLM): Qwen3.5-MoE's hybrid decoder (Gated DeltaNet
// layers beside gated full attention; MODEL-FAMILIES-2026.md §1) in a text-only checkpoint, with
// the differences of §1.7 (transformers' modeling_qwen3_next.py): config.json at the top level,
// tensors under model. (an MTP block mtp.* to be ignored); the DeltaNet's projections fused and
// grouped per key head — in_proj_qkvz [Hk·(2·dk + 2·r·dv), D] (r = Hv/Hk) whose output viewed as
// [Hk, 2·dk + 2·r·dv] splits per key head h into [q_h | k_h | v of value heads h·r .. h·r+r−1 | z of
// the same], in_proj_ba [2·Hv, D] viewed [Hk, 2r] into [b_h (r) | a_h (r)] — after which the conv
// runs over [all q | all k | all v] in head order exactly as Qwen3.5's; the MLP by the Qwen2-MoE
// rule: layer l is MoE iff (l + 1) % decoder_sparse_step == 0 and l not in mlp_only_layers (else a
// dense SwiGLU of intermediate_size), the router softmax over all experts, top-k, renormalised only
// with norm_topk_prob, per-expert keys, the shared expert x sigmoid(shared_expert_gate · x).
// A tiny checkpoint written by hf_tiny.hpp (its grouped tensors are the qwen3_5_moe writer's
// separate ones regrouped), kvq's fp32 forward against hf_reference.hpp's float64 forward, whose
// from_qwen3_next un-groups the fused tensors by its own index arithmetic. Tolerance as the other
// families: max |logit − reference| <= 1e-4 · max |reference logit| over BOS-first prompts of ~20
// tokens, greedy ids equal. Negative controls (each must move the reference by > 1e-2): in_proj_qkvz
// read as contiguous [all q; all k; all v; all z], in_proj_ba as [all b; all a]; the router
// renormalised when norm_topk_prob is false / not renormalised when true; the mlp_only layer's dense
// MLP left out.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <iostream>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "family_test_util.hpp"
#include "hf_reference.hpp"
#include "hf_tiny.hpp"
#include "hybrid_test_util.hpp"
#include "kvq/model/capture.hpp"
#include "kvq/model/model.hpp"
#include "model_test_util.hpp"

namespace kvq {
namespace {

using namespace test::family_names;

constexpr double kTol = 1e-4;
constexpr double kControl = 1e-2;
constexpr int kLayers = 8;  // default rule (interval 4): full attention at 3 and 7, the rest DeltaNet
constexpr int kPrompt = 20;
constexpr int kBos = 3;
const std::string kPre = "model.";

// test_model_qwen3_5.cpp's shape (test::hybrid_spec; see there for the scales and why
// lin_qk_overlap): head_dim 64 (16 rotating), GQA groups of 2; DeltaNet 2 q/k heads serving 4 value heads, dk = dv = 16, so
// in_proj_qkvz has 2 groups of 2·16 + 2·2·16 = 96 rows and conv_dim is 2·32 + 64 = 128; 8 experts
// top-2 of 32, a shared expert of 48, dense layers (mlp_only_layers, decoder_sparse_step) of 96.
hf::Spec spec(uint32_t seed) {
  hf::Spec s = test::hybrid_spec(seed, "qwen3_next", kLayers, kBos);
  s.norm_topk_prob = true;
  s.decoder_sparse_step = 1;
  s.mlp_only_layers = {};
  return s;
}

// decoder_sparse_step 2 with mlp_only_layers {1}: layers 0, 1, 2, 4, 6 dense, 3, 5, 7 MoE.
hf::Spec sparse_spec(uint32_t seed) {
  hf::Spec s = spec(seed);
  s.decoder_sparse_step = 2;
  s.mlp_only_layers = {1};
  return s;
}

std::vector<int> prompt(int T, int vocab, uint32_t seed) { return test::bos_prompt(T, vocab, seed, kBos); }

using Shape = std::vector<int64_t>;

Shape shape_or(const hf::TensorMap& w, const std::string& n) { return w.count(n) ? w.at(n).shape : Shape{-1}; }

// ---------------------------------------------------------------- the test side's own checks
// (independent of kvq: they hold before kvq opens qwen3_next)

// The checkpoint as written: a top-level config with Qwen3-Next's keys, tensors under model., the
// fused and grouped DeltaNet projections (no separate in_proj_qkv / z / b / a), per-expert keys,
// dense layers by the Qwen2-MoE rule, the MTP tensors a reader must ignore, the tied head.
TEST(Qwen3NextReference, CheckpointLayout) {
  {
    const hf::Spec s = spec(1);
    const json c = hf::make_config(s);
    EXPECT_EQ(c["model_type"], "qwen3_next");
    EXPECT_EQ(c["architectures"], json::array({"Qwen3NextForCausalLM"}));
    EXPECT_FALSE(c.contains("text_config"));
    EXPECT_FALSE(c.contains("vision_config"));
    EXPECT_FALSE(c.contains("rope_parameters"));
    EXPECT_EQ(c["hidden_size"], 64);
    EXPECT_EQ(c["num_hidden_layers"], kLayers);
    EXPECT_EQ(c["num_attention_heads"], 4);
    EXPECT_EQ(c["num_key_value_heads"], 2);
    EXPECT_EQ(c["head_dim"], 64);
    EXPECT_EQ(c["intermediate_size"], 96);
    EXPECT_EQ(c["rms_norm_eps"], 1e-6);
    EXPECT_EQ(c["vocab_size"], 80);
    EXPECT_EQ(c["max_position_embeddings"], 4096);
    EXPECT_EQ(c["rope_theta"], 1e6);
    EXPECT_EQ(c["partial_rotary_factor"], 0.25);
    EXPECT_EQ(c["tie_word_embeddings"], false);
    EXPECT_EQ(c["linear_conv_kernel_dim"], 4);
    EXPECT_EQ(c["linear_key_head_dim"], 16);
    EXPECT_EQ(c["linear_value_head_dim"], 16);
    EXPECT_EQ(c["linear_num_key_heads"], 2);
    EXPECT_EQ(c["linear_num_value_heads"], 4);
    EXPECT_EQ(c["full_attention_interval"], 4);
    const char* lin = "linear_attention";
    EXPECT_EQ(c["layer_types"], json::array({lin, lin, lin, "full_attention", lin, lin, lin, "full_attention"}));
    EXPECT_EQ(c["num_experts"], 8);
    EXPECT_EQ(c["num_experts_per_tok"], 2);
    EXPECT_EQ(c["moe_intermediate_size"], 32);
    EXPECT_EQ(c["shared_expert_intermediate_size"], 48);
    EXPECT_EQ(c["norm_topk_prob"], true);
    EXPECT_EQ(c["decoder_sparse_step"], 1);
    EXPECT_EQ(c["mlp_only_layers"], json::array());

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
    EXPECT_EQ(shape(g + "in_proj_qkvz.weight"), (Shape{192, 64}));  // 2 x [q 16 | k 16 | v 32 | z 32]
    EXPECT_EQ(shape(g + "in_proj_ba.weight"), (Shape{8, 64}));      // 2 x [b 2 | a 2]
    EXPECT_EQ(shape(g + "conv1d.weight"), (Shape{128, 1, 4}));
    EXPECT_EQ(shape(g + "dt_bias"), (Shape{4}));
    EXPECT_EQ(shape(g + "A_log"), (Shape{4}));
    EXPECT_EQ(shape(g + "norm.weight"), (Shape{16}));
    EXPECT_EQ(shape(g + "out_proj.weight"), (Shape{64, 64}));
    for (const char* n : {"in_proj_qkv.weight", "in_proj_z.weight", "in_proj_b.weight", "in_proj_a.weight"})
      EXPECT_EQ(w.count(g + n), 0u) << n;
    for (int l = 0; l < kLayers; ++l) {  // one mixer per layer, by its type; every layer MoE (step 1)
      const std::string p = kPre + "layers." + std::to_string(l) + ".";
      const bool full = l == 3 || l == 7;
      EXPECT_EQ(w.count(p + "self_attn.q_proj.weight"), full ? 1u : 0u) << l;
      EXPECT_EQ(w.count(p + "linear_attn.in_proj_qkvz.weight"), full ? 0u : 1u) << l;
      EXPECT_EQ(shape(p + "input_layernorm.weight"), (Shape{64})) << l;
      EXPECT_EQ(shape(p + "post_attention_layernorm.weight"), (Shape{64})) << l;
      EXPECT_EQ(shape(p + "mlp.gate.weight"), (Shape{8, 64})) << l;
      for (int e : {0, 7}) {
        const std::string q = p + "mlp.experts." + std::to_string(e) + ".";
        EXPECT_EQ(shape(q + "gate_proj.weight"), (Shape{32, 64})) << l;
        EXPECT_EQ(shape(q + "up_proj.weight"), (Shape{32, 64})) << l;
        EXPECT_EQ(shape(q + "down_proj.weight"), (Shape{64, 32})) << l;
      }
      EXPECT_EQ(w.count(p + "mlp.experts.gate_up_proj"), 0u) << l;
      EXPECT_EQ(shape(p + "mlp.shared_expert.gate_proj.weight"), (Shape{48, 64})) << l;
      EXPECT_EQ(shape(p + "mlp.shared_expert.up_proj.weight"), (Shape{48, 64})) << l;
      EXPECT_EQ(shape(p + "mlp.shared_expert.down_proj.weight"), (Shape{64, 48})) << l;
      EXPECT_EQ(shape(p + "mlp.shared_expert_gate.weight"), (Shape{1, 64})) << l;
      EXPECT_EQ(w.count(p + "mlp.gate_proj.weight"), 0u) << l;
    }
    // Nothing of the multimodal layout; the MTP block is there to be ignored.
    for (const auto& [name, t] : w) {
      EXPECT_NE(name.rfind("model.language_model.", 0), 0u) << name;
      EXPECT_NE(name.rfind("model.visual.", 0), 0u) << name;
    }
    for (const char* n : {"mtp.fc.weight", "mtp.norm.weight", "mtp.layers.0.input_layernorm.weight",
                          "mtp.layers.0.self_attn.q_proj.weight", "mtp.layers.0.mlp.gate.weight",
                          "mtp.layers.0.mlp.experts.0.gate_proj.weight"})
      EXPECT_EQ(w.count(n), 1u) << n;
  }
  {  // decoder_sparse_step 2, mlp_only_layers {1}, norm_topk_prob false, no layer_types, tied
    hf::Spec s = sparse_spec(1);
    s.norm_topk_prob = false;
    s.write_layer_types = false;
    s.tied = true;
    const json c = hf::make_config(s);
    EXPECT_EQ(c["decoder_sparse_step"], 2);
    EXPECT_EQ(c["mlp_only_layers"], json::array({1}));
    EXPECT_EQ(c["norm_topk_prob"], false);
    EXPECT_EQ(c["tie_word_embeddings"], true);
    EXPECT_FALSE(c.contains("layer_types"));
    const hf::TensorMap w = hf::make_weights(s);
    EXPECT_EQ(w.count("lm_head.weight"), 0u);
    for (int l = 0; l < kLayers; ++l) {
      const std::string p = kPre + "layers." + std::to_string(l) + ".mlp.";
      const bool moe = l == 3 || l == 5 || l == 7;
      EXPECT_EQ(s.is_moe_layer(l), moe) << l;
      EXPECT_EQ(w.count(p + "gate.weight"), moe ? 1u : 0u) << l;
      EXPECT_EQ(w.count(p + "experts.0.gate_proj.weight"), moe ? 1u : 0u) << l;
      EXPECT_EQ(w.count(p + "shared_expert_gate.weight"), moe ? 1u : 0u) << l;
      EXPECT_EQ(w.count(p + "shared_expert.gate_proj.weight"), moe ? 1u : 0u) << l;
      EXPECT_EQ(shape_or(w, p + "gate_proj.weight"), (moe ? Shape{-1} : Shape{96, 64})) << l;
      EXPECT_EQ(shape_or(w, p + "up_proj.weight"), (moe ? Shape{-1} : Shape{96, 64})) << l;
      EXPECT_EQ(shape_or(w, p + "down_proj.weight"), (moe ? Shape{-1} : Shape{64, 96})) << l;
    }
    const ref::Model m = ref::from_hf(s, w);
    for (int l = 0; l < kLayers; ++l) EXPECT_EQ(m.layers[size_t(l)].router.empty(), !s.is_moe_layer(l)) << l;
    EXPECT_FALSE(m.norm_topk_prob);
    EXPECT_EQ(m.attn_layers(), (std::vector<int>{3, 7}));
  }
  {  // one seed, one set of weights: tied drops lm_head only; the MoE rule changes only the MLPs it replaces
    hf::Spec a = spec(2), b = spec(2), c = sparse_spec(2);
    b.tied = true;
    const hf::TensorMap wa = hf::make_weights(a), wb = hf::make_weights(b), wc = hf::make_weights(c);
    for (const auto& [name, t] : wb) EXPECT_EQ(wa.at(name).v, t.v) << name;
    EXPECT_EQ(wa.size(), wb.size() + 1);
    for (const auto& [name, t] : wc) {
      if (wa.count(name)) {
        EXPECT_EQ(wa.at(name).v, t.v) << name;
      }
    }
  }
}

// The grouping by hand. Hk = 2 key heads, Hv = 4 value heads (r = 2), dk = dv = 1, hidden 2; row R
// of the fused tensor holds (R, 100 + R). in_proj_qkvz's 12 rows are per key head [q | k | v v | z z]:
//   head 0: q0 = 0, k0 = 1, v0 = 2, v1 = 3, z0 = 4, z1 = 5;  head 1: q1 = 6, k1 = 7, v2 = 8, v3 = 9,
//   z2 = 10, z3 = 11
// so in_proj_qkv (conv order [all q | all k | all v]) = rows (0, 6, 1, 7, 2, 3, 8, 9), in_proj_z =
// (4, 5, 10, 11). in_proj_ba's 8 rows are per key head [b b | a a]: b = (0, 1, 4, 5), a = (2, 3, 6, 7).
// The contiguous misreading takes qkv = rows 0..7, z = 8..11, b = 0..3, a = 4..7. With Hk = Hv = 2 (r
// = 1), dk = 2, dv = 3 (10 rows per key head): qkv = (0, 1, 10, 11, 2, 3, 12, 13, 4, 5, 6, 14, 15, 16),
// z = (7, 8, 9, 17, 18, 19), b = (0, 2), a = (1, 3). hf::group_qkvz / group_ba (the writer) invert
// ref::detail::ungroup_qkvz / ungroup_ba (the reader) on random rows.
TEST(Qwen3NextReference, GroupingByHand) {
  auto fused = [](int rows) {
    ref::Vec W;
    for (int r = 0; r < rows; ++r) W.insert(W.end(), {double(r), 100.0 + r});
    return W;
  };
  auto rows_of = [](const std::vector<int>& r) {
    ref::Vec W;
    for (int x : r) W.insert(W.end(), {double(x), 100.0 + x});
    return W;
  };
  ref::Vec qkv, z, b, a;
  ref::detail::ungroup_qkvz(fused(12), 2, 4, 1, 1, 2, false, qkv, z);
  EXPECT_EQ(qkv, rows_of({0, 6, 1, 7, 2, 3, 8, 9}));
  EXPECT_EQ(z, rows_of({4, 5, 10, 11}));
  ref::detail::ungroup_ba(fused(8), 2, 4, 2, false, b, a);
  EXPECT_EQ(b, rows_of({0, 1, 4, 5}));
  EXPECT_EQ(a, rows_of({2, 3, 6, 7}));
  ref::detail::ungroup_qkvz(fused(12), 2, 4, 1, 1, 2, true, qkv, z);
  EXPECT_EQ(qkv, rows_of({0, 1, 2, 3, 4, 5, 6, 7}));
  EXPECT_EQ(z, rows_of({8, 9, 10, 11}));
  ref::detail::ungroup_ba(fused(8), 2, 4, 2, true, b, a);
  EXPECT_EQ(b, rows_of({0, 1, 2, 3}));
  EXPECT_EQ(a, rows_of({4, 5, 6, 7}));

  ref::detail::ungroup_qkvz(fused(20), 2, 2, 2, 3, 2, false, qkv, z);
  EXPECT_EQ(qkv, rows_of({0, 1, 10, 11, 2, 3, 12, 13, 4, 5, 6, 14, 15, 16}));
  EXPECT_EQ(z, rows_of({7, 8, 9, 17, 18, 19}));
  ref::detail::ungroup_ba(fused(4), 2, 2, 2, false, b, a);
  EXPECT_EQ(b, rows_of({0, 2}));
  EXPECT_EQ(a, rows_of({1, 3}));
  EXPECT_THROW(ref::detail::ungroup_qkvz(fused(19), 2, 2, 2, 3, 2, false, qkv, z), std::runtime_error);
  EXPECT_THROW(ref::detail::ungroup_ba(fused(8), 2, 3, 2, false, b, a), std::runtime_error);

  // The writer's grouping against the reader's un-grouping: Hk 2, Hv 6 (r = 3), dk 3, dv 2, D 5.
  std::mt19937 rng(3);
  std::normal_distribution<double> n(0.0, 1.0);
  auto rand_tensor = [&](int64_t rows, int64_t cols) {
    hf::Tensor t;
    t.shape = {rows, cols};
    t.v.resize(size_t(rows * cols));
    for (double& x : t.v) x = n(rng);
    return t;
  };
  const int Hk = 2, Hv = 6, dk = 3, dv = 2, D = 5;
  const hf::Tensor tq = rand_tensor(2 * Hk * dk + Hv * dv, D), tz = rand_tensor(Hv * dv, D), tb = rand_tensor(Hv, D),
                   ta = rand_tensor(Hv, D);
  const hf::Tensor qkvz = hf::group_qkvz(tq, tz, Hk, Hv, dk, dv), ba = hf::group_ba(tb, ta, Hk, Hv);
  EXPECT_EQ(qkvz.shape, (Shape{Hk * (2 * dk + 2 * (Hv / Hk) * dv), D}));
  EXPECT_EQ(ba.shape, (Shape{2 * Hv, D}));
  ref::detail::ungroup_qkvz(qkvz.v, Hk, Hv, dk, dv, D, false, qkv, z);
  ref::detail::ungroup_ba(ba.v, Hk, Hv, D, false, b, a);
  EXPECT_EQ(qkv, tq.v);
  EXPECT_EQ(z, tz.v);
  EXPECT_EQ(b, tb.v);
  EXPECT_EQ(a, ta.v);
  // key head 1's k row 2 (dim 2) sits at 1·(2·3 + 2·3·2) + 3 + 2 = 23; value head 4 (key head 1, u = 1)
  // dim 1's v row at 18 + 6 + 1·2 + 1 = 27 and its z row at 18 + 6 + 6 + 2 + 1 = 33.
  auto row = [&](const std::vector<double>& v, int r) {
    return std::vector<double>(v.begin() + r * D, v.begin() + (r + 1) * D);
  };
  EXPECT_EQ(row(qkvz.v, 23), row(tq.v, Hk * dk + 1 * dk + 2));
  EXPECT_EQ(row(qkvz.v, 27), row(tq.v, 2 * Hk * dk + 4 * dv + 1));
  EXPECT_EQ(row(qkvz.v, 33), row(tz.v, 4 * dv + 1));
  // b / a of value head 4 (key head 1, u = 1): rows 1·6 + 1 = 7 and 1·6 + 3 + 1 = 10.
  EXPECT_EQ(row(ba.v, 7), row(tb.v, 4));
  EXPECT_EQ(row(ba.v, 10), row(ta.v, 4));
}

// The checkpoint's values are the qwen3_5_moe writer's (per-expert keys) for the same spec: the
// reference read from the grouped tensors has exactly the separate in_proj_qkv / z / b / a, conv,
// attention and expert weights of the Qwen3.5-MoE reference, and (every layer MoE, renormalised)
// the same logits bit for bit; the grouping is no identity (the fused rows differ from a plain
// concatenation).
TEST(Qwen3NextReference, SameValuesAsQwen3_5Moe) {
  for (int lin_k_heads : {2, 4}) {
    SCOPED_TRACE("linear key heads " + std::to_string(lin_k_heads));
    hf::Spec n = spec(4);
    n.lin_k_heads = lin_k_heads;
    hf::Spec q = n;
    q.family = "qwen3_5_moe";
    q.per_expert_keys = true;
    const hf::TensorMap wn = hf::make_weights(n), wq = hf::make_weights(q);
    const ref::Model mn = ref::from_hf(n, wn), mq = ref::from_hf(q, wq);
    ASSERT_EQ(mn.layers.size(), mq.layers.size());
    for (size_t l = 0; l < mn.layers.size(); ++l) {
      const ref::Layer &x = mn.layers[l], &y = mq.layers[l];
      EXPECT_EQ(x.in_qkv, y.in_qkv) << l;
      EXPECT_EQ(x.in_z, y.in_z) << l;
      EXPECT_EQ(x.in_b, y.in_b) << l;
      EXPECT_EQ(x.in_a, y.in_a) << l;
      EXPECT_EQ(x.conv, y.conv) << l;
      EXPECT_EQ(x.wq, y.wq) << l;
      EXPECT_EQ(x.router, y.router) << l;
      EXPECT_EQ(x.experts.size(), y.experts.size()) << l;
      EXPECT_EQ(x.experts[5].up, y.experts[5].up) << l;
      EXPECT_EQ(x.shared_gate, y.shared_gate) << l;
      if (x.linear()) {
        const std::string a = "model.layers." + std::to_string(l) + ".linear_attn.";
        const std::string b = "model.language_model.layers." + std::to_string(l) + ".linear_attn.";
        ref::Vec cat = wq.at(b + "in_proj_qkv.weight").v;
        cat.insert(cat.end(), wq.at(b + "in_proj_z.weight").v.begin(), wq.at(b + "in_proj_z.weight").v.end());
        EXPECT_NE(wn.at(a + "in_proj_qkvz.weight").v, cat) << l;
      }
    }
    EXPECT_EQ(mn.lm_head, mq.lm_head);
    const auto ids = prompt(kPrompt, n.vocab, 8);
    EXPECT_EQ(ref::forward(mn, ids), ref::forward(mq, ids));
  }
}

// The Qwen2-MoE layer rule: MoE iff (l + 1) % decoder_sparse_step == 0 and l not in mlp_only_layers;
// the default layer types (no layer_types) by (l + 1) % full_attention_interval; a written list wins.
TEST(Qwen3NextReference, LayerRules) {
  hf::Spec s = sparse_spec(1);
  s.write_layer_types = false;
  Checkpoint ck = make_checkpoint(s);
  std::vector<int> moe;
  for (int l = 0; l < kLayers; ++l)
    if (!ck.m.layers[size_t(l)].router.empty()) moe.push_back(l);
  EXPECT_EQ(moe, (std::vector<int>{3, 5, 7}));
  EXPECT_EQ(ck.m.attn_layers(), (std::vector<int>{3, 7}));
  s.decoder_sparse_step = 3;
  s.mlp_only_layers = {5};
  s.full_attention_interval = 3;
  ck = make_checkpoint(s);
  moe.clear();
  for (int l = 0; l < kLayers; ++l)
    if (!ck.m.layers[size_t(l)].router.empty()) moe.push_back(l);
  EXPECT_EQ(moe, (std::vector<int>{2}));
  EXPECT_EQ(ck.m.attn_layers(), (std::vector<int>{2, 5}));
  EXPECT_EQ(hf::make_config(s)["full_attention_interval"], 3);
  s.write_layer_types = true;
  s.layer_types = {"full_attention",   "linear_attention", "linear_attention", "full_attention",
                   "linear_attention", "linear_attention", "linear_attention", "full_attention"};
  EXPECT_EQ(make_checkpoint(s).m.attn_layers(), (std::vector<int>{0, 3, 7}));
  EXPECT_EQ(hf::make_config(s)["layer_types"][0], "full_attention");
}

// The reference is causal (a prefix's logits are the full prompt's first rows, bit for bit).
TEST(Qwen3NextReference, IsCausal) {
  const Checkpoint ck = make_checkpoint(sparse_spec(3));
  const auto ids = prompt(kPrompt, ck.s.vocab, 9);
  const ref::Vec all = ref::forward(ck.m, ids);
  for (int t : {1, 2, 7, 13}) {
    const ref::Vec pre = ref::forward(ck.m, std::vector<int>(ids.begin(), ids.begin() + t));
    EXPECT_TRUE(std::equal(pre.begin(), pre.end(), all.begin())) << "prefix " << t;
  }
}

// What Qwen3-Next adds to Qwen3.5 changes the logits of the test's checkpoints by > 1e-2, so the
// comparison with kvq can see each one done wrong: the fused tensors read as contiguous (qkvz, ba,
// both), norm_topk_prob flipped (a checkpoint with it true and one with it false), the mlp_only
// layer's dense MLP left out (and, for scale, the shared expert gate left out).
TEST(Qwen3NextReference, EveryFeatureMatters) {
  for (int lin_k_heads : {2, 4})
    for (uint32_t seed : {1u, 2u}) {
      const std::string what = "Hk " + std::to_string(lin_k_heads) + " seed " + std::to_string(seed);
      hf::Spec s = sparse_spec(seed);
      s.lin_k_heads = lin_k_heads;
      const Checkpoint ck = make_checkpoint(s);
      hf::Spec f = s;
      f.norm_topk_prob = false;
      const Checkpoint ckf = make_checkpoint(f);
      const auto ids = prompt(kPrompt, s.vocab, 100 + seed);
      std::vector<std::pair<std::string, double>> d;
      for (const auto& [name, how] : std::vector<std::pair<std::string, ref::FusedRead>>{
               {"in_proj_qkvz read as [all q; all k; all v; all z]", {true, false}},
               {"in_proj_ba read as [all b; all a]", {false, true}},
               {"both fused tensors read as contiguous", {true, true}}})
        d.emplace_back(name, control(ck, ids, ref::from_qwen3_next(s, ck.w, how)));
      ref::Options o;
      o.flip_norm_topk_prob = true;
      d.emplace_back("norm_topk_prob true read as false", control(ck, ids, o));
      d.emplace_back("norm_topk_prob false read as true", control(ckf, ids, o));
      d.emplace_back("norm_topk_prob false vs true (same weights)", control(ck, ids, ckf.m));
      ref::Model other = ck.m;
      other.layers[1].w_gate.assign(other.layers[1].w_gate.size(), 0.0);
      d.emplace_back("mlp_only layer 1's dense MLP left out", control(ck, ids, other));
      o = {};
      o.drop_shared_gate = true;
      d.emplace_back("shared-expert gate left out", control(ck, ids, o));
      for (const auto& [name, x] : d) {
        std::cout << "[ info ] qwen3_next " << what << " control '" << name << "': " << x << "\n";
        EXPECT_GT(x, kControl) << what << ": " << name;
      }
    }
}

// ---------------------------------------------------------------- kvq against the reference

// kvq's layers are the layers with a KV cache: n_layers counts the full-attention layers,
// attn_layer_index names their decoder layers, n_decoder_layers counts them all; the MoE layers
// follow the Qwen2-MoE rule and norm_topk_prob is read.
TEST(Qwen3Next, ConfigFields) {
  {
    hf::Spec s = spec(1);
    s.write_layer_types = false;
    Fixture f(s);
    const ModelConfig& c = f.model.config();
    EXPECT_NE(c.architecture.find("qwen3_next"), std::string::npos) << c.architecture;
    EXPECT_EQ(c.hidden_size, 64);
    EXPECT_EQ(c.n_layers, 2);
    EXPECT_EQ(c.n_decoder_layers, kLayers);
    EXPECT_EQ(c.attn_layer_index, (std::vector<int>{3, 7}));
    EXPECT_EQ(c.n_heads, 4);
    EXPECT_EQ(c.n_kv_heads, 2);
    EXPECT_EQ(c.head_dim, 64);
    EXPECT_EQ(c.rotary_dim, 16);
    EXPECT_EQ(c.pairing, RopePairing::kSplitHalf);
    EXPECT_DOUBLE_EQ(c.rope_theta, 1e6);
    EXPECT_DOUBLE_EQ(c.rms_norm_eps, 1e-6);
    EXPECT_FALSE(c.qkv_bias);
    EXPECT_FALSE(c.tie_word_embeddings);
    EXPECT_EQ(c.vocab_size, 80);
    EXPECT_EQ(c.n_experts, 8);
    EXPECT_EQ(c.n_experts_per_tok, 2);
    EXPECT_EQ(c.moe_intermediate_size, 32);
    EXPECT_EQ(c.shared_expert_intermediate_size, 48);
    EXPECT_TRUE(c.norm_topk_prob);
    EXPECT_EQ(c.linear_key_heads, 2);
    EXPECT_EQ(c.linear_value_heads, 4);
    EXPECT_EQ(c.linear_key_dim, 16);
    EXPECT_EQ(c.linear_value_dim, 16);
    EXPECT_EQ(c.linear_conv_kernel, 4);
    EXPECT_EQ(c.bos_id, kBos);
    EXPECT_EQ(c.eos_id, 1);
    for (int d = 0; d < kLayers; ++d) EXPECT_TRUE(c.is_moe_layer(d)) << "decoder layer " << d;
    EXPECT_LT(f.compare(prompt(12, s.vocab, 2)), kTol);
  }
  {
    hf::Spec s = sparse_spec(1);
    s.tied = true;
    s.norm_topk_prob = false;
    s.layer_types = {"full_attention",   "linear_attention", "linear_attention", "full_attention",
                     "linear_attention", "linear_attention", "linear_attention", "full_attention"};
    Fixture f(s);
    const ModelConfig& c = f.model.config();
    EXPECT_EQ(c.n_layers, 3);
    EXPECT_EQ(c.n_decoder_layers, kLayers);
    EXPECT_EQ(c.attn_layer_index, (std::vector<int>{0, 3, 7}));
    EXPECT_TRUE(c.tie_word_embeddings);
    EXPECT_FALSE(c.norm_topk_prob);
    EXPECT_EQ(c.intermediate_size, 96);
    for (int d = 0; d < kLayers; ++d) EXPECT_EQ(c.is_moe_layer(d), d == 3 || d == 5 || d == 7) << "decoder layer " << d;
    EXPECT_LT(f.compare(prompt(12, s.vocab, 2)), kTol);
  }
}

// The checkpoints kvq must read alike: {what, tied, layer_types written (else the default rule),
// linear key heads (of 4 value heads), decoder_sparse_step 2 with mlp_only_layers {1}, norm_topk_prob,
// layer_types unlike the rule}.
struct Variant {
  const char* what;
  bool tied = false, write_layer_types = true;
  int lin_k_heads = 2;
  bool sparse = false, norm_topk_prob = true, odd_types = false;
};

hf::Spec variant_spec(const Variant& v, uint32_t seed) {
  hf::Spec s = v.sparse ? sparse_spec(seed) : spec(seed);
  s.tied = v.tied;
  s.write_layer_types = v.write_layer_types;
  s.lin_k_heads = v.lin_k_heads;
  s.norm_topk_prob = v.norm_topk_prob;
  if (v.odd_types)
    s.layer_types = {"full_attention",   "linear_attention", "linear_attention", "full_attention",
                     "linear_attention", "full_attention",   "linear_attention", "linear_attention"};
  return s;
}

const std::vector<Variant>& variants() {
  static const std::vector<Variant> v = {
      {"untied, layer_types, Hv = 2 Hk", false, true, 2, false, true, false},
      {"tied, default rule", true, false, 2, false, true, false},
      {"key heads = value heads", false, true, 4, false, true, false},
      {"sparse step 2, mlp_only {1}", false, false, 2, true, true, false},
      {"norm_topk_prob false", false, true, 2, false, false, false},
      {"tied, Hv = Hk, sparse, not renormalised, odd types", true, true, 4, true, false, true},
  };
  return v;
}

TEST(Qwen3Next, ForwardMatchesReference) {
  test::forward_matches_reference(variants(), variant_spec, prompt, kPrompt, kTol, "qwen3_next");
}

TEST(Qwen3Next, StreamedEqualsWholeAndGreedyMatches) {
  for (const Variant& v : {variants()[1], variants()[3], variants()[5]}) {
    SCOPED_TRACE(v.what);
    const hf::Spec s = variant_spec(v, 3);
    test::expect_streamed_equals_whole_and_greedy(s, prompt(kPrompt, s.vocab, 5), prompt(5, s.vocab, 9), kTol);
  }
}

// kvq's captures name its KV layers (as for Qwen3.5): layer l is decoder layer attn_layer_index[l],
// with the query heads' pre-RoPE q after q_norm, the pre-RoPE k after k_norm, and v.
TEST(Qwen3Next, CapturesAreTheAttentionLayers) {
  Fixture f(variant_spec(variants()[5], 2));
  const auto ids = prompt(12, f.ck.s.vocab, 3);
  test::expect_captures_are_attention_layers(f, ids, kTol);
}

// Refused in one line naming config.json and the key, or the tensor: linear_num_value_heads not a
// multiple of linear_num_key_heads; in_proj_qkvz / in_proj_ba with a wrong row count; a config whose
// MoE rule disagrees with the tensors (mlp_only_layers naming a MoE layer, decoder_sparse_step 2 over
// an all-MoE checkpoint: the dense MLP's tensors are missing).
// expect_error, printing the message for the log.
void refused(const std::string& dir, const std::vector<std::string>& parts) {
  try {
    Model::load(dir);
  } catch (const std::exception& e) {
    std::cout << "[ info ] qwen3_next refused: " << e.what() << "\n";
  }
  test::expect_error([&] { Model::load(dir); }, parts);
}

TEST(Qwen3Next, BadInputsRefusedInOneLine) {
  const hf::Spec s = spec(1);
  const hf::TensorMap w = hf::make_weights(s);
  struct Case {
    json patch;  // merged into config.json
    std::vector<std::string> parts;
  };
  const std::vector<Case> cases = {
      {{{"linear_num_value_heads", 3}}, {"config.json", "linear_num_value_heads"}},
      {{{"mlp_only_layers", {2}}}, {"model.layers.2.mlp"}},
      {{{"decoder_sparse_step", 2}}, {"model.layers.0.mlp"}},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.patch.dump());
    test::TempDir dir;
    json cfg = hf::make_config(s);
    cfg.update(c.patch);
    hf::write_model(dir.str(), cfg, w, 2);
    refused(dir.str(), c.parts);
  }
  for (const std::string& n :
       {kPre + "layers.2.linear_attn.in_proj_qkvz.weight", kPre + "layers.1.linear_attn.in_proj_ba.weight"}) {
    SCOPED_TRACE(n + " one row short");
    hf::TensorMap bad = w;
    hf::Tensor& t = bad.at(n);
    t.shape[0] -= 1;
    t.v.resize(size_t(t.shape[0] * t.shape[1]));
    test::TempDir dir;
    hf::write_model(dir.str(), hf::make_config(s), bad, 2);
    refused(dir.str(), {n});
  }
  {
    const std::string n = kPre + "layers.0.linear_attn.in_proj_qkvz.weight";
    SCOPED_TRACE("no " + n);
    hf::TensorMap bad = w;
    bad.erase(n);
    test::TempDir dir;
    hf::write_model(dir.str(), hf::make_config(s), bad, 2);
    refused(dir.str(), {n});
  }
}

}  // namespace
}  // namespace kvq
