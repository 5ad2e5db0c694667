#pragma once
// What the Gated DeltaNet hybrid tests (test_model_qwen3_5.cpp, test_model_qwen3_next.cpp) share:
// the capture observer and the check that kvq's captures are its KV layers (the full-attention
// decoder layers) against the reference's trace, and the streamed-vs-whole / greedy check.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "family_test_util.hpp"
#include "hf_reference.hpp"
#include "kvq/model/capture.hpp"
#include "kvq/model/model.hpp"

namespace kvq::test {

// The hybrid tests' tiny shape (test_model_qwen3_5.cpp's, which Qwen3-Next's test shares): `layers`
// decoder layers, BOS `bos`, EOS 1.
// head_dim 64 != hidden / heads (16), 16 of it rotating (partial_rotary_factor 0.25); GQA groups of
// 2; DeltaNet 2 q/k heads serving 4 value heads (2 each), dk = dv = 16, conv_dim 2·32 + 64 = 128.
// Scales: norm offsets N(0, 0.3), q/k norm offsets N(0, 0.5), projections N(0, 0.15), the
// DeltaNet's decay exp(g) in about (0.24, 0.97) (A_log, dt_bias and in_proj_a per hf::Spec's defaults),
// its q channels correlated with its k channels (lin_qk_overlap 0.8). Without that overlap, random
// q and k in 16 dims are often near-orthogonal, o = Sᵀq is then a near-zero cancellation at some
// (token, head), and the output norm scales its fp32 roundoff up to unit size: kvq's fp32 forward
// measured up to 6.8e-5 from the reference through six stacked DeltaNet layers (1e-6 through one),
// too near kTol for an exact implementation to be safe; with it, <= 1.8e-5 over ten prompts of
// each variant below. (Measured in Qwen3_5Reference.EveryFeatureMatters: every control still moves
// the logits by >= 0.06 of max |logit|, q and k swapped in the split by >= 1.1.)
inline hf::Spec hybrid_spec(uint32_t seed, const std::string& family, int layers, int bos) {
  hf::Spec s;
  s.family = family;
  s.hidden = 64;
  s.layers = layers;
  s.heads = 4;
  s.kv_heads = 2;
  s.head_dim = 64;
  s.partial_rotary_factor = 0.25;
  s.inter = 96;
  s.vocab = 80;
  s.max_pos = 4096;
  s.eps = 1e-6;
  s.theta = 1e6;
  s.lin_k_heads = 2;
  s.lin_v_heads = 4;
  s.lin_k_dim = 16;
  s.lin_v_dim = 16;
  s.experts = 8;
  s.top_k = 2;
  s.moe_inter = 32;
  s.shared_inter = 48;
  s.bos_id = bos;
  s.eos_id = 1;
  s.seed = seed;
  s.scale = 0.15;
  s.embed_scale = 0.5;
  s.norm_jitter = 0.3;
  s.qk_norm_jitter = 0.5;
  s.router_scale = 0.5;
  s.lin_qk_overlap = 0.8;
  return s;
}


// kvq's captures: per call the layer index and the pre-RoPE q (after q_norm), k (after k_norm), v.
struct CaptureQkv : CaptureObserver {
  std::vector<int> layers;
  std::vector<std::vector<float>> q, k, v;
  void on_layer(const LayerCapture& c) override {
    layers.push_back(c.layer);
    q.emplace_back(c.q, c.q + size_t(c.batch) * c.seq * c.n_heads * c.head_dim);
    k.emplace_back(c.k, c.k + size_t(c.batch) * c.seq * c.n_kv_heads * c.head_dim);
    v.emplace_back(c.v, c.v + size_t(c.batch) * c.seq * c.n_kv_heads * c.v_dim());
  }
};

// kvq's captures of `ids` name its KV layers 0, 1, ... (attn_layer_index the reference's attention
// layers) and hold the reference's q, k, v of those layers within tol.
inline void expect_captures_are_attention_layers(const Fixture& f, const std::vector<int>& ids, double tol) {
  CaptureQkv cap;
  Model::ForwardOptions o;
  o.observer = &cap;
  o.logits = false;
  std::vector<int64_t> iv(ids.begin(), ids.end());
  f.model.forward(at::tensor(iv, at::kLong).view({1, int64_t(iv.size())}), o);
  ref::Trace tr;
  ref::forward(f.ck.m, ids, {}, &tr);
  const std::vector<int> attn = f.ck.m.attn_layers();
  ASSERT_EQ(tr.k.size(), attn.size());
  std::vector<int> want(attn.size());
  for (size_t l = 0; l < want.size(); ++l) want[l] = int(l);
  ASSERT_EQ(cap.layers, want);
  EXPECT_EQ(f.model.config().attn_layer_index, attn);
  for (size_t l = 0; l < attn.size(); ++l) {
    EXPECT_LT(ref::rel_max_diff(ref::Vec(cap.q[l].begin(), cap.q[l].end()), tr.q[l]), tol) << "q, KV layer " << l;
    EXPECT_LT(ref::rel_max_diff(ref::Vec(cap.k[l].begin(), cap.k[l].end()), tr.k[l]), tol) << "k, KV layer " << l;
    EXPECT_LT(ref::rel_max_diff(ref::Vec(cap.v[l].begin(), cap.v[l].end()), tr.v[l]), tol) << "v, KV layer " << l;
  }
}

// The checkpoint of `s` loaded whole and streamed: the same logits of `ids` bit for bit, the streamed
// forward within tol of the reference, and 10 greedy steps from `start` the same ids as the
// reference's.
inline void expect_streamed_equals_whole_and_greedy(const hf::Spec& s, const std::vector<int>& ids,
                                                    const std::vector<int>& start, double tol) {
  Fixture whole(s), streamed(s, true);
  EXPECT_TRUE(at::equal(at::tensor(kvq_logits(whole.model, ids)), at::tensor(kvq_logits(streamed.model, ids))));
  EXPECT_LT(streamed.compare(ids), tol);
  std::vector<int> a = start, b = a;
  for (int step = 0; step < 10; ++step) {
    a.push_back(int(argmax_rows(kvq_logits(whole.model, a), s.vocab).back()));
    b.push_back(int(argmax_rows(ref::forward(whole.ck.m, b), s.vocab).back()));
  }
  EXPECT_EQ(a, b);
}

}  // namespace kvq::test
