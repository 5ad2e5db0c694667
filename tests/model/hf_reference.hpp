#pragma once
// A double-precision reference forward of the HF decoder families, written from the formulas
// (../shared/MODEL-FAMILIES.md, transformers' modeling code) with plain loops and no kvq code:
// RMSNorm, optional per-head q/k RMSNorm (Qwen3), split-half or adjacent-pair (GLM) RoPE over the
// first rotary dims from explicit inverse frequencies and attention factor, GLM-4-0414's sandwich
// norms, GQA attention with causal and sliding-window masks, SwiGLU
// MLP, MoE router softmax / top-k / renormalisation; gpt-oss's attention sinks, YaRN without
// truncation, softmax-of-top-k router with bias and MXFP4 experts (biases, interleaved gate/up,
// clamped SwiGLU) (MODEL-FAMILIES-2026.md §3); Gemma 3's (1 + w) norms, embedding x bf16(sqrt(D)),
// per-layer local / global RoPE, query_pre_attn_scalar and GeGLU (§4.1); Qwen3.5's hybrid decoder
// (§1): Gated DeltaNet layers (causal conv, L2-normed q/k, the per-token gated delta rule, the
// gated output norm) beside gated attention (per-head [query | gate] q_proj rows, sigmoid(gate) on
// the output, (1 + w) q/k norms, partial split-half RoPE), and the MoE with a sigmoid-gated shared
// expert; Qwen3-Next (§1.7): the same math read from its fused, per-key-head grouped in_proj_qkvz /
// in_proj_ba and its Qwen2-MoE layer rule (decoder_sparse_step, mlp_only_layers, norm_topk_prob).
// Slow (O(T^2) loops), for tiny models only.
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
  bool local_rope = false;  // Gemma 3 sliding layers: RoPE from Model::inv_freq_local, unscaled
  // Dense SwiGLU MLP (when router is empty)
  Vec w_gate, w_up, w_down;  // [I, D], [I, D], [D, I]
  // MoE
  Vec router;  // [E, D]
  std::vector<Expert> experts;
  Vec router_bias;  // [E] e_score_correction_bias (sigmoid router: selection only)
  Expert shared;    // shared experts as one SwiGLU, unweighted; empty gate: none
  // gpt-oss. sinks [H]: one logit per query head in each softmax's denominator (no value).
  Vec sinks;
  // gpt-oss MoE (when gu_blocks is set): router logits = router x + router_logit_bias, the top-k
  // logits softmaxed among themselves; expert e as shipped in MXFP4 (hf::mxfp4_decode):
  // h = W_gu[e] x + gu_bias[e] (rows 2i gate_i, 2i+1 up_i), gate = min(gate, L), up = clamp(up, -L,
  // L), act = gate · sigmoid(1.702 gate) · (up + 1), y = W_d[e] act + down_bias[e].
  Vec router_logit_bias;                                           // [E]
  std::vector<uint8_t> gu_blocks, gu_scales, down_blocks, down_scales;  // [E, 2I, D/32, 16] ...
  Vec gu_bias, down_bias;                                          // [E, 2I], [E, D]
  int n_experts = 0, expert_inter = 0;                             // E, I
  double swiglu_limit = 7.0;
  // Qwen3.5-MoE: the shared expert's output x sigmoid(shared_gate · x) ([1, D]); empty: ungated.
  Vec shared_gate;
  // Qwen3.5 Gated DeltaNet (a layer without a KV cache; in place of the attention when in_qkv is
  // set): in_qkv [2·Hk·dk + Hv·dv, D], in_z [Hv·dv, D], in_b / in_a [Hv, D], conv [conv_dim][K]
  // (tap K-1 on the current token), dt_bias / A_log [Hv], gdn_norm [dv] (plain w), out [D, Hv·dv].
  Vec in_qkv, in_z, in_b, in_a, conv, dt_bias, A_log, gdn_norm, out_proj;
  bool linear() const { return !in_qkv.empty(); }
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
  // Gemma 3. Every RMSNorm (q/k norms and the final norm included) scales by norm_offset + w.
  // The embedding rows are multiplied by embed_multiplier (bf16(sqrt(D)));
  // embed_multiplier_exact is the unrounded value (Options::exact_embed_scale). Layers with
  // local_rope turn by inv_freq_local; the others by inv_freq / rope_linear_factor. attn_scale > 0
  // replaces 1/sqrt(hd) (query_pre_attn_scalar^-0.5). gelu_tanh: the MLP is GeGLU with the tanh
  // GELU instead of SwiGLU. final_softcap > 0: logits = cap · tanh(logits / cap).
  double norm_offset = 0.0;
  double embed_multiplier = 1.0, embed_multiplier_exact = 1.0;
  Vec inv_freq_local;
  double rope_linear_factor = 1.0;
  double attn_scale = 0.0;
  bool gelu_tanh = false;
  double final_softcap = 0.0;
  // Qwen3.5: q projections ([2·H·hd, D]) hold per head hd query rows then hd gate rows; the
  // attention output is multiplied by sigmoid(gate) before o_proj. The Gated DeltaNet's shape:
  // lin_Hk q/k heads of lin_dk, lin_Hv value heads of lin_dv, conv_kernel taps.
  bool attn_output_gate = false;
  int lin_Hk = 0, lin_Hv = 0, lin_dk = 0, lin_dv = 0, conv_kernel = 0;
  // The decoder layers with attention (a KV cache), in order: what kvq calls its layers.
  std::vector<int> attn_layers() const {
    std::vector<int> out;
    for (size_t l = 0; l < layers.size(); ++l)
      if (!layers[l].linear()) out.push_back(int(l));
    return out;
  }
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
  // gpt-oss controls: sinks left out; a window one key wider (W + 1); MXFP4 nibbles read high
  // first; the SwiGLU clamp left out; the router softmaxed over all experts before the top-k (no
  // renormalisation); gate/up read as halves [0, I) / [I, 2I) instead of interleaved rows.
  bool drop_sinks = false, window_plus_one = false, swap_nibbles = false, drop_swiglu_clamp = false;
  bool softmax_before_topk = false, gate_up_halves = false;
  // Gemma 3 controls: norms scale by w instead of 1 + w; the global RoPE (theta, scaled) on the
  // local layers; the local RoPE on the global layers; the linear factor on every layer; a window
  // one key narrower (W - 1); 1/sqrt(head_dim) instead of query_pre_attn_scalar^-0.5; the
  // embedding scaled by the exact sqrt(D); the erf GELU instead of the tanh form.
  bool norm_as_w = false, global_rope_on_local = false, local_rope_on_global = false, scale_rope_everywhere = false;
  bool window_minus_one = false, scale_by_head_dim = false, exact_embed_scale = false, erf_gelu = false;
  // Qwen3.5 controls (norm_as_w, skip_qk_norm and flip_norm_topk_prob apply too): the attention's
  // output gate left out; q_proj's rows read as all queries then all gates (instead of [query |
  // gate] per head); RoPE pairing dim i with i + head_dim/2 (instead of i + rotary_dim/2). Gated
  // DeltaNet: the decay exp(g) applied after the delta update instead of before; the output norm as
  // (1 + w) instead of w; value head j served by q/k head j % Hk instead of j / (Hv/Hk); the conv
  // reading one token ahead (taps t-K+2 .. t+1) or with its taps reversed (tap 0 on the current
  // token); the silu after the conv left out; the q/k L2 norm left out; the q scale dk^-0.5 left out;
  // the silu(z) gate of the output norm left out. MoE: the shared expert's sigmoid gate left out.
  bool skip_output_gate = false, gate_halves = false, rope_pair_half_head = false;
  bool decay_after_update = false, gdn_norm_one_plus_w = false, v_head_modulo = false, conv_ahead = false;
  bool conv_reversed = false, skip_conv_silu = false, skip_l2norm = false, drop_q_scale = false, skip_z_gate = false;
  bool drop_shared_gate = false;
  bool swap_qk_split = false;  // the conv output read as [k | q | v] instead of [q | k | v]
  int64_t pos0 = 0;
};

