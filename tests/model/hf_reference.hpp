#pragma once
// A double-precision reference forward of the HF decoder families, written from the formulas
// (../shared/MODEL-FAMILIES.md, transformers' modeling code) with plain loops and no kvq code:
// RMSNorm, optional per-head q/k RMSNorm (Qwen3), split-half or adjacent-pair (GLM) RoPE over the
// first rotary dims from explicit inverse frequencies and attention factor, GLM-4-0414's sandwich
// norms, GQA attention with causal and sliding-window masks, SwiGLU
// MLP, MoE router softmax / top-k / renormalisation. Slow (O(T^2) loops), for tiny models only.
//
// Usage: fill a ref::Model (from_hf() does it for hf_tiny.hpp's tensors), then
//   std::vector<double> logits = ref::forward(model, ids);          // [T][V] row-major
// RoPE scaling tests set model.inv_freq / model.attention_factor to their own values.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <numeric>
#include <stdexcept>
#include <string>
#include <vector>

#include "hf_tiny.hpp"

namespace kvq::test::ref {

using Vec = std::vector<double>;

struct Expert {
  Vec gate, up, down;  // [I, D], [I, D], [D, I] row-major
};

struct Layer {
  Vec attn_norm, ffn_norm;  // [D]
  Vec wq, wk, wv, wo;       // [H*hd, D], [Hk*hd, D], [Hk*hd, D], [D, H*hd]
  Vec bq, bk, bv, bo;       // empty: no bias
  Vec q_norm, k_norm;       // [hd]; empty: no q/k norm
  Vec post_attn_norm, post_mlp_norm;  // [D]; empty: none (glm4: norm the sublayer output before the add)
  int window = 0;           // 0: full causal; W > 0: query i sees keys j with i - W < j <= i
  // Dense SwiGLU MLP (when router is empty)
  Vec w_gate, w_up, w_down;  // [I, D], [I, D], [D, I]
  // MoE
  Vec router;  // [E, D]
  std::vector<Expert> experts;
  Vec router_bias;  // [E] e_score_correction_bias (sigmoid router: selection only)
  Expert shared;    // shared experts as one SwiGLU, unweighted; empty gate: none
};

struct Model {
  int D = 0, H = 0, Hk = 0, hd = 0, V = 0;
  double eps = 1e-6;
  // RoPE over the first 2 * inv_freq.size() dims of each head (split-half pairing: dim i with
  // i + half); cos and sin are multiplied by attention_factor.
  Vec inv_freq;
  bool adjacent_pairs = false;  // GLM: dim 2j turns with 2j+1 (instead of j with j + half)
  double attention_factor = 1.0;
  int top_k = 0;
  bool norm_topk_prob = false;
  // DeepSeek-V3 / GLM-4.5 router (official Gate.forward): s = sigmoid(logits), selection by
  // s + router_bias within the topk_group groups of highest top-2 sum (n_group > 1), weights the
  // unbiased s of the picks, renormalised (norm_topk_prob) and x routed_scaling_factor.
  bool sigmoid_router = false;
  int n_group = 1, topk_group = 1;
  double routed_scaling_factor = 1.0;
  Vec embed, final_norm, lm_head;  // [V, D], [D], [V, D]
  std::vector<Layer> layers;
};

// theta^(-2j/d) for j < d/2.
inline Vec default_inv_freq(double theta, int rotary_dim) {
  Vec f(static_cast<size_t>(rotary_dim / 2));
  for (size_t j = 0; j < f.size(); ++j) f[j] = std::pow(theta, -2.0 * double(j) / double(rotary_dim));
  return f;
}

// Switches that turn one feature off, for negative controls.
struct Options {
  bool skip_qk_norm = false;
  bool ignore_window = false;
  bool flip_norm_topk_prob = false;
  bool flip_pairing = false;  // adjacent pairs <-> split-half
  bool skip_sandwich_norm = false;
  // Sigmoid-router controls: select by the unbiased score, score a group by its best expert
  // instead of its top-2 sum, leave routed_scaling_factor out.
  bool select_unbiased = false, group_by_max = false, ignore_scaling_factor = false;
  int64_t pos0 = 0;
};

// What the forward saw per layer, pre-RoPE (after the q/k norm): [T][H][hd], [T][Hk][hd].
struct Trace {
  std::vector<Vec> q, k, v;
};

// The BF16 emulation (bf16_bound.hpp): while on, every projection of forward() below — q/k/v, o,
// the MLP's and the experts' gate/up/down; not the router, not the head — rounds its input and its
// product to BF16 (nearest even) and adds the bias after, where kvq's --precision bf16 rounds. The
// float64 reference of the BF16 forward: the same decisions (a top-k router sees the same scores to
// fp32 accuracy), the rest in float64. Bf16Emulation turns it on for a scope.
inline bool& emulate_bf16() {
  static thread_local bool on = false;
  return on;
}
// Negative controls of the emulation: leave one of its roundings out.
struct Bf16Control {
  bool skip_input = false, skip_product = false;
};
inline Bf16Control& bf16_control() {
  static thread_local Bf16Control c;
  return c;
}
struct Bf16Emulation {
  Bf16Emulation() { emulate_bf16() = true; }
  ~Bf16Emulation() { emulate_bf16() = false; }
  Bf16Emulation(const Bf16Emulation&) = delete;
  Bf16Emulation& operator=(const Bf16Emulation&) = delete;
};

namespace detail {

inline void rms_norm(const double* x, const Vec& w, int n, double eps, double* out) {
  double ss = 0;
  for (int i = 0; i < n; ++i) ss += x[i] * x[i];
  const double inv = 1.0 / std::sqrt(ss / n + eps);
  for (int i = 0; i < n; ++i) out[i] = x[i] * inv * w[size_t(i)];
}

// y[o] = Σ_i W[o][i] x[i] (+ b[o])
inline void matvec(const Vec& W, const Vec& b, const double* x, int out, int in, double* y) {
  for (int o = 0; o < out; ++o) {
    double s = b.empty() ? 0.0 : b[size_t(o)];
    const double* w = W.data() + size_t(o) * size_t(in);
    for (int i = 0; i < in; ++i) s += w[i] * x[i];
    y[o] = s;
  }
}

// A projection of the forward: matvec, or under emulate_bf16() the input rounded to BF16, the
// product rounded to BF16 and the bias added after, as kvq's BF16 forward does.
inline void proj(const Vec& W, const Vec& b, const double* x, int out, int in, double* y) {
  if (!emulate_bf16()) return matvec(W, b, x, out, in, y);
  Vec xr(static_cast<size_t>(in));
  for (int i = 0; i < in; ++i) xr[size_t(i)] = bf16_control().skip_input ? x[i] : hf::bf16_round(x[i]);
  matvec(W, {}, xr.data(), out, in, y);
  for (int o = 0; o < out; ++o)
    y[o] = (bf16_control().skip_product ? y[o] : hf::bf16_round(y[o])) + (b.empty() ? 0.0 : b[size_t(o)]);
}

inline double silu(double x) { return x / (1.0 + std::exp(-x)); }

inline void swiglu(const Vec& gate, const Vec& up, const Vec& down, const double* x, int D, int I, double* y) {
  Vec g(static_cast<size_t>(I)), u(static_cast<size_t>(I));
  proj(gate, {}, x, I, D, g.data());
  proj(up, {}, x, I, D, u.data());
  for (int i = 0; i < I; ++i) g[size_t(i)] = silu(g[size_t(i)]) * u[size_t(i)];
  proj(down, {}, g.data(), D, I, y);
}

inline void rope(double* head, const Vec& inv_freq, double af, int64_t pos, bool adjacent = false) {
  const size_t half = inv_freq.size();
  for (size_t j = 0; j < half; ++j) {
    double& a = adjacent ? head[2 * j] : head[j];
    double& b = adjacent ? head[2 * j + 1] : head[j + half];
    const double ang = double(pos) * inv_freq[j], c = af * std::cos(ang), s = af * std::sin(ang);
    const double a0 = a, b0 = b;
    a = a0 * c - b0 * s;
    b = b0 * c + a0 * s;
  }
}

}  // namespace detail

// Logits [T][V] of one causal window of ids at positions pos0 ... pos0 + T - 1.
inline Vec forward(const Model& m, const std::vector<int>& ids, const Options& opt = {}, Trace* trace = nullptr) {
  using namespace detail;
  const int T = int(ids.size()), D = m.D, H = m.H, Hk = m.Hk, hd = m.hd, G = H / Hk;
  Vec x(static_cast<size_t>(T) * D);
  for (int t = 0; t < T; ++t)
    std::copy_n(m.embed.begin() + ptrdiff_t(static_cast<size_t>(ids[size_t(t)]) * D), D, x.begin() + ptrdiff_t(static_cast<size_t>(t) * D));
  if (trace) *trace = Trace{};
  Vec h(static_cast<size_t>(D)), q(static_cast<size_t>(T) * H * hd), k(static_cast<size_t>(T) * Hk * hd), v(static_cast<size_t>(T) * Hk * hd), tmp(static_cast<size_t>(hd));
  for (const Layer& L : m.layers) {
    for (int t = 0; t < T; ++t) {
      rms_norm(&x[size_t(t) * D], L.attn_norm, D, m.eps, h.data());
      proj(L.wq, L.bq, h.data(), H * hd, D, &q[size_t(t) * H * hd]);
      proj(L.wk, L.bk, h.data(), Hk * hd, D, &k[size_t(t) * Hk * hd]);
      proj(L.wv, L.bv, h.data(), Hk * hd, D, &v[size_t(t) * Hk * hd]);
      if (!L.q_norm.empty() && !opt.skip_qk_norm) {
        for (int hh = 0; hh < H; ++hh) {
          double* r = &q[(static_cast<size_t>(t) * H + hh) * hd];
          rms_norm(r, L.q_norm, hd, m.eps, tmp.data());
          std::copy(tmp.begin(), tmp.end(), r);
        }
        for (int hh = 0; hh < Hk; ++hh) {
          double* r = &k[(static_cast<size_t>(t) * Hk + hh) * hd];
          rms_norm(r, L.k_norm, hd, m.eps, tmp.data());
          std::copy(tmp.begin(), tmp.end(), r);
        }
      }
    }
    if (trace) {
      trace->q.push_back(q);
      trace->k.push_back(k);
      trace->v.push_back(v);
    }
    const bool adj = m.adjacent_pairs != opt.flip_pairing;
    for (int t = 0; t < T; ++t) {
      for (int hh = 0; hh < H; ++hh) rope(&q[(static_cast<size_t>(t) * H + hh) * hd], m.inv_freq, m.attention_factor, opt.pos0 + t, adj);
      for (int hh = 0; hh < Hk; ++hh) rope(&k[(static_cast<size_t>(t) * Hk + hh) * hd], m.inv_freq, m.attention_factor, opt.pos0 + t, adj);
    }
    const bool sandwich = !L.post_attn_norm.empty() && !opt.skip_sandwich_norm;
    const int W = opt.ignore_window ? 0 : L.window;
    Vec attn(static_cast<size_t>(H) * hd), score(static_cast<size_t>(T)), o(static_cast<size_t>(D)), tmp2(static_cast<size_t>(D));
    Vec x_new = x;
    for (int i = 0; i < T; ++i) {
      for (int hh = 0; hh < H; ++hh) {
        const int kh = hh / G;
        const double* qi = &q[(static_cast<size_t>(i) * H + hh) * hd];
        double mx = -INFINITY;
        for (int j = 0; j <= i; ++j) {
          score[size_t(j)] = -INFINITY;
          if (W > 0 && i - j >= W) continue;
          const double* kj = &k[(static_cast<size_t>(j) * Hk + kh) * hd];
          double s = 0;
          for (int e = 0; e < hd; ++e) s += qi[e] * kj[e];
          score[size_t(j)] = s / std::sqrt(double(hd));
          mx = std::max(mx, score[size_t(j)]);
        }
        double z = 0;
        for (int j = 0; j <= i; ++j) z += std::exp(score[size_t(j)] - mx);
        for (int e = 0; e < hd; ++e) attn[size_t(hh) * hd + e] = 0;
        for (int j = 0; j <= i; ++j) {
          const double p = std::exp(score[size_t(j)] - mx) / z;
          const double* vj = &v[(static_cast<size_t>(j) * Hk + kh) * hd];
          for (int e = 0; e < hd; ++e) attn[size_t(hh) * hd + e] += p * vj[e];
        }
      }
      proj(L.wo, L.bo, attn.data(), D, H * hd, o.data());
      if (sandwich) {
        rms_norm(o.data(), L.post_attn_norm, D, m.eps, tmp2.data());
        o.swap(tmp2);
      }
      for (int e = 0; e < D; ++e) x_new[size_t(i) * D + e] += o[size_t(e)];
    }
    x.swap(x_new);

    for (int t = 0; t < T; ++t) {
      double* xt = &x[size_t(t) * D];
      rms_norm(xt, L.ffn_norm, D, m.eps, h.data());
      if (L.router.empty()) {
        const int I = int(L.w_gate.size() / size_t(D));
        swiglu(L.w_gate, L.w_up, L.w_down, h.data(), D, I, o.data());
        if (sandwich) {
          rms_norm(o.data(), L.post_mlp_norm, D, m.eps, tmp2.data());
          o.swap(tmp2);
        }
        for (int e = 0; e < D; ++e) xt[e] += o[size_t(e)];
        continue;
      }
      const int E = int(L.experts.size());
      Vec logit(static_cast<size_t>(E));
      matvec(L.router, {}, h.data(), E, D, logit.data());
      if (m.sigmoid_router) {
        Vec s(static_cast<size_t>(E)), sel(static_cast<size_t>(E));
        for (int e = 0; e < E; ++e) {
          s[size_t(e)] = 1.0 / (1.0 + std::exp(-logit[size_t(e)]));
          sel[size_t(e)] = s[size_t(e)] + (opt.select_unbiased ? 0.0 : L.router_bias[size_t(e)]);
        }
        if (m.n_group > 1) {
          const int gs = E / m.n_group;
          Vec gscore(static_cast<size_t>(m.n_group));
          for (int g = 0; g < m.n_group; ++g) {
            Vec b(sel.begin() + g * gs, sel.begin() + (g + 1) * gs);
            std::sort(b.begin(), b.end(), std::greater<double>());
            gscore[size_t(g)] = opt.group_by_max || gs < 2 ? b[0] : b[0] + b[1];
          }
          std::vector<int> gorder(static_cast<size_t>(m.n_group));
          std::iota(gorder.begin(), gorder.end(), 0);
          std::stable_sort(gorder.begin(), gorder.end(), [&](int a, int b) { return gscore[size_t(a)] > gscore[size_t(b)]; });
          std::vector<bool> keep(static_cast<size_t>(E), false);
          for (int r = 0; r < m.topk_group; ++r)
            for (int e = 0; e < gs; ++e) keep[size_t(gorder[size_t(r)] * gs + e)] = true;
          for (int e = 0; e < E; ++e)
            if (!keep[size_t(e)]) sel[size_t(e)] = -INFINITY;
        }
        std::vector<int> order(static_cast<size_t>(E));
        std::iota(order.begin(), order.end(), 0);
        std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return sel[size_t(a)] > sel[size_t(b)]; });
        double kept = 0;
        for (int r = 0; r < m.top_k; ++r) kept += s[size_t(order[size_t(r)])];
        const double rsf = opt.ignore_scaling_factor ? 1.0 : m.routed_scaling_factor;
        Vec acc(static_cast<size_t>(D), 0.0);
        for (int r = 0; r < m.top_k; ++r) {
          const Expert& ex = L.experts[size_t(order[size_t(r)])];
          const double w = s[size_t(order[size_t(r)])] / (m.norm_topk_prob ? kept : 1.0) * rsf;
          swiglu(ex.gate, ex.up, ex.down, h.data(), D, int(ex.gate.size() / size_t(D)), o.data());
          for (int e = 0; e < D; ++e) acc[size_t(e)] += w * o[size_t(e)];
        }
        if (!L.shared.gate.empty()) {
          swiglu(L.shared.gate, L.shared.up, L.shared.down, h.data(), D, int(L.shared.gate.size() / size_t(D)), o.data());
          for (int e = 0; e < D; ++e) acc[size_t(e)] += o[size_t(e)];
        }
        for (int e = 0; e < D; ++e) xt[e] += acc[size_t(e)];
        continue;
      }
      const double mx = *std::max_element(logit.begin(), logit.end());
      double z = 0;
      for (double& l : logit) z += (l = std::exp(l - mx));
      for (double& l : logit) l /= z;
      // Top-k by probability; an exact tie goes to the lower expert index.
      std::vector<int> order(static_cast<size_t>(E));
      std::iota(order.begin(), order.end(), 0);
      std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return logit[size_t(a)] > logit[size_t(b)]; });
      double kept = 0;
      for (int r = 0; r < m.top_k; ++r) kept += logit[size_t(order[size_t(r)])];
      const bool renorm = m.norm_topk_prob != opt.flip_norm_topk_prob;
      Vec acc(static_cast<size_t>(D), 0.0);
      for (int r = 0; r < m.top_k; ++r) {
        const Expert& ex = L.experts[size_t(order[size_t(r)])];
        const double p = logit[size_t(order[size_t(r)])] / (renorm ? kept : 1.0);
        swiglu(ex.gate, ex.up, ex.down, h.data(), D, int(ex.gate.size() / size_t(D)), o.data());
        for (int e = 0; e < D; ++e) acc[size_t(e)] += p * o[size_t(e)];
      }
      for (int e = 0; e < D; ++e) xt[e] += acc[size_t(e)];
    }
  }
  Vec logits(static_cast<size_t>(T) * m.V);
  for (int t = 0; t < T; ++t) {
    rms_norm(&x[size_t(t) * D], m.final_norm, D, m.eps, h.data());
    matvec(m.lm_head, {}, h.data(), m.V, D, &logits[size_t(t) * m.V]);
  }
  return logits;
}