// YaRN (HF _compute_yarn_parameters; official _compute_concentration_and_inv_freq), from
// MODEL-FAMILIES-2026.md §3.2: the correction dims of beta_fast / beta_slow rotations over the
// original context, floored / ceiled only when truncate, clamped to [0, d - 1]; inv_freq_i =
// (1/θ^(2i/d))(1 − ramp_i) + (1/(F·θ^(2i/d))) ramp_i; attention factor 0.1·ln F + 1.
struct Yarn {
  Vec inv_freq;
  double low = 0, high = 0, attention_factor = 1;
};
inline Yarn yarn(double theta, int d, double factor, double original, double beta_fast, double beta_slow,
                 bool truncate) {
  const double pi = std::acos(-1.0);
  auto corr = [&](double rot) { return d * std::log(original / (rot * 2 * pi)) / (2 * std::log(theta)); };
  Yarn y;
  y.low = corr(beta_fast);
  y.high = corr(beta_slow);
  if (truncate) {
    y.low = std::floor(y.low);
    y.high = std::ceil(y.high);
  }
  y.low = std::max(y.low, 0.0);
  y.high = std::min(y.high, double(d - 1));
  const double span = y.high == y.low ? 0.001 : y.high - y.low;
  for (int i = 0; i < d / 2; ++i) {
    const double ramp = std::clamp((i - y.low) / span, 0.0, 1.0);
    const double base = std::pow(theta, -2.0 * i / d);
    y.inv_freq.push_back(base * (1 - ramp) + base / factor * ramp);
  }
  y.attention_factor = 0.1 * std::log(factor) + 1.0;
  return y;
}

// What the forward saw per attention layer, pre-RoPE (after the q/k norm; Qwen3.5: the query rows,
// not the gate): [T][H][hd], [T][Hk][hd]. A Gated DeltaNet layer adds nothing: the entries are
// kvq's KV layers.
struct Trace {
  std::vector<Vec> q, k, v;
};

// The BF16 emulation (bf16_bound.hpp): while on, every projection of forward() below — q/k/v, o,
// the MLP's and the experts' gate/up/down, Qwen3.5's Gated DeltaNet in_proj_qkv / z / b / a and
// out_proj; not the router, not Qwen3.5-MoE's shared_expert_gate (a [1, D] score kept in fp32 like
// the router), not the head — rounds its input and its product to BF16 (nearest even) and adds the
// bias after, where kvq's --precision bf16 rounds. The DeltaNet's conv, recurrence and norms stay
// float64. The
// float64 reference of the BF16 forward: the same decisions (a top-k router sees the same scores to
// fp32 accuracy), the rest in float64. Bf16Emulation turns it on for a scope.
inline bool& emulate_bf16() {
  static thread_local bool on = false;
  return on;
}
// Negative controls of the emulation: leave one of its roundings out.
struct Bf16Control {
  bool skip_input = false, skip_product = false;
  // > 0: each product is multiplied by (1 + noise · u), u uniform in [-1/2, 1/2) from a fixed LCG,
  // before it is rounded: the size of fp32 accumulation's error, to measure how far the emulation
  // itself moves when a value near a BF16 rounding boundary rounds the other way.
  double noise = 0;
  uint64_t state = 1;
  double next_u() {
    state = state * 6364136223846793005ULL + 1442695040888963407ULL;
    return double(state >> 11) / 9007199254740992.0 - 0.5;
  }
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

// x · rsqrt(mean x² + eps) · (offset + w): offset 1 is Gemma 3's norm.
inline void rms_norm(const double* x, const Vec& w, int n, double eps, double* out, double offset = 0.0) {
  double ss = 0;
  for (int i = 0; i < n; ++i) ss += x[i] * x[i];
  const double inv = 1.0 / std::sqrt(ss / n + eps);
  for (int i = 0; i < n; ++i) out[i] = x[i] * inv * (offset + w[size_t(i)]);
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
  if (bf16_control().noise > 0)
    for (int o = 0; o < out; ++o) y[o] *= 1 + bf16_control().noise * bf16_control().next_u();
  for (int o = 0; o < out; ++o)
    y[o] = (bf16_control().skip_product ? y[o] : hf::bf16_round(y[o])) + (b.empty() ? 0.0 : b[size_t(o)]);
}

inline double silu(double x) { return x / (1.0 + std::exp(-x)); }
// gelu_pytorch_tanh: 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))
inline double gelu_tanh(double x) {
  const double pi = std::acos(-1.0);
  return 0.5 * x * (1.0 + std::tanh(std::sqrt(2.0 / pi) * (x + 0.044715 * x * x * x)));
}
inline double gelu_erf(double x) { return 0.5 * x * (1.0 + std::erf(x / std::sqrt(2.0))); }

enum class Act { kSilu, kGeluTanh, kGeluErf };

// down(act(gate x) ⊙ up x): SwiGLU, or GeGLU (Gemma) with the tanh or the erf GELU.
inline void swiglu(const Vec& gate, const Vec& up, const Vec& down, const double* x, int D, int I, double* y,
                   Act act = Act::kSilu) {
  Vec g(static_cast<size_t>(I)), u(static_cast<size_t>(I));
  proj(gate, {}, x, I, D, g.data());
  proj(up, {}, x, I, D, u.data());
  for (int i = 0; i < I; ++i) {
    const double a = g[size_t(i)];
    g[size_t(i)] = (act == Act::kSilu ? silu(a) : act == Act::kGeluTanh ? gelu_tanh(a) : gelu_erf(a)) * u[size_t(i)];
  }
  proj(down, {}, g.data(), D, I, y);
}

// Split-half pairs dim j with j + offset (offset 0: the rotary half, inv_freq.size()).
inline void rope(double* head, const Vec& inv_freq, double af, int64_t pos, bool adjacent = false, size_t offset = 0) {
  const size_t half = inv_freq.size(), off = offset ? offset : half;
  for (size_t j = 0; j < half; ++j) {
    double& a = adjacent ? head[2 * j] : head[j];
    double& b = adjacent ? head[2 * j + 1] : head[j + off];
    const double ang = double(pos) * inv_freq[j], c = af * std::cos(ang), s = af * std::sin(ang);
    const double a0 = a, b0 = b;
    a = a0 * c - b0 * s;
    b = b0 * c + a0 * s;
  }
}

inline double sigmoid(double x) { return 1.0 / (1.0 + std::exp(-x)); }
inline double softplus(double x) { return x > 30 ? x : std::log1p(std::exp(x)); }

// Qwen3.5's causal depthwise conv over time, then silu: out[t][c] = silu(Σ_j W[c][j] · m[t-K+1+j][c])
// with m[<0] = 0 (tap K-1 reads the current token). m, out: [T][C]; W: [C][K] (conv1d.weight [C, 1, K]).
inline Vec causal_conv_silu(const Vec& m, const Vec& W, int T, int C, int K, const Options& opt = {}) {
  Vec out(size_t(T) * C);
  const int ahead = opt.conv_ahead ? 1 : 0;
  for (int t = 0; t < T; ++t)
    for (int c = 0; c < C; ++c) {
      double acc = 0;
      for (int j = 0; j < K; ++j) {
        const int src = t - K + 1 + j + ahead;
        if (src < 0 || src >= T) continue;
        acc += W[size_t(c) * K + size_t(opt.conv_reversed ? K - 1 - j : j)] * m[size_t(src) * C + c];
      }
      out[size_t(t) * C + c] = opt.skip_conv_silu ? acc : silu(acc);
    }
  return out;
}

// The gated delta rule, token by token (§1.4; HF torch_recurrent_gated_delta_rule). q, k: [T][Hk][dk]
// (after the conv), v: [T][Hv][dv], g, beta: [T][Hv]. q and k are L2-normed per head (x · rsqrt(Σx² +
// 1e-6)), q x dk^-0.5; value head j reads q/k head j / (Hv / Hk). Per value head, S [dk][dv] = 0, and
// per token: S *= exp(g); kv_mem = Sᵀk; δ = (v − kv_mem) · beta; S += k ⊗ δ; o = Sᵀq. Returns o [T][Hv][dv].
inline Vec gated_delta_rule(Vec q, Vec k, const Vec& v, const Vec& g, const Vec& beta, int T, int Hk, int Hv, int dk,
                            int dv, const Options& opt = {}) {
  for (Vec* x : {&q, &k})
    for (size_t r = 0; r < size_t(T) * Hk; ++r) {
      double* row = x->data() + r * size_t(dk);
      double ss = 0;
      for (int i = 0; i < dk; ++i) ss += row[i] * row[i];
      const double inv = opt.skip_l2norm ? 1.0 : 1.0 / std::sqrt(ss + 1e-6);
      const double sc = x == &q && !opt.drop_q_scale ? 1.0 / std::sqrt(double(dk)) : 1.0;
      for (int i = 0; i < dk; ++i) row[i] *= inv * sc;
    }
  Vec o(size_t(T) * Hv * dv, 0.0), S(size_t(dk) * dv), delta(static_cast<size_t>(dv));
  for (int j = 0; j < Hv; ++j) {
    const int kh = opt.v_head_modulo ? j % Hk : j / (Hv / Hk);
    std::fill(S.begin(), S.end(), 0.0);
    for (int t = 0; t < T; ++t) {
      const double* qt = &q[(size_t(t) * Hk + kh) * dk];
      const double* kt = &k[(size_t(t) * Hk + kh) * dk];
      const double* vt = &v[(size_t(t) * Hv + j) * dv];
      const double decay = std::exp(g[size_t(t) * Hv + j]), b = beta[size_t(t) * Hv + j];
      if (!opt.decay_after_update)
        for (double& e : S) e *= decay;
      for (int c = 0; c < dv; ++c) {
        double acc = 0;
        for (int i = 0; i < dk; ++i) acc += S[size_t(i) * dv + c] * kt[i];
        delta[size_t(c)] = (vt[c] - acc) * b;
      }
      for (int i = 0; i < dk; ++i)
        for (int c = 0; c < dv; ++c) S[size_t(i) * dv + c] += kt[i] * delta[size_t(c)];
      if (opt.decay_after_update)
        for (double& e : S) e *= decay;
      double* ot = &o[(size_t(t) * Hv + j) * dv];
      for (int c = 0; c < dv; ++c) {
        double acc = 0;
        for (int i = 0; i < dk; ++i) acc += S[size_t(i) * dv + c] * qt[i];
        ot[c] = acc;
      }
    }
  }
  return o;
}

// One Gated DeltaNet layer's token mixer (§1.4) on the normed rows h [T][D]: m = in_proj_qkv h,
// causal conv + silu, split [q (Hk·dk) | k (Hk·dk) | v (Hv·dv)]; z = in_proj_z h; beta = sigmoid(in_proj_b
// h); g = −exp(A_log) · softplus(in_proj_a h + dt_bias); the gated delta rule; per value head
// rmsnorm(o) · w · silu(z) (eps rms_norm_eps, plain w); out_proj. Returns [T][D].
inline Vec gated_delta_net(const Model& m, const Layer& L, const Vec& h, int T, const Options& opt) {
  const int D = m.D, Hk = m.lin_Hk, Hv = m.lin_Hv, dk = m.lin_dk, dv = m.lin_dv, K = m.conv_kernel;
  const int Kd = Hk * dk, Vd = Hv * dv, C = 2 * Kd + Vd;
  Vec mix(size_t(T) * C), z(size_t(T) * Vd), b(size_t(T) * Hv), a(size_t(T) * Hv);
  for (int t = 0; t < T; ++t) {
    const double* ht = &h[size_t(t) * D];
    proj(L.in_qkv, {}, ht, C, D, &mix[size_t(t) * C]);
    proj(L.in_z, {}, ht, Vd, D, &z[size_t(t) * Vd]);
    proj(L.in_b, {}, ht, Hv, D, &b[size_t(t) * Hv]);
    proj(L.in_a, {}, ht, Hv, D, &a[size_t(t) * Hv]);
  }
  const Vec mc = causal_conv_silu(mix, L.conv, T, C, K, opt);
  Vec q(size_t(T) * Kd), k(size_t(T) * Kd), v(size_t(T) * Vd), g(size_t(T) * Hv), beta(size_t(T) * Hv);
  for (int t = 0; t < T; ++t) {
    const double* r = &mc[size_t(t) * C];
    std::copy(r, r + Kd, &(opt.swap_qk_split ? k : q)[size_t(t) * Kd]);
    std::copy(r + Kd, r + 2 * Kd, &(opt.swap_qk_split ? q : k)[size_t(t) * Kd]);
    std::copy(r + 2 * Kd, r + C, &v[size_t(t) * Vd]);
    for (int j = 0; j < Hv; ++j) {
      const size_t i = size_t(t) * Hv + j;
      beta[i] = sigmoid(b[i]);
      g[i] = -std::exp(L.A_log[size_t(j)]) * softplus(a[i] + L.dt_bias[size_t(j)]);
    }
  }
  const Vec o = gated_delta_rule(q, k, v, g, beta, T, Hk, Hv, dk, dv, opt);
  Vec y(static_cast<size_t>(Vd)), out(size_t(T) * D);
  for (int t = 0; t < T; ++t) {
    for (int j = 0; j < Hv; ++j) {
      const size_t at = (size_t(t) * Hv + j) * dv;
      rms_norm(&o[at], L.gdn_norm, dv, m.eps, &y[size_t(j) * dv], opt.gdn_norm_one_plus_w ? 1.0 : 0.0);
      if (!opt.skip_z_gate)
        for (int c = 0; c < dv; ++c) y[size_t(j) * dv + c] *= silu(z[at + c]);
    }
    proj(L.out_proj, {}, y.data(), D, Vd, &out[size_t(t) * D]);
  }
  return out;
}

// gpt-oss's MoE block of one token (see Layer): out = Σ_{e in top-k} w_e · y_e.
inline void gpt_oss_moe(const Layer& L, const std::vector<Vec>& gu_w, const std::vector<Vec>& down_w, const double* x,
                        int D, int top_k, const Options& opt, double* out) {
  const int E = L.n_experts, I = L.expert_inter;
  Vec logit(static_cast<size_t>(E));
  matvec(L.router, L.router_logit_bias, x, E, D, logit.data());
  std::vector<int> order(static_cast<size_t>(E));
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return logit[size_t(a)] > logit[size_t(b)]; });
  Vec w(static_cast<size_t>(top_k));
  if (opt.softmax_before_topk) {
    const double mx = logit[size_t(order[0])];
    double z = 0;
    for (double l : logit) z += std::exp(l - mx);
    for (int r = 0; r < top_k; ++r) w[size_t(r)] = std::exp(logit[size_t(order[size_t(r)])] - mx) / z;
  } else {
    const double mx = logit[size_t(order[0])];
    double z = 0;
    for (int r = 0; r < top_k; ++r) z += (w[size_t(r)] = std::exp(logit[size_t(order[size_t(r)])] - mx));
    for (double& p : w) p /= z;
  }
  const double lim = L.swiglu_limit;
  Vec hgu(size_t(2) * I), act(static_cast<size_t>(I)), y(static_cast<size_t>(D)), gb, db;
  std::fill(out, out + D, 0.0);
  for (int r = 0; r < top_k; ++r) {
    const int e = order[size_t(r)];
    gb.assign(L.gu_bias.begin() + ptrdiff_t(size_t(e) * 2 * I), L.gu_bias.begin() + ptrdiff_t(size_t(e + 1) * 2 * I));
    db.assign(L.down_bias.begin() + ptrdiff_t(size_t(e) * D), L.down_bias.begin() + ptrdiff_t(size_t(e + 1) * D));
    proj(gu_w[size_t(e)], gb, x, 2 * I, D, hgu.data());
    for (int i = 0; i < I; ++i) {
      double g = opt.gate_up_halves ? hgu[size_t(i)] : hgu[size_t(2 * i)];
      double u = opt.gate_up_halves ? hgu[size_t(I + i)] : hgu[size_t(2 * i + 1)];
      if (!opt.drop_swiglu_clamp) {
        g = std::min(g, lim);
        u = std::clamp(u, -lim, lim);
      }
      act[size_t(i)] = g / (1.0 + std::exp(-1.702 * g)) * (u + 1.0);
    }
    proj(down_w[size_t(e)], db, act.data(), D, I, y.data());
    for (int d = 0; d < D; ++d) out[d] += w[size_t(r)] * y[size_t(d)];
  }
}