// The reference model of an hf_tiny.hpp checkpoint, read from its tensor names (HF layout).
inline Model from_glm(const hf::Spec& s, const hf::TensorMap& w);

inline Model from_hf(const hf::Spec& s, const hf::TensorMap& w) {
  if (s.glm()) return from_glm(s, w);
  auto get = [&](const std::string& n) -> const Vec& {
    auto it = w.find(n);
    if (it == w.end()) throw std::runtime_error("reference: no tensor " + n);
    return it->second.v;
  };
  auto opt = [&](const std::string& n) { return w.count(n) ? w.at(n).v : Vec{}; };
  Model m;
  m.D = s.hidden;
  m.H = s.heads;
  m.Hk = s.kv_heads;
  m.hd = s.head_dim;
  m.V = s.vocab;
  m.eps = s.eps;
  m.inv_freq = default_inv_freq(s.theta, s.head_dim);
  m.top_k = s.top_k;
  m.norm_topk_prob = s.family == "mixtral" ? true : s.norm_topk_prob;
  m.embed = get("model.embed_tokens.weight");
  m.final_norm = get("model.norm.weight");
  m.lm_head = s.tied ? m.embed : get("lm_head.weight");
  for (int l = 0; l < s.layers; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    Layer L;
    L.attn_norm = get(p + "input_layernorm.weight");
    L.ffn_norm = get(p + "post_attention_layernorm.weight");
    L.wq = get(p + "self_attn.q_proj.weight");
    L.wk = get(p + "self_attn.k_proj.weight");
    L.wv = get(p + "self_attn.v_proj.weight");
    L.wo = get(p + "self_attn.o_proj.weight");
    L.bq = opt(p + "self_attn.q_proj.bias");
    L.bk = opt(p + "self_attn.k_proj.bias");
    L.bv = opt(p + "self_attn.v_proj.bias");
    L.q_norm = opt(p + "self_attn.q_norm.weight");
    L.k_norm = opt(p + "self_attn.k_norm.weight");
    L.window = s.window_of(l);
    if (s.is_moe_layer(l)) {
      L.router = get(hf::router_tensor_name(s, l));
      for (int e = 0; e < s.experts; ++e) {
        const auto n = hf::expert_tensor_names(s, l, e);
        L.experts.push_back({get(n[0]), get(n[1]), get(n[2])});
      }
    } else {
      L.w_gate = get(p + "mlp.gate_proj.weight");
      L.w_up = get(p + "mlp.up_proj.weight");
      L.w_down = get(p + "mlp.down_proj.weight");
    }
    m.layers.push_back(std::move(L));
  }
  return m;
}