// Qwen3-Next's fused Gated DeltaNet projections, read back into Qwen3.5's separate ones
// (modeling_qwen3_next.py fix_query_key_value_ordering): in_proj_qkvz's output viewed as [Hk, G],
// G = 2·dk + 2·r·dv, r = Hv / Hk, splits per key head h into [q_h (dk) | k_h (dk) | v (r·dv: value
// heads h·r .. h·r + r − 1, dv each) | z (r·dv, the same heads)]; the conv then runs over [all q | all
// k | all v] in head order. So row c of that order (and row c of z) is row src of in_proj_qkvz:
//   q head h, dim i: h·G + i;           k head h, dim i: h·G + dk + i;
//   v head j = h·r + u, dim i: h·G + 2·dk + u·dv + i;   z head j, dim i: h·G + 2·dk + r·dv + u·dv + i.
// in_proj_ba's output viewed as [Hk, 2r] splits per key head into [b (r) | a (r)]: b_j is row
// h·2r + u, a_j row h·2r + r + u. contiguous (the negative control): read as [all q; all k; all v;
// all z] and [all b; all a] instead. W: [rows][D] row-major; fills qkv [2·Hk·dk + Hv·dv][D], z
// [Hv·dv][D] (or b, a [Hv][D]).
inline void ungroup_qkvz(const Vec& W, int Hk, int Hv, int dk, int dv, int D, bool contiguous, Vec& qkv, Vec& z) {
  const int r = Hv / Hk, G = 2 * dk + 2 * r * dv, Kd = Hk * dk, Vd = Hv * dv;
  if (Hv % Hk || W.size() != size_t(Hk) * G * D)
    throw std::runtime_error("reference: in_proj_qkvz of " + std::to_string(W.size() / size_t(std::max(D, 1))) +
                             " rows, expected " + std::to_string(Hk * G));
  auto src = [&](int c) {  // c over [q (Kd) | k (Kd) | v (Vd) | z (Vd)]
    if (contiguous) return c;
    if (c < Kd) return (c / dk) * G + c % dk;
    if ((c -= Kd) < Kd) return (c / dk) * G + dk + c % dk;
    int off = 2 * dk;
    if ((c -= Kd) >= Vd) {
      c -= Vd;
      off += r * dv;
    }
    const int j = c / dv, i = c % dv;
    return (j / r) * G + off + (j % r) * dv + i;
  };
  qkv.assign(size_t(2 * Kd + Vd) * D, 0.0);
  z.assign(size_t(Vd) * D, 0.0);
  for (int c = 0; c < 2 * Kd + 2 * Vd; ++c) {
    double* dst = c < 2 * Kd + Vd ? &qkv[size_t(c) * D] : &z[size_t(c - 2 * Kd - Vd) * D];
    std::copy_n(&W[size_t(src(c)) * D], D, dst);
  }
}
inline void ungroup_ba(const Vec& W, int Hk, int Hv, int D, bool contiguous, Vec& b, Vec& a) {
  const int r = Hv / Hk;
  if (Hv % Hk || W.size() != size_t(2) * Hv * D)
    throw std::runtime_error("reference: in_proj_ba of " + std::to_string(W.size() / size_t(std::max(D, 1))) +
                             " rows, expected " + std::to_string(2 * Hv));
  b.assign(size_t(Hv) * D, 0.0);
  a.assign(size_t(Hv) * D, 0.0);
  for (int j = 0; j < Hv; ++j) {
    const int sb = contiguous ? j : (j / r) * 2 * r + j % r, sa = contiguous ? Hv + j : (j / r) * 2 * r + r + j % r;
    std::copy_n(&W[size_t(sb) * D], D, &b[size_t(j) * D]);
    std::copy_n(&W[size_t(sa) * D], D, &a[size_t(j) * D]);
  }
}

}  // namespace detail

// Logits [T][V] of one causal window of ids at positions pos0 ... pos0 + T - 1.
inline Vec forward(const Model& m, const std::vector<int>& ids, const Options& opt = {}, Trace* trace = nullptr) {
  using namespace detail;
  const int T = int(ids.size()), D = m.D, H = m.H, Hk = m.Hk, hd = m.hd, G = H / Hk;
  const double no = opt.norm_as_w ? 0.0 : m.norm_offset;  // every norm's offset
  const double emb = opt.exact_embed_scale ? m.embed_multiplier_exact : m.embed_multiplier;
  const Act act = !m.gelu_tanh ? Act::kSilu : opt.erf_gelu ? Act::kGeluErf : Act::kGeluTanh;
  Vec x(static_cast<size_t>(T) * D);
  for (int t = 0; t < T; ++t)
    std::copy_n(m.embed.begin() + ptrdiff_t(static_cast<size_t>(ids[size_t(t)]) * D), D, x.begin() + ptrdiff_t(static_cast<size_t>(t) * D));
  if (emb != 1.0)
    for (double& e : x) e *= emb;
  if (trace) *trace = Trace{};
  Vec h(static_cast<size_t>(D)), q(static_cast<size_t>(T) * H * hd), k(static_cast<size_t>(T) * Hk * hd), v(static_cast<size_t>(T) * Hk * hd), tmp(static_cast<size_t>(hd));
  Vec qg(m.attn_output_gate ? size_t(2) * H * hd : 0), gate(m.attn_output_gate ? size_t(T) * H * hd : 0);
  const size_t pair_offset = opt.rope_pair_half_head ? size_t(hd / 2) : 0;
  for (const Layer& L : m.layers) {
    const bool sandwich = !L.post_attn_norm.empty() && !opt.skip_sandwich_norm;
    Vec o(static_cast<size_t>(D)), tmp2(static_cast<size_t>(D));
    if (L.linear()) {  // Qwen3.5 Gated DeltaNet: a token mixer without K/V
      Vec hn(static_cast<size_t>(T) * D);
      for (int t = 0; t < T; ++t) rms_norm(&x[size_t(t) * D], L.attn_norm, D, m.eps, &hn[size_t(t) * D], no);
      const Vec mixed = gated_delta_net(m, L, hn, T, opt);
      for (size_t i = 0; i < x.size(); ++i) x[i] += mixed[i];
    } else {
      for (int t = 0; t < T; ++t) {
        rms_norm(&x[size_t(t) * D], L.attn_norm, D, m.eps, h.data(), no);
        if (m.attn_output_gate) {  // per head [query | gate] rows (gate_halves: all queries, then all gates)
          proj(L.wq, L.bq, h.data(), 2 * H * hd, D, qg.data());
          for (int hh = 0; hh < H; ++hh)
            for (int e = 0; e < hd; ++e) {
              const size_t qi = opt.gate_halves ? size_t(hh) * hd + e : size_t(hh) * 2 * hd + e;
              const size_t gi = opt.gate_halves ? size_t(H + hh) * hd + e : size_t(hh) * 2 * hd + hd + e;
              q[(size_t(t) * H + hh) * hd + e] = qg[qi];
              gate[(size_t(t) * H + hh) * hd + e] = qg[gi];
            }
        } else {
          proj(L.wq, L.bq, h.data(), H * hd, D, &q[size_t(t) * H * hd]);
        }
        proj(L.wk, L.bk, h.data(), Hk * hd, D, &k[size_t(t) * Hk * hd]);
        proj(L.wv, L.bv, h.data(), Hk * hd, D, &v[size_t(t) * Hk * hd]);
        if (!L.q_norm.empty() && !opt.skip_qk_norm) {
          for (int hh = 0; hh < H; ++hh) {
            double* r = &q[(static_cast<size_t>(t) * H + hh) * hd];
            rms_norm(r, L.q_norm, hd, m.eps, tmp.data(), no);
            std::copy(tmp.begin(), tmp.end(), r);
          }
          for (int hh = 0; hh < Hk; ++hh) {
            double* r = &k[(static_cast<size_t>(t) * Hk + hh) * hd];
            rms_norm(r, L.k_norm, hd, m.eps, tmp.data(), no);
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
      // This layer's frequencies: the global ones scaled by rope_linear_factor, or (Gemma 3 local
      // layers) inv_freq_local unscaled.
      const bool local = !m.inv_freq_local.empty() && (L.local_rope ? !opt.global_rope_on_local : opt.local_rope_on_global);
      Vec inv_freq = local ? m.inv_freq_local : m.inv_freq;
      const double div = local && !opt.scale_rope_everywhere ? 1.0 : m.rope_linear_factor;
      if (div != 1.0)
        for (double& f : inv_freq) f /= div;
      for (int t = 0; t < T; ++t) {
        for (int hh = 0; hh < H; ++hh)
          rope(&q[(size_t(t) * H + hh) * hd], inv_freq, m.attention_factor, opt.pos0 + t, adj, pair_offset);
        for (int hh = 0; hh < Hk; ++hh)
          rope(&k[(size_t(t) * Hk + hh) * hd], inv_freq, m.attention_factor, opt.pos0 + t, adj, pair_offset);
      }
      const int W = opt.ignore_window ? 0
                                      : L.window + (L.window > 0 && opt.window_plus_one ? 1 : 0) -
                                            (L.window > 1 && opt.window_minus_one ? 1 : 0);
      const bool own_scale = m.attn_scale > 0 && !opt.scale_by_head_dim;
      const bool sinks = !L.sinks.empty() && !opt.drop_sinks;
      Vec attn(static_cast<size_t>(H) * hd), score(static_cast<size_t>(T));
      Vec x_new = x;
      for (int i = 0; i < T; ++i) {
        for (int hh = 0; hh < H; ++hh) {
          const int kh = hh / G;
          const double* qi = &q[(static_cast<size_t>(i) * H + hh) * hd];
          // m = max(max_j z_j, sink_h): the sink joins the softmax as one more logit.
          double mx = sinks ? L.sinks[size_t(hh)] : -INFINITY;
          for (int j = 0; j <= i; ++j) {
            score[size_t(j)] = -INFINITY;
            if (W > 0 && i - j >= W) continue;
            const double* kj = &k[(static_cast<size_t>(j) * Hk + kh) * hd];
            double s = 0;
            for (int e = 0; e < hd; ++e) s += qi[e] * kj[e];
            score[size_t(j)] = own_scale ? s * m.attn_scale : s / std::sqrt(double(hd));
            mx = std::max(mx, score[size_t(j)]);
          }
          double z = sinks ? std::exp(L.sinks[size_t(hh)] - mx) : 0.0;
          for (int j = 0; j <= i; ++j) z += std::exp(score[size_t(j)] - mx);
          for (int e = 0; e < hd; ++e) attn[size_t(hh) * hd + e] = 0;
          for (int j = 0; j <= i; ++j) {
            const double p = std::exp(score[size_t(j)] - mx) / z;
            const double* vj = &v[(static_cast<size_t>(j) * Hk + kh) * hd];
            for (int e = 0; e < hd; ++e) attn[size_t(hh) * hd + e] += p * vj[e];
          }
        }
        if (m.attn_output_gate && !opt.skip_output_gate)
          for (int e = 0; e < H * hd; ++e) attn[size_t(e)] *= sigmoid(gate[size_t(i) * H * hd + size_t(e)]);
        proj(L.wo, L.bo, attn.data(), D, H * hd, o.data());
        if (sandwich) {
          rms_norm(o.data(), L.post_attn_norm, D, m.eps, tmp2.data(), no);
          o.swap(tmp2);
        }
        for (int e = 0; e < D; ++e) x_new[size_t(i) * D + e] += o[size_t(e)];
      }
      x.swap(x_new);
    }

    std::vector<Vec> gu_w, down_w;  // gpt-oss: the experts decoded from MXFP4, [2I, D] and [D, I]
    if (!L.gu_blocks.empty()) {
      const int E = L.n_experts, I = L.expert_inter;
      Vec all(size_t(E) * 2 * I * D);
      hf::mxfp4_decode(L.gu_blocks.data(), L.gu_scales.data(), int64_t(E) * 2 * I, D, all.data(), opt.swap_nibbles);
      for (int e = 0; e < E; ++e) gu_w.emplace_back(all.begin() + ptrdiff_t(size_t(e) * 2 * I * D), all.begin() + ptrdiff_t(size_t(e + 1) * 2 * I * D));
      all.assign(size_t(E) * D * I, 0.0);
      hf::mxfp4_decode(L.down_blocks.data(), L.down_scales.data(), int64_t(E) * D, I, all.data(), opt.swap_nibbles);
      for (int e = 0; e < E; ++e) down_w.emplace_back(all.begin() + ptrdiff_t(size_t(e) * D * I), all.begin() + ptrdiff_t(size_t(e + 1) * D * I));
    }
    for (int t = 0; t < T; ++t) {
      double* xt = &x[size_t(t) * D];
      rms_norm(xt, L.ffn_norm, D, m.eps, h.data(), no);
      if (!L.gu_blocks.empty()) {
        gpt_oss_moe(L, gu_w, down_w, h.data(), D, m.top_k, opt, o.data());
        for (int e = 0; e < D; ++e) xt[e] += o[size_t(e)];
        continue;
      }
      if (L.router.empty()) {
        const int I = int(L.w_gate.size() / size_t(D));
        swiglu(L.w_gate, L.w_up, L.w_down, h.data(), D, I, o.data(), act);
        if (sandwich) {
          rms_norm(o.data(), L.post_mlp_norm, D, m.eps, tmp2.data(), no);
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
      if (!L.shared.gate.empty()) {  // Qwen3.5-MoE: x sigmoid(shared_expert_gate · x)
        swiglu(L.shared.gate, L.shared.up, L.shared.down, h.data(), D, int(L.shared.gate.size() / size_t(D)), o.data());
        double sg = 1.0;
        if (!L.shared_gate.empty() && !opt.drop_shared_gate) {
          matvec(L.shared_gate, {}, h.data(), 1, D, &sg);
          sg = sigmoid(sg);
        }
        for (int e = 0; e < D; ++e) acc[size_t(e)] += sg * o[size_t(e)];
      }
      for (int e = 0; e < D; ++e) xt[e] += acc[size_t(e)];
    }
  }
  Vec logits(static_cast<size_t>(T) * m.V);
  for (int t = 0; t < T; ++t) {
    rms_norm(&x[size_t(t) * D], m.final_norm, D, m.eps, h.data(), no);
    matvec(m.lm_head, {}, h.data(), m.V, D, &logits[size_t(t) * m.V]);
  }
  if (m.final_softcap > 0)
    for (double& l : logits) l = m.final_softcap * std::tanh(l / m.final_softcap);
  return logits;
}

// The reference model of an hf_tiny.hpp checkpoint, read from its tensor names (HF layout).
inline Model from_glm(const hf::Spec& s, const hf::TensorMap& w);
inline Model from_gpt_oss(const hf::Spec& s, const hf::TensorMap& w);
inline Model from_gemma3(const hf::Spec& s, const hf::TensorMap& w);
inline Model from_qwen3_5(const hf::Spec& s, const hf::TensorMap& w);
inline Model from_qwen3_next(const hf::Spec& s, const hf::TensorMap& w);

inline Model from_hf(const hf::Spec& s, const hf::TensorMap& w) {
  if (s.glm()) return from_glm(s, w);
  if (s.gemma3()) return from_gemma3(s, w);
  if (s.gpt_oss()) return from_gpt_oss(s, w);
  if (s.qwen3_5()) return from_qwen3_5(s, w);
  if (s.qwen3_next()) return from_qwen3_next(s, w);
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

// The reference model of an hf_tiny.hpp gpt-oss checkpoint (MODEL-FAMILIES-2026.md §3), from its
// written tensors: the experts from their MXFP4 blocks and scales (decoded in forward()), YaRN
// without truncation (rope_scaling as make_gpt_oss_config writes it), the window of each layer
// from its layer type, untied head, no embedding scale.
inline Model from_gpt_oss(const hf::Spec& s, const hf::TensorMap& w) {
  auto t = [&](const std::string& n) -> const hf::Tensor& {
    auto it = w.find(n);
    if (it == w.end()) throw std::runtime_error("reference: no tensor " + n);
    return it->second;
  };
  Model m;
  m.D = s.hidden;
  m.H = s.heads;
  m.Hk = s.kv_heads;
  m.hd = s.head_dim;
  m.V = s.vocab;
  m.eps = s.eps;
  const Yarn y = yarn(s.theta, s.head_dim, s.yarn_factor, s.yarn_original, 32.0, 1.0, false);
  m.inv_freq = y.inv_freq;
  m.attention_factor = y.attention_factor;
  m.top_k = s.top_k;
  m.embed = t("model.embed_tokens.weight").v;
  m.final_norm = t("model.norm.weight").v;
  m.lm_head = t("lm_head.weight").v;
  for (int l = 0; l < s.layers; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    Layer L;
    L.attn_norm = t(p + "input_layernorm.weight").v;
    L.ffn_norm = t(p + "post_attention_layernorm.weight").v;
    L.wq = t(p + "self_attn.q_proj.weight").v;
    L.wk = t(p + "self_attn.k_proj.weight").v;
    L.wv = t(p + "self_attn.v_proj.weight").v;
    L.wo = t(p + "self_attn.o_proj.weight").v;
    L.bq = t(p + "self_attn.q_proj.bias").v;
    L.bk = t(p + "self_attn.k_proj.bias").v;
    L.bv = t(p + "self_attn.v_proj.bias").v;
    L.bo = t(p + "self_attn.o_proj.bias").v;
    L.sinks = t(p + "self_attn.sinks").v;
    L.window = s.window_of(l);
    L.router = t(p + "mlp.router.weight").v;
    L.router_logit_bias = t(p + "mlp.router.bias").v;
    const std::string x = p + "mlp.experts.";
    L.gu_blocks = t(x + "gate_up_proj_blocks").raw;
    L.gu_scales = t(x + "gate_up_proj_scales").raw;
    L.down_blocks = t(x + "down_proj_blocks").raw;
    L.down_scales = t(x + "down_proj_scales").raw;
    L.gu_bias = t(x + "gate_up_proj_bias").v;
    L.down_bias = t(x + "down_proj_bias").v;
    L.n_experts = s.experts;
    L.expert_inter = s.inter;
    L.swiglu_limit = s.swiglu_limit;
    m.layers.push_back(std::move(L));
  }
  return m;
}

// The reference model of an hf_tiny.hpp Gemma 3 checkpoint (MODEL-FAMILIES-2026.md §4.1, from
// modeling_gemma3.py), read from its tensors under Spec::text_prefix() (the vision tensors are never
// read): (1 + w) norms, the input embedding x bf16(sqrt(D)), the sandwich layer (input_layernorm
// before the attention, post_attention_layernorm on its output before the add,
// pre_feedforward_layernorm before the MLP, post_feedforward_layernorm on its output), q_norm /
// k_norm before RoPE, split-half RoPE over head_dim: the sliding layers with rope_local_base_freq
// unscaled, the full layers with rope_theta / the linear factor; the window W on the sliding layers
// (from layer_types or the pattern rule), scale query_pre_attn_scalar^-0.5, GeGLU (tanh GELU),
// tied head without scale, no softcap.
inline Model from_gemma3(const hf::Spec& s, const hf::TensorMap& w) {
  auto get = [&](const std::string& n) -> const Vec& {
    auto it = w.find(n);
    if (it == w.end()) throw std::runtime_error("reference: no tensor " + n);
    return it->second.v;
  };
  const std::string pre = s.text_prefix();
  Model m;
  m.D = s.hidden;
  m.H = s.heads;
  m.Hk = s.kv_heads;
  m.hd = s.head_dim;
  m.V = s.vocab;
  m.eps = s.eps;
  m.norm_offset = 1.0;
  // HF: sqrt(hidden) cast to the weight dtype (BF16) before the multiply.
  m.embed_multiplier = hf::bf16_round(std::sqrt(double(s.hidden)));
  m.embed_multiplier_exact = std::sqrt(double(s.hidden));
  m.inv_freq = default_inv_freq(s.theta, s.head_dim);
  m.inv_freq_local = default_inv_freq(s.rope_local_theta, s.head_dim);
  m.rope_linear_factor = s.rope_linear_factor > 0 ? s.rope_linear_factor : 1.0;
  m.attn_scale = 1.0 / std::sqrt(s.query_pre_attn_scalar > 0 ? s.query_pre_attn_scalar : double(s.head_dim));
  m.gelu_tanh = true;
  m.embed = get(pre + "embed_tokens.weight");
  m.final_norm = get(pre + "norm.weight");
  m.lm_head = m.embed;
  for (int l = 0; l < s.layers; ++l) {
    const std::string p = pre + "layers." + std::to_string(l) + ".";
    Layer L;
    L.attn_norm = get(p + "input_layernorm.weight");
    L.post_attn_norm = get(p + "post_attention_layernorm.weight");
    L.ffn_norm = get(p + "pre_feedforward_layernorm.weight");
    L.post_mlp_norm = get(p + "post_feedforward_layernorm.weight");
    L.wq = get(p + "self_attn.q_proj.weight");
    L.wk = get(p + "self_attn.k_proj.weight");
    L.wv = get(p + "self_attn.v_proj.weight");
    L.wo = get(p + "self_attn.o_proj.weight");
    L.q_norm = get(p + "self_attn.q_norm.weight");
    L.k_norm = get(p + "self_attn.k_norm.weight");
    L.w_gate = get(p + "mlp.gate_proj.weight");
    L.w_up = get(p + "mlp.up_proj.weight");
    L.w_down = get(p + "mlp.down_proj.weight");
    L.local_rope = s.layer_type(l) == "sliding_attention";
    L.window = s.window_of(l);
    m.layers.push_back(std::move(L));
  }
  return m;
}

namespace detail {
// What Qwen3.5 and Qwen3-Next read alike (MODEL-FAMILIES-2026.md §1): the tensors under `pre`,
// (1 + w) norms, gated full attention with q/k norms and partial RoPE, the Gated DeltaNet's conv /
// dt_bias / A_log / norm / out_proj, the MoE's router, per-expert keys (or, with fused_experts, the
// fused [E, 2I, D] / [E, D, I] tensors) and the gated shared expert, else the dense SwiGLU; lm_head,
// or the embedding when tied. What differs is passed in: the DeltaNet's input projections
// (linear_in fills in_qkv / in_z / in_b / in_a from the layer's linear_attn. prefix), which layers
// are MoE, and norm_topk_prob.
using TensorGet = std::function<const Vec&(const std::string&)>;
struct HybridRead {
  std::string pre;
  bool norm_topk_prob = true, fused_experts = false;
  std::function<bool(int)> moe_layer;
  std::function<void(Layer&, const std::string&, const TensorGet&)> linear_in;
};
inline Model qwen3_hybrid(const hf::Spec& s, const hf::TensorMap& w, const HybridRead& how) {
  const TensorGet get = [&](const std::string& n) -> const Vec& {
    auto it = w.find(n);
    if (it == w.end()) throw std::runtime_error("reference: no tensor " + n);
    return it->second.v;
  };
  const std::string& pre = how.pre;
  Model m;
  m.D = s.hidden;
  m.H = s.heads;
  m.Hk = s.kv_heads;
  m.hd = s.head_dim;
  m.V = s.vocab;
  m.eps = s.eps;
  m.norm_offset = 1.0;
  m.inv_freq = default_inv_freq(s.theta, int(s.head_dim * s.partial_rotary_factor));
  m.attn_output_gate = true;
  m.lin_Hk = s.lin_k_heads;
  m.lin_Hv = s.lin_v_heads;
  m.lin_dk = s.lin_k_dim;
  m.lin_dv = s.lin_v_dim;
  m.conv_kernel = s.conv_kernel;
  m.top_k = s.top_k;
  m.norm_topk_prob = how.norm_topk_prob;
  m.embed = get(pre + "embed_tokens.weight");
  m.final_norm = get(pre + "norm.weight");
  m.lm_head = s.tied ? m.embed : get("lm_head.weight");
  const size_t D = size_t(s.hidden), I = size_t(s.moe_inter);
  for (int l = 0; l < s.layers; ++l) {
    const std::string p = pre + "layers." + std::to_string(l) + ".";
    Layer L;
    L.attn_norm = get(p + "input_layernorm.weight");
    L.ffn_norm = get(p + "post_attention_layernorm.weight");
    const std::string type = s.layer_type(l);
    if (type == "full_attention") {
      L.wq = get(p + "self_attn.q_proj.weight");
      L.wk = get(p + "self_attn.k_proj.weight");
      L.wv = get(p + "self_attn.v_proj.weight");
      L.wo = get(p + "self_attn.o_proj.weight");
      L.q_norm = get(p + "self_attn.q_norm.weight");
      L.k_norm = get(p + "self_attn.k_norm.weight");
    } else if (type == "linear_attention") {
      const std::string a = p + "linear_attn.";
      how.linear_in(L, a, get);
      L.conv = get(a + "conv1d.weight");  // [C, 1, K] row-major is [C][K], C over [all q | all k | all v]
      L.dt_bias = get(a + "dt_bias");
      L.A_log = get(a + "A_log");
      L.gdn_norm = get(a + "norm.weight");
      L.out_proj = get(a + "out_proj.weight");
    } else {
      throw std::runtime_error("reference: layer type " + type);
    }
    if (how.moe_layer(l)) {
      L.router = get(p + "mlp.gate.weight");
      const std::string x = p + "mlp.experts.";
      for (int e = 0; e < s.experts; ++e) {
        if (!how.fused_experts) {
          const std::string q = x + std::to_string(e) + ".";
          L.experts.push_back({get(q + "gate_proj.weight"), get(q + "up_proj.weight"), get(q + "down_proj.weight")});
          continue;
        }
        const Vec& gu = get(x + "gate_up_proj");
        const Vec& dn = get(x + "down_proj");
        const auto g0 = gu.begin() + ptrdiff_t(size_t(e) * 2 * I * D), d0 = dn.begin() + ptrdiff_t(size_t(e) * D * I);
        L.experts.push_back({Vec(g0, g0 + ptrdiff_t(I * D)), Vec(g0 + ptrdiff_t(I * D), g0 + ptrdiff_t(2 * I * D)),
                             Vec(d0, d0 + ptrdiff_t(D * I))});
      }
      L.shared = {get(p + "mlp.shared_expert.gate_proj.weight"), get(p + "mlp.shared_expert.up_proj.weight"),
                  get(p + "mlp.shared_expert.down_proj.weight")};
      L.shared_gate = get(p + "mlp.shared_expert_gate.weight");
    } else {
      L.w_gate = get(p + "mlp.gate_proj.weight");
      L.w_up = get(p + "mlp.up_proj.weight");
      L.w_down = get(p + "mlp.down_proj.weight");
    }
    m.layers.push_back(std::move(L));
  }
  return m;
}
}  // namespace detail

// The reference model of an hf_tiny.hpp Qwen3.5 checkpoint (MODEL-FAMILIES-2026.md §1, from
// modeling_qwen3_5.py / modular_qwen3_5_moe.py), read from its tensors under model.language_model.
// (model.visual.* and mtp.* are never read): (1 + w) norms (input, post_attention, final, q/k), no
// embedding scale; each layer's type from layer_types or the (l + 1) % full_attention_interval rule;
// full-attention layers with the output gate (q_proj rows per head [query | gate]), q/k norms before
// RoPE over the first head_dim · partial_rotary_factor dims (split-half within them, rope_theta),
// scale head_dim^-0.5, GQA; Gated DeltaNet layers as gated_delta_net(); the dense SwiGLU MLP, or
// the MoE (softmax over all experts, top-k, always renormalised) with the shared expert x
// sigmoid(shared_expert_gate · x), its experts from the fused [E, 2I, D] / [E, D, I] tensors or the
// per-expert keys; lm_head, or the embedding when tied.
inline Model from_qwen3_5(const hf::Spec& s, const hf::TensorMap& w) {
  detail::HybridRead how;
  how.pre = "model.language_model.";
  how.norm_topk_prob = true;
  how.fused_experts = !s.per_expert_keys;
  const bool moe = s.family == "qwen3_5_moe";
  how.moe_layer = [moe](int) { return moe; };
  how.linear_in = [](Layer& L, const std::string& a, const detail::TensorGet& get) {
    L.in_qkv = get(a + "in_proj_qkv.weight");
    L.in_z = get(a + "in_proj_z.weight");
    L.in_b = get(a + "in_proj_b.weight");
    L.in_a = get(a + "in_proj_a.weight");
  };
  return detail::qwen3_hybrid(s, w, how);
}

// How from_qwen3_next reads the fused DeltaNet projections: grouped per key head (the checkpoint's
// layout), or (negative controls) as if contiguous.
struct FusedRead {
  bool qkvz_contiguous = false, ba_contiguous = false;
};

// The reference model of an hf_tiny.hpp Qwen3-Next checkpoint (MODEL-FAMILIES-2026.md §1.7, from
// modeling_qwen3_next.py), read from its tensors under model. (mtp.* never read): Qwen3.5's math
// (norms, gated attention, partial RoPE, the Gated DeltaNet) with in_proj_qkvz / in_proj_ba
// un-grouped by detail::ungroup_qkvz / ungroup_ba; each layer's MLP by the Qwen2-MoE rule (MoE iff
// num_experts > 0, (l + 1) % decoder_sparse_step == 0 and l not in mlp_only_layers, else the dense
// SwiGLU of intermediate_size): softmax over all experts, top-k, renormalised only with
// norm_topk_prob, per-expert keys, the shared expert x sigmoid(shared_expert_gate · x); lm_head, or
// the embedding when tied.
inline Model from_qwen3_next(const hf::Spec& s, const hf::TensorMap& w, const FusedRead& fused) {
  detail::HybridRead how;
  how.pre = "model.";
  how.norm_topk_prob = s.norm_topk_prob;
  how.fused_experts = false;
  how.moe_layer = [&s](int l) {
    bool moe = s.experts > 0 && (l + 1) % s.decoder_sparse_step == 0;
    for (int x : s.mlp_only_layers) moe = moe && x != l;
    return moe;
  };
  how.linear_in = [&s, fused](Layer& L, const std::string& a, const detail::TensorGet& get) {
    detail::ungroup_qkvz(get(a + "in_proj_qkvz.weight"), s.lin_k_heads, s.lin_v_heads, s.lin_k_dim, s.lin_v_dim,
                         s.hidden, fused.qkvz_contiguous, L.in_qkv, L.in_z);
    detail::ungroup_ba(get(a + "in_proj_ba.weight"), s.lin_k_heads, s.lin_v_heads, s.hidden, fused.ba_contiguous,
                       L.in_b, L.in_a);
  };
  return detail::qwen3_hybrid(s, w, how);
}
inline Model from_qwen3_next(const hf::Spec& s, const hf::TensorMap& w) { return from_qwen3_next(s, w, FusedRead{}); }

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