// The reference model of an hf_tiny.hpp GLM-4 checkpoint (any of the three forms), from the
// formulas of ../shared/MODEL-FAMILIES.md: fused query_key_value rows are Q [0, H·hd), K, V;
// fused gate_up rows are gate [0, I), up [I, 2I); chatglm RoPE base 10000 · rope_ratio over
// kv_channels / 2 dims; glm/glm4 base rope_theta over head_dim · partial_rotary_factor dims;
// adjacent pairs; no bias on the output projection.
inline Model from_glm(const hf::Spec& s, const hf::TensorMap& w) {
  auto get = [&](const std::string& n) -> const Vec& {
    auto it = w.find(n);
    if (it == w.end()) throw std::runtime_error("reference: no tensor " + n);
    return it->second.v;
  };
  auto rows = [](const Vec& t, size_t cols, size_t r0, size_t n) {
    return Vec(t.begin() + ptrdiff_t(r0 * cols), t.begin() + ptrdiff_t((r0 + n) * cols));
  };
  const bool chat = s.family == "chatglm";
  const size_t D = size_t(s.hidden), I = size_t(s.inter), qd = size_t(s.heads) * size_t(s.head_dim),
               kvd = size_t(s.kv_heads) * size_t(s.head_dim);
  Model m;
  m.D = s.hidden;
  m.H = s.heads;
  m.Hk = s.kv_heads;
  m.hd = s.head_dim;
  m.V = s.vocab;
  m.eps = s.eps;
  m.adjacent_pairs = true;
  m.inv_freq = chat ? default_inv_freq(10000.0 * s.rope_ratio, s.head_dim / 2)
                    : default_inv_freq(s.theta, int(s.head_dim * s.partial_rotary_factor));
  m.embed = get(chat ? "transformer.embedding.word_embeddings.weight" : "model.embed_tokens.weight");
  m.final_norm = get(chat ? "transformer.encoder.final_layernorm.weight" : "model.norm.weight");
  m.lm_head = get(chat ? "transformer.output_layer.weight" : "lm_head.weight");
  for (int l = 0; l < s.layers; ++l) {
    const std::string p = (chat ? "transformer.encoder.layers." : "model.layers.") + std::to_string(l) + ".";
    Layer L;
    L.attn_norm = get(p + "input_layernorm.weight");
    L.ffn_norm = get(p + "post_attention_layernorm.weight");
    const std::string fused = chat ? p + "self_attention.query_key_value" : p + "self_attn.qkv_proj";
    if (chat || s.fused_qkv) {
      const Vec& W = get(fused + ".weight");
      const Vec& b = get(fused + ".bias");
      L.wq = rows(W, D, 0, qd);
      L.wk = rows(W, D, qd, kvd);
      L.wv = rows(W, D, qd + kvd, kvd);
      L.bq = rows(b, 1, 0, qd);
      L.bk = rows(b, 1, qd, kvd);
      L.bv = rows(b, 1, qd + kvd, kvd);
    } else {
      L.wq = get(p + "self_attn.q_proj.weight");
      L.wk = get(p + "self_attn.k_proj.weight");
      L.wv = get(p + "self_attn.v_proj.weight");
      L.bq = get(p + "self_attn.q_proj.bias");
      L.bk = get(p + "self_attn.k_proj.bias");
      L.bv = get(p + "self_attn.v_proj.bias");
    }
    L.wo = get(chat ? p + "self_attention.dense.weight" : p + "self_attn.o_proj.weight");
    const Vec& gu = get(chat ? p + "mlp.dense_h_to_4h.weight" : p + "mlp.gate_up_proj.weight");
    L.w_gate = rows(gu, D, 0, I);
    L.w_up = rows(gu, D, I, I);
    L.w_down = get(chat ? p + "mlp.dense_4h_to_h.weight" : p + "mlp.down_proj.weight");
    if (s.family == "glm4") {
      L.post_attn_norm = get(p + "post_self_attn_layernorm.weight");
      L.post_mlp_norm = get(p + "post_mlp_layernorm.weight");
    }
    m.layers.push_back(std::move(L));
  }
  return m;
}

// max |a - b| / max |b|: the comparison measure of the architecture tests.
inline double rel_max_diff(const Vec& a, const Vec& b) {
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    num = std::max(num, std::abs(a[i] - b[i]));
    den = std::max(den, std::abs(b[i]));
  }
  return num / std::max(den, 1e-300);
}

}  // namespace kvq::test::ref
