// DeepSeek-V2 / V2-Lite (deepseek_v2): MLA + DeepSeekMoE + DeepSeek's YaRN. Tiny BF16 sharded
// checkpoints written here, kvq's forward (the served, absorbed MLA) against a double-precision
// reference written below in the NAIVE per-head form of ../shared/MODEL-FAMILIES.md: per head
// K_h = [k_nope_h, rot k_pe], V_h from kv_b_proj, adjacent-pair RoPE on the rope dims only, softmax
// scale (nope + rope)^-1/2 · ms(f, mscale_all_dim)^2, router softmax / greedy or group-limited top-k /
// renormalise or × routed_scaling_factor, plus the shared experts.
// Tolerance as in test_glm: max |logit - reference| <= 1e-4 · max |reference logit|. Negative
// controls (each must miss by > 1e-2): split-half pairs, the mscale^2 factor dropped, the shared
// experts dropped, norm_topk_prob flipped. The absorbed form kvq computes (one 576-dim KV row per
// token) is checked against the naive per-head scores and outputs on the tiny model and on one
// layer of V2-Lite's real attention shapes.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <nlohmann/json.hpp>

#include "bf16_bound.hpp"
#include "hf_reference.hpp"
#include "hf_tiny.hpp"
#include "kvq/model/model.hpp"
#include "kvq/util/error.hpp"
#include "model_test_util.hpp"

namespace kvq {
namespace {

namespace hf = test::hf;
using Vec = std::vector<double>;

constexpr double kTol = 1e-4;
constexpr double kControl = 1e-2;
constexpr double kAbsorbedTol = 1e-5;
constexpr double kPi = 3.14159265358979323846;

// ----------------------------------------------------------------- naive float64 reference

double ms(double s, double m) { return s <= 1.0 ? 1.0 : 0.1 * m * std::log(s) + 1.0; }

struct RefOptions {
  bool split_half = false;    // rotate (j, j + half) instead of (2j, 2j + 1)
  bool drop_mscale2 = false;  // softmax scale without ms(f, mscale_all_dim)^2
  bool drop_shared = false;
  bool flip_norm_topk_prob = false;
  // deepseek_v3's sigmoid noaux_tc router: select by the unbiased score, score a group by its best
  // expert instead of its top-2 sum, leave routed_scaling_factor out.
  bool select_unbiased = false, group_by_max = false, ignore_scaling_factor = false;
};

// Per layer: scaled scores [H][T][T] (j <= i; 0 elsewhere) and the head outputs [T][H][v] before
// o_proj.
struct RefTrace {
  std::vector<Vec> scores, head_out;
};

class Reference {
 public:
  Reference(const hf::Spec& s, const hf::TensorMap& w) : s_(s), w_(w) {
    const int d = s.qk_rope_head_dim;
    const double base = s.theta;
    inv_freq_.resize(size_t(d / 2));
    for (int j = 0; j < d / 2; ++j) inv_freq_[size_t(j)] = std::pow(base, -2.0 * j / d);
    const double qk = s.qk_nope_head_dim + s.qk_rope_head_dim;
    scale_ = scale_no_m2_ = 1.0 / std::sqrt(qk);
    const nlohmann::json rs = s.extra.contains("rope_scaling") ? s.extra["rope_scaling"] : nlohmann::json();
    if (rs.is_object() && rs.value("type", "") == "yarn") {
      const double f = rs["factor"].get<double>(), orig = rs["original_max_position_embeddings"].get<double>();
      const double m = rs["mscale"].get<double>(), mad = rs["mscale_all_dim"].get<double>();
      // DeepSeek's yarn_find_correction_range / linear_ramp_mask (beta_fast 32, beta_slow 1).
      auto corr = [&](double rot) { return d * std::log(orig / (2 * kPi * rot)) / (2 * std::log(base)); };
      const double low = std::max(std::floor(corr(32.0)), 0.0);
      double high = std::min(std::ceil(corr(1.0)), double(d - 1));
      if (low == high) high += 0.001;
      for (int j = 0; j < d / 2; ++j) {
        const double ramp = std::clamp((j - low) / (high - low), 0.0, 1.0);
        const double e = std::pow(base, -2.0 * j / d);
        inv_freq_[size_t(j)] = e / f * ramp + e * (1 - ramp);
      }
      af_ = ms(f, m) / ms(f, mad);
      scale_ *= ms(f, mad) * ms(f, mad);
    }
  }

  double scale() const { return scale_; }
  double attention_factor() const { return af_; }
  const Vec& inv_freq() const { return inv_freq_; }

  // Rotates the first 2·|inv_freq| entries of v at position pos (cos/sin × af).
  void rope(double* v, int64_t pos, bool split_half = false) const {
    const size_t half = inv_freq_.size();
    for (size_t j = 0; j < half; ++j) {
      double& a = split_half ? v[j] : v[2 * j];
      double& b = split_half ? v[j + half] : v[2 * j + 1];
      const double ang = double(pos) * inv_freq_[j], c = af_ * std::cos(ang), sn = af_ * std::sin(ang);
      const double a0 = a, b0 = b;
      a = a0 * c - b0 * sn;
      b = b0 * c + a0 * sn;
    }
  }

  // logits [T][V]
  Vec forward(const std::vector<int>& ids, const RefOptions& o = {}, RefTrace* tr = nullptr) const {
    const hf::Spec& s = s_;
    const int T = int(ids.size()), D = s.hidden, H = s.heads, R = s.kv_lora_rank, dr = s.qk_rope_head_dim;
    const int nope = s.qk_nope_head_dim, qk = nope + dr, vd = s.v_head_dim;
    const double scale = o.drop_mscale2 ? scale_no_m2_ : scale_;
    std::vector<Vec> x(static_cast<size_t>(T));
    for (int t = 0; t < T; ++t) x[size_t(t)] = row(W("model.embed_tokens.weight"), ids[size_t(t)], D);
    for (int l = 0; l < s.layers; ++l) {
      const std::string p = "model.layers." + std::to_string(l) + ".";
      std::vector<Vec> q(static_cast<size_t>(T)), kpe(static_cast<size_t>(T)), kv(static_cast<size_t>(T));
      for (int t = 0; t < T; ++t) {
        const Vec h = rms(x[size_t(t)], W(p + "input_layernorm.weight"));
        if (s.q_lora_rank > 0) {
          const Vec qa = rms(proj(W(p + "self_attn.q_a_proj.weight"), h), W(p + "self_attn.q_a_layernorm.weight"));
          q[size_t(t)] = proj(W(p + "self_attn.q_b_proj.weight"), qa);
        } else {
          q[size_t(t)] = proj(W(p + "self_attn.q_proj.weight"), h);
        }
        const Vec ckv = proj(W(p + "self_attn.kv_a_proj_with_mqa.weight"), h);
        const Vec c(ckv.begin(), ckv.begin() + R);
        kpe[size_t(t)] = Vec(ckv.begin() + R, ckv.end());
        kv[size_t(t)] = matvec(W(p + "self_attn.kv_b_proj.weight"), rms(c, W(p + "self_attn.kv_a_layernorm.weight")));
        for (int hh = 0; hh < H; ++hh) rope(&q[size_t(t)][size_t(hh * qk + nope)], t, o.split_half);
        rope(kpe[size_t(t)].data(), t, o.split_half);
      }
      Vec sc(size_t(H) * T * T, 0.0), out(size_t(T) * H * vd, 0.0);
      for (int hh = 0; hh < H; ++hh)
        for (int i = 0; i < T; ++i) {
          // naive per-head key [k_nope_h, rot k_pe] and query [q_nope_h, rot q_pe_h]
          const double* qi = &q[size_t(i)][size_t(hh * qk)];
          Vec sj(size_t(i + 1));
          double mx = -std::numeric_limits<double>::infinity();
          for (int j = 0; j <= i; ++j) {
            const double* kn = &kv[size_t(j)][size_t(hh * (nope + vd))];
            double dot = 0;
            for (int n = 0; n < nope; ++n) dot += qi[n] * kn[n];
            for (int r = 0; r < dr; ++r) dot += qi[nope + r] * kpe[size_t(j)][size_t(r)];
            sj[size_t(j)] = dot * scale;
            sc[(size_t(hh) * T + i) * T + j] = sj[size_t(j)];
            mx = std::max(mx, sj[size_t(j)]);
          }
          double z = 0;
          for (double& e : sj) z += (e = std::exp(e - mx));
          for (int j = 0; j <= i; ++j) {
            const double* vj = &kv[size_t(j)][size_t(hh * (nope + vd) + nope)];
            for (int e = 0; e < vd; ++e) out[(size_t(i) * H + hh) * vd + e] += sj[size_t(j)] / z * vj[e];
          }
        }
      if (tr) {
        tr->scores.push_back(sc);
        tr->head_out.push_back(out);
      }
      for (int t = 0; t < T; ++t) {
        const Vec ot(out.begin() + ptrdiff_t(size_t(t) * H * vd), out.begin() + ptrdiff_t(size_t(t + 1) * H * vd));
        add(x[size_t(t)], proj(W(p + "self_attn.o_proj.weight"), ot));
        const Vec h = rms(x[size_t(t)], W(p + "post_attention_layernorm.weight"));
        add(x[size_t(t)], s.is_moe_layer(l) ? moe(p, h, o) : swiglu(p + "mlp.", h));
      }
    }
    Vec logits;
    const hf::Tensor& head = W(s.tied ? "model.embed_tokens.weight" : "lm_head.weight");
    for (int t = 0; t < T; ++t) {
      const Vec lt = matvec(head, rms(x[size_t(t)], W("model.norm.weight")));
      logits.insert(logits.end(), lt.begin(), lt.end());
    }
    return logits;
  }

  const hf::Tensor& W(const std::string& name) const { return w_.at(name); }

  // A projection: matvec, or under test::ref::emulate_bf16() (hf_reference.hpp) with its input and
  // product rounded to BF16 as kvq's BF16 forward does (kv_b, the router and the head stay fp32 there).
  static Vec proj(const hf::Tensor& w, const Vec& x) {
    if (!test::ref::emulate_bf16()) return matvec(w, x);
    Vec xr = x;
    for (double& e : xr) e = hf::bf16_round(e);
    Vec y = matvec(w, xr);
    for (double& e : y) e = hf::bf16_round(e);
    return y;
  }

  static Vec matvec(const hf::Tensor& w, const Vec& x) {
    const int64_t rows = w.shape[0], cols = w.shape[1];
    Vec y(size_t(rows), 0.0);
    for (int64_t r = 0; r < rows; ++r) {
      double a = 0;
      for (int64_t c = 0; c < cols; ++c) a += w.v[size_t(r * cols + c)] * x[size_t(c)];
      y[size_t(r)] = a;
    }
    return y;
  }

 private:
  static Vec row(const hf::Tensor& w, int r, int D) {
    return Vec(w.v.begin() + ptrdiff_t(size_t(r) * D), w.v.begin() + ptrdiff_t(size_t(r + 1) * D));
  }
  static void add(Vec& x, const Vec& y) {
    for (size_t i = 0; i < x.size(); ++i) x[i] += y[i];
  }
  Vec rms(const Vec& x, const hf::Tensor& w) const {
    double ss = 0;
    for (double e : x) ss += e * e;
    const double inv = 1.0 / std::sqrt(ss / double(x.size()) + s_.eps);
    Vec y(x.size());
    for (size_t i = 0; i < x.size(); ++i) y[i] = x[i] * inv * w.v[i];
    return y;
  }
  static double silu(double a) { return a / (1.0 + std::exp(-a)); }
  // SwiGLU with tensors prefix{gate,up,down}_proj.weight
  Vec swiglu(const std::string& prefix, const Vec& h) const {
    const Vec g = proj(W(prefix + "gate_proj.weight"), h), u = proj(W(prefix + "up_proj.weight"), h);
    Vec a(g.size());
    for (size_t i = 0; i < g.size(); ++i) a[i] = silu(g[i]) * u[i];
    return proj(W(prefix + "down_proj.weight"), a);
  }
  Vec moe(const std::string& p, const Vec& h, const RefOptions& o) const {
    const hf::Spec& s = s_;
    const int E = s.experts, K = s.top_k;
    const Vec logits = matvec(W(p + "mlp.gate.weight"), h);
    if (s.v3()) return moe_v3(p, h, logits, o);
    const double mx = *std::max_element(logits.begin(), logits.end());
    Vec pr(static_cast<size_t>(E));
    double z = 0;
    for (int e = 0; e < E; ++e) z += (pr[size_t(e)] = std::exp(logits[size_t(e)] - mx));
    for (double& e : pr) e /= z;
    Vec score = pr;
    if (s.topk_method == "group_limited_greedy") {
      const int gs = E / s.n_group;
      std::vector<std::pair<double, int>> g;
      for (int k = 0; k < s.n_group; ++k) g.push_back({-*std::max_element(pr.begin() + k * gs, pr.begin() + (k + 1) * gs), k});
      std::sort(g.begin(), g.end());
      std::vector<bool> keep(size_t(s.n_group), false);
      for (int k = 0; k < s.topk_group; ++k) keep[size_t(g[size_t(k)].second)] = true;
      for (int e = 0; e < E; ++e)
        if (!keep[size_t(e / gs)]) score[size_t(e)] = 0.0;
    }
    std::vector<std::pair<double, int>> order;
    for (int e = 0; e < E; ++e) order.push_back({-score[size_t(e)], e});
    std::sort(order.begin(), order.end());
    const bool norm = (s.norm_topk_prob != o.flip_norm_topk_prob) && K > 1;
    double sum = 0;
    for (int k = 0; k < K; ++k) sum += pr[size_t(order[size_t(k)].second)];
    Vec out(size_t(s.hidden), 0.0);
    for (int k = 0; k < K; ++k) {
      const int e = order[size_t(k)].second;
      const double wgt = norm ? pr[size_t(e)] / sum : pr[size_t(e)] * s.routed_scaling_factor;
      const Vec y = swiglu(p + "mlp.experts." + std::to_string(e) + ".", h);
      for (size_t i = 0; i < out.size(); ++i) out[i] += wgt * y[i];
    }
    if (s.n_shared_experts > 0 && !o.drop_shared) add(out, swiglu(p + "mlp.shared_experts.", h));
    return out;
  }

  // DeepSeek-V3's Gate.forward (inference/model.py): sigmoid scores; selection by score + bias
  // within the topk_group groups of highest top-2 sum; weights the unbiased scores, renormalised,
  // x routed_scaling_factor; plus the shared experts.
  Vec moe_v3(const std::string& p, const Vec& h, const Vec& logits, const RefOptions& o) const {
    const hf::Spec& s = s_;
    const int E = s.experts, K = s.top_k, gs = E / s.n_group;
    const Vec& bias = W(p + "mlp.gate.e_score_correction_bias").v;
    Vec sc(static_cast<size_t>(E)), sel(static_cast<size_t>(E));
    for (int e = 0; e < E; ++e) {
      sc[size_t(e)] = 1.0 / (1.0 + std::exp(-logits[size_t(e)]));
      sel[size_t(e)] = sc[size_t(e)] + (o.select_unbiased ? 0.0 : bias[size_t(e)]);
    }
    if (s.n_group > 1) {
      std::vector<std::pair<double, int>> g;
      for (int k = 0; k < s.n_group; ++k) {
        Vec b(sel.begin() + k * gs, sel.begin() + (k + 1) * gs);
        std::sort(b.rbegin(), b.rend());
        g.push_back({-(o.group_by_max ? b[0] : b[0] + b[1]), k});
      }
      std::sort(g.begin(), g.end());
      std::vector<bool> keep(size_t(s.n_group), false);
      for (int k = 0; k < s.topk_group; ++k) keep[size_t(g[size_t(k)].second)] = true;
      for (int e = 0; e < E; ++e)
        if (!keep[size_t(e / gs)]) sel[size_t(e)] = -INFINITY;
    }
    std::vector<std::pair<double, int>> order;
    for (int e = 0; e < E; ++e) order.push_back({-sel[size_t(e)], e});
    std::sort(order.begin(), order.end());
    double sum = 0;
    for (int k = 0; k < K; ++k) sum += sc[size_t(order[size_t(k)].second)];
    const double rsf = o.ignore_scaling_factor ? 1.0 : s.routed_scaling_factor;
    Vec out(size_t(s.hidden), 0.0);
    for (int k = 0; k < K; ++k) {
      const int e = order[size_t(k)].second;
      const double wgt = (s.norm_topk_prob ? sc[size_t(e)] / sum : sc[size_t(e)]) * rsf;
      const Vec y = swiglu(p + "mlp.experts." + std::to_string(e) + ".", h);
      for (size_t i = 0; i < out.size(); ++i) out[i] += wgt * y[i];
    }
    if (s.n_shared_experts > 0 && !o.drop_shared) add(out, swiglu(p + "mlp.shared_experts.", h));
    return out;
  }

  hf::Spec s_;
  const hf::TensorMap& w_;
  Vec inv_freq_;
  double af_ = 1.0, scale_ = 0, scale_no_m2_ = 0;
};

// ----------------------------------------------------------------- fixtures

// DeepSeek-V2-Lite's form, tiny: q_proj, layer 0 dense and the rest MoE (greedy top-3 of 8, two
// shared experts), norm_topk_prob false with routed_scaling_factor 2.5, YaRN factor 40 over an
// original length of 64 (most rotary blocks interpolated) with mscale 1 / mscale_all_dim 0.5, so
// that cos/sin carry 1.156 and the softmax scale 1.403 beyond 1/sqrt(24).
hf::Spec lite_spec() {
  hf::Spec s;
  s.family = "deepseek_v2";
  s.hidden = 48;
  s.layers = 3;
  s.heads = 4;
  s.kv_lora_rank = 24;
  s.qk_nope_head_dim = 16;
  s.qk_rope_head_dim = 8;
  s.v_head_dim = 12;
  s.inter = 40;
  s.vocab = 64;
  s.max_pos = 2560;
  s.eps = 1e-6;
  s.experts = 8;
  s.top_k = 3;
  s.moe_inter = 12;
  s.n_shared_experts = 2;
  s.first_k_dense_replace = 1;
  s.norm_topk_prob = false;
  s.routed_scaling_factor = 2.5;
  s.scale = 0.25;
  s.seed = 31;
  s.extra["rope_scaling"] = {{"type", "yarn"},   {"factor", 40},         {"original_max_position_embeddings", 64},
                             {"beta_fast", 32},  {"beta_slow", 1},       {"mscale", 1.0},
                             {"mscale_all_dim", 0.5}};
  return s;
}

// DeepSeek-V2's form, tiny: q-LoRA, group_limited_greedy (the best 2 of 4 groups of 3 experts,
// top-4), norm_topk_prob true, one shared expert, no RoPE scaling; moe_layer_freq 2 with
// first_k_dense_replace 0: layers 0 and 2 MoE, 1 and 3 dense.
hf::Spec v2_spec() {
  hf::Spec s = lite_spec();
  s.extra = nlohmann::json::object();
  s.layers = 4;
  s.q_lora_rank = 20;
  s.experts = 12;
  s.top_k = 4;
  s.topk_method = "group_limited_greedy";
  s.n_group = 4;
  s.topk_group = 2;
  s.norm_topk_prob = true;
  s.routed_scaling_factor = 1.0;
  s.n_shared_experts = 1;
  s.moe_layer_freq = 2;
  s.first_k_dense_replace = 0;
  s.seed = 32;
  return s;
}

std::vector<int> seeded_ids(int T, int vocab, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<int> ids(static_cast<size_t>(T));
  for (int& x : ids) x = int(rng() % uint32_t(vocab));
  return ids;
}

at::Tensor to_tensor(const std::vector<int>& ids) {
  std::vector<int64_t> v(ids.begin(), ids.end());
  return at::tensor(v, at::kLong).view({1, int64_t(v.size())});
}

Vec logits_of(const Model& m, const std::vector<int>& ids, const Model::ForwardOptions& o = {}) {
  at::Tensor r = m.forward(to_tensor(ids), o)[0].to(at::kDouble).contiguous();
  return Vec(r.data_ptr<double>(), r.data_ptr<double>() + r.numel());
}

std::vector<int64_t> argmax_rows(const Vec& logits, int V) {
  std::vector<int64_t> out;
  for (size_t t = 0; t * size_t(V) < logits.size(); ++t) {
    auto b = logits.begin() + ptrdiff_t(t * size_t(V));
    out.push_back(std::max_element(b, b + V) - b);
  }
  return out;
}

// DeepSeek-V3's form, tiny: q-LoRA, the sigmoid noaux_tc router with e_score_correction_bias
// (the best 2 of 4 groups of 4 experts by top-2 sum, top-4), renormalised x 2.5, one shared
// expert, first_k_dense_replace 1, DeepSeek's YaRN (mscale = mscale_all_dim = 1), and an MTP
// layer in the checkpoint that must never be read.
hf::Spec v3_spec() {
  hf::Spec s = lite_spec();
  s.family = "deepseek_v3";
  s.layers = 3;
  s.q_lora_rank = 20;
  s.experts = 16;
  s.top_k = 4;
  s.topk_method = "noaux_tc";
  s.n_group = 4;
  s.topk_group = 2;
  s.norm_topk_prob = true;
  s.routed_scaling_factor = 2.5;
  s.n_shared_experts = 1;
  s.first_k_dense_replace = 1;
  s.mtp = true;
  s.seed = 33;
  s.extra["rope_scaling"] = {{"type", "yarn"}, {"factor", 40}, {"original_max_position_embeddings", 64},
                             {"beta_fast", 32}, {"beta_slow", 1}, {"mscale", 1.0}, {"mscale_all_dim", 1.0}};
  return s;
}

struct Fixture {
  hf::Spec spec;
  hf::TensorMap weights;
  Reference ref;
  test::TempDir dir;
  Model model;

  explicit Fixture(const hf::Spec& s, bool stream = false, Precision p = Precision::kFp32)
      : spec(s), weights(hf::make_weights(s)), ref(s, weights), model(load(s, weights, dir, stream, p)) {}

  static Model load(const hf::Spec& s, const hf::TensorMap& w, const test::TempDir& dir, bool stream, Precision p) {
    hf::write_model(dir.str(), hf::make_config(s), w, 3);
    Model::LoadOptions lo;
    lo.stream = stream;
    lo.precision = p;
    return Model::load(dir.str(), lo);
  }

  double diff(const RefOptions& o, const char* what, int T = 24, uint32_t seed = 11) const {
    const auto ids = seeded_ids(T, spec.vocab, seed);
    const double d = test::ref::rel_max_diff(logits_of(model, ids), ref.forward(ids, o));
    std::cout << "[ info ] control '" << what << "': max rel diff " << d << "\n";
    return d;
  }

  void expect_matches_reference() const {
    for (uint32_t seed : {11u, 12u}) {
      const auto ids = seeded_ids(24, spec.vocab, seed);
      const Vec got = logits_of(model, ids), want = ref.forward(ids);
      const double d = test::ref::rel_max_diff(got, want);
      std::cout << "[ info ] " << (model.streamed() ? "streamed" : "whole") << " max rel diff " << d << "\n";
      EXPECT_LT(d, kTol) << "seed " << seed;
      EXPECT_EQ(argmax_rows(got, spec.vocab), argmax_rows(want, spec.vocab)) << "seed " << seed;
    }
  }

  void expect_same_greedy(int prompt_len, int steps) const {
    std::vector<int> a = seeded_ids(prompt_len, spec.vocab, 5), b = a;
    for (int st = 0; st < steps; ++st) {
      const at::Tensor l = model.forward(to_tensor(a));
      a.push_back(int(l[0][int64_t(a.size()) - 1].argmax().item<int64_t>()));
      const Vec r = ref.forward(b);
      const auto last = r.begin() + ptrdiff_t((b.size() - 1) * size_t(spec.vocab));
      b.push_back(int(std::max_element(last, last + spec.vocab) - last));
    }
    EXPECT_EQ(a, b);
  }
};

// ----------------------------------------------------------------- config

TEST(Deepseek, ServedCacheConfig) {
  Fixture f(lite_spec());
  const ModelConfig& c = f.model.config();
  EXPECT_EQ(c.architecture, "deepseek_v2");
  EXPECT_EQ(c.n_heads, 4);
  EXPECT_EQ(c.n_kv_heads, 1);
  EXPECT_EQ(c.head_dim, 8 + 24);  // [k_pe, latent]
  EXPECT_EQ(c.head_dim_v, 24);
  EXPECT_EQ(c.v_dim(), 24);
  EXPECT_EQ(c.rotary_dim, 8);
  EXPECT_EQ(c.pairing, RopePairing::kInterleaved);
  EXPECT_EQ(c.q_lora_rank, 0);
  EXPECT_EQ(c.kv_lora_rank, 24);
  const double m = 0.1 * 0.5 * std::log(40.0) + 1.0;
  EXPECT_NEAR(c.attn_scale(), m * m / std::sqrt(24.0), 1e-12);
  EXPECT_NEAR(rope_params(c, 24).attention_factor, (0.1 * std::log(40.0) + 1.0) / m, 1e-12);
  const RopeParams rp = rope_params(c, 24);
  ASSERT_EQ(rp.inv_freq.size(), f.ref.inv_freq().size());
  for (size_t j = 0; j < rp.inv_freq.size(); ++j) EXPECT_NEAR(rp.inv_freq[j], f.ref.inv_freq()[j], 1e-15) << j;
  EXPECT_EQ(c.layer_moe, (std::vector<uint8_t>{0, 1, 1}));
  EXPECT_EQ(c.n_experts, 8);
  EXPECT_EQ(c.n_experts_per_tok, 3);
  EXPECT_EQ(c.n_shared_experts, 2);
  EXPECT_DOUBLE_EQ(c.routed_scaling_factor, 2.5);
  EXPECT_FALSE(c.norm_topk_prob);
  EXPECT_EQ(c.n_group, 0);

  Fixture g(v2_spec());
  const ModelConfig& d = g.model.config();
  EXPECT_EQ(d.q_lora_rank, 20);
  EXPECT_EQ(d.layer_moe, (std::vector<uint8_t>{1, 0, 1, 0}));  // l % moe_layer_freq == 0
  EXPECT_EQ(d.n_group, 4);
  EXPECT_EQ(d.topk_group, 2);
  EXPECT_TRUE(d.norm_topk_prob);
  EXPECT_DOUBLE_EQ(d.attn_scale(), 1.0 / std::sqrt(24.0));
}

// ----------------------------------------------------------------- forward vs reference

TEST(Deepseek, LiteStyleMatchesReference) {
  for (bool stream : {false, true}) {
    SCOPED_TRACE(stream ? "streamed" : "whole");
    Fixture f(lite_spec(), stream);
    ASSERT_EQ(f.model.streamed(), stream);
    f.expect_matches_reference();
    f.expect_same_greedy(6, 6);
    RefOptions o;
    o.split_half = true;
    EXPECT_GT(f.diff(o, "split-half pairs"), kControl);
    o = {};
    o.drop_mscale2 = true;
    EXPECT_GT(f.diff(o, "mscale^2 dropped"), kControl);
    o = {};
    o.drop_shared = true;
    EXPECT_GT(f.diff(o, "shared experts dropped"), kControl);
    o = {};
    o.flip_norm_topk_prob = true;
    EXPECT_GT(f.diff(o, "norm_topk_prob flipped"), kControl);
  }
}

TEST(Deepseek, V2StyleQLoraGroupLimitedMatchesReference) {
  for (bool stream : {false, true}) {
    SCOPED_TRACE(stream ? "streamed" : "whole");
    Fixture f(v2_spec(), stream);
    f.expect_matches_reference();
    f.expect_same_greedy(6, 6);
    RefOptions o;
    o.split_half = true;
    EXPECT_GT(f.diff(o, "split-half pairs"), kControl);
    o = {};
    o.flip_norm_topk_prob = true;
    EXPECT_GT(f.diff(o, "norm_topk_prob flipped"), kControl);
    o = {};
    o.drop_shared = true;
    EXPECT_GT(f.diff(o, "shared experts dropped"), kControl);
  }
}

TEST(DeepseekV3, NoauxRouterMatchesReference) {
  for (const bool stream : {false, true}) {
    Fixture f(v3_spec(), stream);
    const ModelConfig& c = f.model.config();
    EXPECT_EQ(c.architecture, "deepseek_v3");
    EXPECT_EQ(c.layer_moe, (std::vector<uint8_t>{0, 1, 1}));
    EXPECT_EQ(c.n_group, 4);
    EXPECT_DOUBLE_EQ(c.routed_scaling_factor, 2.5);
    f.expect_matches_reference();
    if (stream) continue;
    f.expect_same_greedy(5, 6);
    RefOptions o;
    o.select_unbiased = true;
    EXPECT_GT(f.diff(o, "selection by the unbiased score"), kControl);
    o = {};
    o.group_by_max = true;
    EXPECT_GT(f.diff(o, "groups scored by their best expert"), kControl);
    o = {};
    o.ignore_scaling_factor = true;
    EXPECT_GT(f.diff(o, "routed_scaling_factor ignored"), kControl);
    o = {};
    o.split_half = true;
    EXPECT_GT(f.diff(o, "split-half pairs"), kControl);
  }
}

TEST(DeepseekV3, KimiK2ModelTypeIsTheSameModel) {
  hf::Spec s = v3_spec();
  Fixture f(s);
  test::TempDir dir;
  nlohmann::json cfg = hf::make_config(s);
  cfg["model_type"] = "kimi_k2";
  hf::write_model(dir.str(), cfg, f.weights, 2);
  const Model kimi = Model::load(dir.str());
  EXPECT_EQ(kimi.config().architecture, "kimi_k2");
  const auto ids = seeded_ids(16, s.vocab, 3);
  EXPECT_EQ(logits_of(kimi, ids), logits_of(f.model, ids));
}

// ----------------------------------------------------------------- quantized checkpoints

// DeepSeek-V3's FP8 checkpoint: every projection ("*_proj.weight", kv_a_proj_with_mqa: attention,
// dense MLP, routed and shared experts) in F8_E4M3 with 128x128 block scales (here 16x12, so that both edges have
// partial blocks); the embedding, lm_head, norms and router stay BF16.
bool is_projection(const std::string& n) {
  auto ends = [&](const std::string& tail) {
    return n.size() > tail.size() && n.compare(n.size() - tail.size(), tail.size(), tail) == 0;
  };
  return ends("_proj.weight") || ends("_proj_with_mqa.weight");
}

constexpr int64_t kBo = 16, kBi = 12;

nlohmann::json fp8_config() {
  return {{"quant_method", "fp8"}, {"fmt", "e4m3"}, {"activation_scheme", "dynamic"}, {"weight_block_size", {kBo, kBi}}};
}

// The FP8 weights of m dequantized a wrong way (negative controls): one scale for the whole tensor,
// or the block grid read transposed (block (a, b) takes S[b][a], wrapped into the grid).
hf::TensorMap misread_fp8(const hf::TensorMap& m, bool per_tensor) {
  hf::TensorMap w = m;
  for (auto& [name, t] : w) {
    if (t.dtype != "F8_E4M3") continue;
    const hf::Tensor& sc = m.at(name + "_scale_inv");
    const int64_t in = t.shape[1], ro = sc.shape[0], ri = sc.shape[1];
    for (int64_t i = 0; i < t.shape[0]; ++i)
      for (int64_t j = 0; j < in; ++j) {
        const double S = per_tensor ? sc.v[0] : sc.v[size_t(((j / kBi) % ro) * ri + (i / kBo) % ri)];
        t.v[size_t(i * in + j)] = hf::e4m3_value(t.raw[size_t(i * in + j)]) * S;
      }
  }
  return w;
}

double rel_diff(const Model& m, const Reference& r, int vocab, uint32_t seed = 11) {
  const auto ids = seeded_ids(24, vocab, seed);
  return test::ref::rel_max_diff(logits_of(m, ids), r.forward(ids));
}

// Loads the checkpoint in dir (whole or streamed) and checks its logits against the reference
// (within kTol, greedy ids equal) on two seeded prompts.
Model load_and_compare(const std::string& dir, bool stream, const Reference& ref, int vocab, const char* what) {
  Model::LoadOptions lo;
  lo.stream = stream;
  Model m = Model::load(dir, lo);
  for (uint32_t seed : {11u, 12u}) {
    const auto ids = seeded_ids(24, vocab, seed);
    const Vec got = logits_of(m, ids), want = ref.forward(ids);
    const double d = test::ref::rel_max_diff(got, want);
    std::cout << "[ info ] " << what << (stream ? " streamed" : " whole") << " max rel diff " << d << "\n";
    EXPECT_LT(d, kTol) << "seed " << seed;
    EXPECT_EQ(argmax_rows(got, vocab), argmax_rows(want, vocab)) << "seed " << seed;
  }
  return m;
}

TEST(DeepseekV3, Fp8BlockCheckpointMatchesReference) {
  hf::Spec s = v3_spec();
  s.extra["quantization_config"] = fp8_config();
  hf::TensorMap w = hf::make_weights(s);
  hf::quantize_fp8_blocks(w, kBo, kBi, is_projection);
  int n_fp8 = 0;
  for (const auto& [name, t] : w) n_fp8 += t.dtype == "F8_E4M3";
  ASSERT_GT(n_fp8, 20);
  EXPECT_EQ(w.at("model.layers.1.mlp.gate.weight").dtype, "BF16");  // the router is not quantized
  const Reference ref(s, w);
  test::TempDir dir;
  hf::write_model(dir.str(), hf::make_config(s), w, 3);
  for (const bool stream : {false, true}) {
    SCOPED_TRACE(stream ? "streamed" : "whole");
    const Model m = load_and_compare(dir.str(), stream, ref, s.vocab, "FP8 blocks");
    if (stream) continue;
    const hf::TensorMap per_tensor = misread_fp8(w, true), transposed = misread_fp8(w, false);
    const double d_tensor = rel_diff(m, Reference(s, per_tensor), s.vocab);
    const double d_transposed = rel_diff(m, Reference(s, transposed), s.vocab);
    std::cout << "[ info ] control 'one scale per tensor': " << d_tensor << ", 'block scales transposed': " << d_transposed
              << "\n";
    EXPECT_GT(d_tensor, kControl);
    EXPECT_GT(d_transposed, kControl);
    // The checkpoint's own BF16 weights (before quantizing) differ: FP8 is not silently skipped.
    const hf::TensorMap bf16 = hf::make_weights(s);
    EXPECT_GT(rel_diff(m, Reference(s, bf16), s.vocab), 1e-3);
  }
}

// Kimi-K2-Thinking's checkpoint: compressed-tensors pack-quantized INT4 (symmetric, group 32; here
// 8, with a partial last group) on the routed experts only; attention, shared experts, the dense
// layer and lm_head stay BF16 (its `ignore` list).
TEST(DeepseekV3, Int4PackedExpertsMatchReference) {
  hf::Spec s = v3_spec();
  constexpr int64_t kGroup = 8;
  s.extra["quantization_config"] = {
      {"quant_method", "compressed-tensors"},
      {"format", "pack-quantized"},
      {"config_groups",
       {{"group_0",
         {{"targets", {"Linear"}},
          {"weights", {{"num_bits", 4}, {"type", "int"}, {"symmetric", true}, {"strategy", "group"}, {"group_size", kGroup}}}}}}},
      {"ignore", {"lm_head", "re:.*self_attn.*", "re:.*shared_experts.*", "re:model.layers.0.mlp.*"}}};
  hf::TensorMap w = hf::make_weights(s);
  auto routed = [](const std::string& n) { return n.find(".mlp.experts.") != std::string::npos; };
  hf::quantize_int4_packed(w, kGroup, routed);
  const Reference ref(s, w);
  test::TempDir dir;
  nlohmann::json cfg = hf::make_config(s);
  cfg["model_type"] = "kimi_k2";
  hf::write_model(dir.str(), cfg, w, 3);
  for (const bool stream : {false, true}) {
    SCOPED_TRACE(stream ? "streamed" : "whole");
    const Model m = load_and_compare(dir.str(), stream, ref, s.vocab, "INT4 packed");
    if (stream) continue;
    // Negative control: nibbles read high first within each byte.
    hf::TensorMap swapped = w;
    for (auto& [name, t] : swapped) {
      if (t.write || !routed(name)) continue;
      const hf::Tensor& p = w.at(name + "_packed");
      const hf::Tensor& sc = w.at(name + "_scale");
      const int64_t in = t.shape[1], words = p.shape[1], ng = sc.shape[1];
      for (int64_t i = 0; i < t.shape[0]; ++i)
        for (int64_t j = 0; j < in; ++j) {
          const uint8_t byte = p.raw[size_t((i * words + j / 8) * 4 + (j % 8) / 2)];
          const int q = int((byte >> (4 * (1 - j % 2))) & 0xF) - 8;
          t.v[size_t(i * in + j)] = q * sc.v[size_t(i * ng + j / kGroup)];
        }
    }
    const double d = rel_diff(m, Reference(s, swapped), s.vocab);
    std::cout << "[ info ] control 'INT4 nibbles swapped': " << d << "\n";
    EXPECT_GT(d, kControl);
  }
}

// Streamed MoE layers convert a routed expert only when tokens are routed to it: the same logits
// as the whole model's, bit for bit, on the BF16 V3 checkpoint.
TEST(DeepseekV3, LazyExpertsEqualWholeModel) {
  const hf::Spec s = v3_spec();
  Fixture whole(s), streamed(s, true);
  const auto ids = seeded_ids(16, s.vocab, 4);
  EXPECT_EQ(logits_of(whole.model, ids), logits_of(streamed.model, ids));
}

TEST(Deepseek, StreamedForwardEqualsWholeModel) {
  const hf::Spec s = v2_spec();
  Fixture whole(s), streamed(s, true);
  const auto ids = seeded_ids(16, s.vocab, 3);
  EXPECT_TRUE(at::equal(whole.model.forward(to_tensor(ids)), streamed.model.forward(to_tensor(ids))));
}

// ----------------------------------------------------------------- absorbed (served) = naive

class CaptureAll : public CaptureObserver {
 public:
  struct Layer {
    int heads = 0, d = 0, dv = 0, kv_heads = 0;
    std::vector<float> q, k, v;
  };
  std::vector<Layer> layers;
  void on_layer(const LayerCapture& c) override {
    Layer L;
    L.heads = c.n_heads;
    L.kv_heads = c.n_kv_heads;
    L.d = c.head_dim;
    L.dv = c.v_dim();
    const size_t n = size_t(c.batch) * c.seq;
    L.q.assign(c.q, c.q + n * c.n_heads * c.head_dim);
    L.k.assign(c.k, c.k + n * c.n_kv_heads * c.head_dim);
    L.v.assign(c.v, c.v + n * c.n_kv_heads * c.v_dim());
    layers.push_back(std::move(L));
  }
};

// From the observer's q [T][H][rope + R], k [T][1][rope + R], v [T][1][R]: the served form's
// scores (rotate the first rope dims, one dot over rope + R) and head outputs W_UV,h Σ p v, against
// the reference's naive per-head scores and outputs, layer by layer.
void expect_absorbed_equals_naive(const Fixture& f, int T) {
  const hf::Spec& s = f.spec;
  const auto ids = seeded_ids(T, s.vocab, 4);
  CaptureAll cap;
  Model::ForwardOptions o;
  o.observer = &cap;
  o.logits = false;
  f.model.forward(to_tensor(ids), o);
  RefTrace tr;
  f.ref.forward(ids, {}, &tr);
  ASSERT_EQ(cap.layers.size(), size_t(s.layers));
  const int H = s.heads, R = s.kv_lora_rank, rope = s.qk_rope_head_dim, nope = s.qk_nope_head_dim, vd = s.v_head_dim;
  const int d = rope + R;
  for (int l = 0; l < s.layers; ++l) {
    SCOPED_TRACE("layer " + std::to_string(l));
    const CaptureAll::Layer& L = cap.layers[size_t(l)];
    ASSERT_EQ(L.heads, H);
    ASSERT_EQ(L.kv_heads, 1);
    ASSERT_EQ(L.d, d);
    ASSERT_EQ(L.dv, R);
    std::vector<Vec> q(static_cast<size_t>(T) * H), k(static_cast<size_t>(T));
    for (int t = 0; t < T; ++t) {
      k[size_t(t)] = Vec(L.k.begin() + ptrdiff_t(size_t(t) * d), L.k.begin() + ptrdiff_t(size_t(t + 1) * d));
      f.ref.rope(k[size_t(t)].data(), t);
      for (int e = 0; e < R; ++e) EXPECT_EQ(L.v[size_t(t) * R + e], L.k[size_t(t) * d + rope + e]) << "v = latent of k";
      for (int h = 0; h < H; ++h) {
        const size_t at = (size_t(t) * H + h) * d;
        q[size_t(t) * H + h] = Vec(L.q.begin() + ptrdiff_t(at), L.q.begin() + ptrdiff_t(at + d));
        f.ref.rope(q[size_t(t) * H + h].data(), t);
      }
    }
    // kvq's apply_rope (what kvq-verify / kvq-eval rotate with) = the reference's rotation of the
    // first rope dims; the latent passes through.
    std::vector<int64_t> pos(static_cast<size_t>(T));
    for (int t = 0; t < T; ++t) pos[size_t(t)] = t;
    std::vector<float> kr = L.k;
    apply_rope(kr.data(), 1, T, d, pos.data(), f.model.config());
    Vec kr_ref;
    for (const Vec& row : k) kr_ref.insert(kr_ref.end(), row.begin(), row.end());
    EXPECT_LT(test::ref::rel_max_diff(Vec(kr.begin(), kr.end()), kr_ref), kAbsorbedTol);
    for (int t = 0; t < T; ++t)
      for (int e = rope; e < d; ++e) ASSERT_EQ(kr[size_t(t) * d + e], L.k[size_t(t) * d + e]);
    const std::string p = "model.layers." + std::to_string(l) + ".self_attn.kv_b_proj.weight";
    const hf::Tensor& kvb = f.ref.W(p);
    Vec scores(size_t(H) * T * T, 0.0), out(size_t(T) * H * vd, 0.0);
    for (int h = 0; h < H; ++h)
      for (int i = 0; i < T; ++i) {
        Vec sj(size_t(i + 1));
        double mx = -std::numeric_limits<double>::infinity();
        for (int j = 0; j <= i; ++j) {
          double dot = 0;
          for (int e = 0; e < d; ++e) dot += q[size_t(i) * H + h][size_t(e)] * k[size_t(j)][size_t(e)];
          sj[size_t(j)] = scores[(size_t(h) * T + i) * T + j] = dot * f.ref.scale();
          mx = std::max(mx, sj[size_t(j)]);
        }
        double z = 0;
        for (double& e : sj) z += (e = std::exp(e - mx));
        Vec lat(size_t(R), 0.0);
        for (int j = 0; j <= i; ++j)
          for (int e = 0; e < R; ++e) lat[size_t(e)] += sj[size_t(j)] / z * L.v[size_t(j) * R + e];
        for (int e = 0; e < vd; ++e) {
          const size_t wrow = size_t(h) * (nope + vd) + nope + e;  // W_UV,h row e
          double a = 0;
          for (int m = 0; m < R; ++m) a += kvb.v[wrow * R + m] * lat[size_t(m)];
          out[(size_t(i) * H + h) * vd + e] = a;
        }
      }
    const double ds = test::ref::rel_max_diff(scores, tr.scores[size_t(l)]);
    const double dout = test::ref::rel_max_diff(out, tr.head_out[size_t(l)]);
    std::cout << "[ info ] layer " << l << " absorbed vs naive: scores " << ds << ", head outputs " << dout << "\n";
    EXPECT_LT(ds, kAbsorbedTol);
    EXPECT_LT(dout, kAbsorbedTol);
  }
}

TEST(Deepseek, AbsorbedEqualsNaiveTiny) {
  Fixture f(lite_spec());
  expect_absorbed_equals_naive(f, 12);
  Fixture g(v2_spec());
  expect_absorbed_equals_naive(g, 12);
}

// One layer of DeepSeek-V2-Lite's real attention shapes (hidden 2048, 16 heads, kv_lora 512, nope
// 128, rope 64, v 128) and its YaRN (factor 40, original 4096, mscale = mscale_all_dim = 0.707):
// the served cache is 576 wide and the softmax scale the published 0.11472.
TEST(Deepseek, AbsorbedEqualsNaiveRealShapes) {
  hf::Spec s = lite_spec();
  s.hidden = 2048;
  s.layers = 1;
  s.heads = 16;
  s.kv_lora_rank = 512;
  s.qk_nope_head_dim = 128;
  s.qk_rope_head_dim = 64;
  s.v_head_dim = 128;
  s.experts = 0;
  s.inter = 32;
  s.vocab = 32;
  s.max_pos = 163840;
  s.scale = 0.02;
  s.seed = 33;
  s.extra["rope_scaling"] = {{"type", "yarn"},  {"factor", 40},        {"original_max_position_embeddings", 4096},
                             {"beta_fast", 32}, {"beta_slow", 1},      {"mscale", 0.707},
                             {"mscale_all_dim", 0.707}};
  Fixture f(s);
  EXPECT_EQ(f.model.config().head_dim, 576);
  EXPECT_EQ(f.model.config().head_dim_v, 512);
  EXPECT_NEAR(f.model.config().attn_scale(), 0.11472, 5e-6);
  EXPECT_DOUBLE_EQ(rope_params(f.model.config(), 8).attention_factor, 1.0);
  // DeepSeek's YaRN at d = 64: the ramp runs from block 10 (kept) to block 23 (÷ 40).
  const RopeParams rp = rope_params(f.model.config(), 8);
  ASSERT_EQ(rp.inv_freq.size(), 32u);
  for (int j = 0; j < 32; ++j) {
    const double e = std::pow(10000.0, -2.0 * j / 64);
    if (j <= 10) EXPECT_NEAR(rp.inv_freq[size_t(j)], e, 1e-15 * e) << j;
    else if (j >= 23) EXPECT_NEAR(rp.inv_freq[size_t(j)], e / 40, 1e-15 * e) << j;
    else EXPECT_TRUE(rp.inv_freq[size_t(j)] < e && rp.inv_freq[size_t(j)] > e / 40) << j;
  }
  expect_absorbed_equals_naive(f, 5);
  const auto ids = seeded_ids(5, s.vocab, 6);
  EXPECT_LT(test::ref::rel_max_diff(logits_of(f.model, ids), f.ref.forward(ids)), kTol);
}

// ----------------------------------------------------------------- K/V hooks on the latent rows

class Shape : public KvTransform {
 public:
  int d = 0, dv = 0, kv_heads = 0;
  void apply(LayerKv& kv) override {
    d = kv.head_dim;
    dv = kv.v_dim();
    kv_heads = kv.n_kv_heads;
  }
};
class NoCode : public ProtectedKv {
 public:
  void code(LayerKv&) override {}
};
// Zeroes the latent (dims past the rotary ones) of every coded key and value row.
class DropLatent : public ProtectedKv {
 public:
  void code(LayerKv& kv) override {
    const size_t n = size_t(kv.batch) * kv.seq * kv.n_kv_heads;
    for (size_t r = 0; r < n; ++r) {
      std::fill(kv.k + r * kv.head_dim + 8, kv.k + (r + 1) * kv.head_dim, 0.f);
      std::fill(kv.v + r * kv.v_dim(), kv.v + (r + 1) * kv.v_dim(), 0.f);
    }
  }
};

TEST(Deepseek, KvHooksSeeTheServedRows) {
  Fixture f(lite_spec());
  const auto ids = seeded_ids(20, f.spec.vocab, 8);
  const Vec plain = logits_of(f.model, ids);
  Shape sh;
  Model::ForwardOptions o;
  o.kv_transform = &sh;
  EXPECT_EQ(logits_of(f.model, ids, o), plain);
  EXPECT_EQ(sh.d, 32);
  EXPECT_EQ(sh.dv, 24);
  EXPECT_EQ(sh.kv_heads, 1);
  NoCode none;
  none.sink = 1;
  none.recent = 3;
  Model::ForwardOptions p;
  p.protected_kv = &none;
  // The protected path sums P_full V + P_coded V_coded: the same values in another fp32 order.
  EXPECT_LT(test::ref::rel_max_diff(logits_of(f.model, ids, p), plain), 1e-5);
  DropLatent drop;
  drop.sink = 1;
  drop.recent = 3;
  p.protected_kv = &drop;
  EXPECT_GT(test::ref::rel_max_diff(logits_of(f.model, ids, p), plain), kControl);
}

// ----------------------------------------------------------------- sizes

TEST(Deepseek, WholeFp32BytesIsTheLoadedElementsTimesFour) {
  for (const hf::Spec& s : {lite_spec(), v2_spec()}) {
    const hf::TensorMap w = hf::make_weights(s);
    int64_t elems = 0;
    for (const auto& [name, t] : w) {
      int64_t n = 1;
      for (int64_t x : t.shape) n *= x;
      elems += n;
    }
    test::TempDir dir;
    hf::write_model(dir.str(), hf::make_config(s), w, 2);
    EXPECT_EQ(Model::whole_fp32_bytes(dir.str()), 4 * elems);
    const int64_t D = s.hidden, V = s.vocab;
    const Model whole = Model::load(dir.str(), {false});
    int64_t layers = 0;
    for (int l = 0; l < s.layers; ++l) layers += whole.layer_fp32_bytes(l);
    EXPECT_EQ(layers, 4 * (elems - 2 * V * D - D));
    // Streamed, a MoE layer converts its routed experts one at a time: E - 1 experts' gate, up and
    // down ([Ie, D] twice, [D, Ie]) are not held.
    const Model m = Model::load(dir.str(), {true});
    int64_t streamed = 0, moe_layers = 0;
    for (int l = 0; l < s.layers; ++l) {
      streamed += m.layer_fp32_bytes(l);
      moe_layers += m.config().is_moe_layer(l);
    }
    EXPECT_GT(moe_layers, 0);
    EXPECT_EQ(streamed, layers - moe_layers * 4 * int64_t(s.experts - 1) * 3 * s.moe_inter * D);
  }
}

// DeepSeek-V2-Lite's own config.json (the published values): 15.7B parameters in fp32, counted
// here from its shapes; the served cache row 576 wide, scale 0.11472, layer 0 dense.
TEST(Deepseek, V2LiteConfigSizes) {
  const nlohmann::json c = {
      {"architectures", {"DeepseekV2ForCausalLM"}}, {"model_type", "deepseek_v2"}, {"hidden_size", 2048},
      {"num_hidden_layers", 27}, {"num_attention_heads", 16}, {"num_key_value_heads", 16},
      {"q_lora_rank", nullptr}, {"kv_lora_rank", 512}, {"qk_nope_head_dim", 128}, {"qk_rope_head_dim", 64},
      {"v_head_dim", 128}, {"intermediate_size", 10944}, {"moe_intermediate_size", 1408},
      {"n_routed_experts", 64}, {"num_experts_per_tok", 6}, {"n_shared_experts", 2},
      {"first_k_dense_replace", 1}, {"moe_layer_freq", 1}, {"routed_scaling_factor", 1.0},
      {"norm_topk_prob", false}, {"topk_method", "greedy"}, {"n_group", 1}, {"topk_group", 1},
      {"scoring_func", "softmax"}, {"aux_loss_alpha", 0.001}, {"seq_aux", true}, {"ep_size", 1},
      {"vocab_size", 102400}, {"max_position_embeddings", 163840}, {"rope_theta", 10000},
      {"rope_scaling", {{"type", "yarn"}, {"factor", 40}, {"original_max_position_embeddings", 4096},
                        {"beta_fast", 32}, {"beta_slow", 1}, {"mscale", 0.707}, {"mscale_all_dim", 0.707}}},
      {"rms_norm_eps", 1e-6}, {"hidden_act", "silu"}, {"attention_bias", false}, {"attention_dropout", 0.0},
      {"tie_word_embeddings", false}, {"bos_token_id", 100000}, {"eos_token_id", 100001},
      {"torch_dtype", "bfloat16"}};
  test::TempDir dir;
  hf::write_file(dir / "config.json", c.dump(2));
  const int64_t D = 2048, V = 102400, H = 16;
  const int64_t attn = H * 192 * D + 576 * D + 512 + H * 256 * 512 + D * H * 128 + 2 * D;
  const int64_t dense = 3 * 10944 * D, moe = 64 * D + (64 + 2) * 3 * 1408 * D;
  const int64_t params = 2 * V * D + D + 27 * attn + dense + 26 * moe;
  EXPECT_EQ(Model::whole_fp32_bytes(dir.str()), 4 * params);
  EXPECT_NEAR(double(params), 15.7e9, 0.05e9);  // DeepSeek-V2-Lite: "15.7B total parameters"
}

// ----------------------------------------------------------------- bad inputs, one line each

TEST(BadDeepseek, Table) {
  struct BadCase {
    const char* name;
    std::function<void(nlohmann::json&, hf::TensorMap&)> edit;
    std::vector<std::string> parts;
  };
  const std::vector<BadCase> cases = {
      {"kv_lora_rank disagrees with the weights", [](nlohmann::json& c, hf::TensorMap&) { c["kv_lora_rank"] = 20; },
       {"config.json", "kv_lora_rank", "20 disagrees with the weights", "kv_a_proj_with_mqa.weight", "[32,48]",
        "expected 28"}},
      {"one layer's kv_b_proj of another latent width",
       [](nlohmann::json&, hf::TensorMap& w) {
         hf::Tensor& t = w["model.layers.2.self_attn.kv_b_proj.weight"];
         t.shape[1] = 20;
         t.v.resize(size_t(t.shape[0] * 20));
       },
       {"config.json", "kv_lora_rank", "layers.2.self_attn.kv_b_proj.weight", "expected 24 columns"}},
      {"noaux_tc routing", [](nlohmann::json& c, hf::TensorMap&) { c["topk_method"] = "noaux_tc"; },
       {"config.json", "topk_method", "'noaux_tc' is not supported"}},
      {"sigmoid scoring", [](nlohmann::json& c, hf::TensorMap&) { c["scoring_func"] = "sigmoid"; },
       {"config.json", "scoring_func", "'sigmoid'"}},
      {"n_group not dividing the experts",
       [](nlohmann::json& c, hf::TensorMap&) {
         c["topk_method"] = "group_limited_greedy";
         c["n_group"] = 3;
       },
       {"config.json", "n_group", "3 does not divide n_routed_experts 8"}},
      {"missing kv_lora_rank", [](nlohmann::json& c, hf::TensorMap&) { c.erase("kv_lora_rank"); },
       {"config.json", "kv_lora_rank", "missing"}},
      {"odd qk_rope_head_dim", [](nlohmann::json& c, hf::TensorMap&) { c["qk_rope_head_dim"] = 7; },
       {"config.json", "qk_rope_head_dim", "7 is odd"}},
      {"an expert missing",
       [](nlohmann::json&, hf::TensorMap& w) { w.erase("model.layers.1.mlp.experts.7.up_proj.weight"); },
       {"config.json", "n_routed_experts is 8", "experts.7.up_proj.weight"}},
      {"shared expert missing",
       [](nlohmann::json&, hf::TensorMap& w) { w.erase("model.layers.2.mlp.shared_experts.down_proj.weight"); },
       {"shared_experts.down_proj.weight", "not in weight_map"}},
  };
  for (const auto& bc : cases) {
    SCOPED_TRACE(bc.name);
    const hf::Spec s = lite_spec();
    hf::TensorMap w = hf::make_weights(s);
    nlohmann::json c = hf::make_config(s);
    bc.edit(c, w);
    test::TempDir dir;
    hf::write_model(dir.str(), c, w, 2);
    test::expect_error([&] { Model::load(dir.str()); }, bc.parts);
  }
}


// ---------------------------------------------------------------- BF16 forward (issue 37)

struct Bf16Diff {
  double plain = 0;
  std::vector<double> emulated;  // per prompt
};
// kvq's logits against the plain reference (two prompts of 24 tokens) and the BF16-emulated one
// (six of 12; bf16_bound.hpp).
Bf16Diff bf16_diff(const Model& m, const Reference& r, int vocab) {
  Bf16Diff d;
  for (uint32_t seed : {11u, 12u}) d.plain = std::max(d.plain, rel_diff(m, r, vocab, seed));
  for (uint32_t seed = 100; seed < 106; ++seed) {
    const auto ids = seeded_ids(12, vocab, seed);
    const Vec got = logits_of(m, ids);
    test::ref::Bf16Emulation on;
    d.emulated.push_back(test::ref::rel_max_diff(got, r.forward(ids)));
  }
  return d;
}

// DeepSeek-V2-Lite, V2 (q-LoRA, group-limited) and V3 (noaux router) in BF16: equal to the
// emulated reference; V2's within the roundoff bound of the plain one (V3's sigmoid router picks
// other experts under BF16-sized changes: printed, see bf16_bound.hpp); above the floor, greedy
// ids equal; streamed (lazy experts) = whole, bit for bit.
TEST(Bf16Forward, DeepseekWithinTheRoundoffBound) {
  for (const hf::Spec& s : {lite_spec(), v2_spec(), v3_spec()}) {
    SCOPED_TRACE(s.family + (s.q_lora_rank > 0 ? " q-lora" : ""));
    Fixture f(s, false, Precision::kBf16), streamed(s, true, Precision::kBf16);
    const Bf16Diff d = bf16_diff(f.model, f.ref, s.vocab);
    std::cout << "[ info ] " << s.family << " BF16 vs the plain reference " << d.plain << " (bound " << test::bf16_logit_bound(s.layers) << (s.v3() ? ", not held: sigmoid router" : "")
              << ")\n";
    test::expect_meets_emulated(d.emulated, s.family);
    EXPECT_GT(d.plain, test::kBf16Floor);
    if (!s.v3()) {
      EXPECT_LT(d.plain, test::bf16_logit_bound(s.layers));
    }
    f.expect_same_greedy(6, 6);
    const auto ids = seeded_ids(16, s.vocab, 4);
    EXPECT_EQ(logits_of(f.model, ids), logits_of(streamed.model, ids));
  }
}

// An FP8-block checkpoint in BF16: dequantized, then rounded to BF16 (DeepSeek's fp8_cast_bf16).
// The emulated reference of the dequantized weights rounded to BF16 is met; the one of the
// unrounded weights is not (the rounding is there); the plain difference is printed (V3's router).
TEST(Bf16Forward, Fp8CheckpointDequantizedToBf16) {
  hf::Spec s = v3_spec();
  s.extra["quantization_config"] = fp8_config();
  hf::TensorMap w = hf::make_weights(s);
  hf::quantize_fp8_blocks(w, kBo, kBi, is_projection);
  // kvq rounds every FP8 projection it runs as a BF16 GEMM; kv_b_proj stays fp32 there (MLA's
  // absorbed products run in fp32), so it is left as dequantized.
  hf::TensorMap rounded = w;
  int n_rounded = 0;
  for (auto& [name, t] : rounded)
    if (t.dtype == "F8_E4M3" && name.find("kv_b_proj") == std::string::npos) {
      for (double& v : t.v) v = hf::bf16_round(v);
      ++n_rounded;
    }
  ASSERT_GT(n_rounded, 20);
  test::TempDir dir;
  hf::write_model(dir.str(), hf::make_config(s), w, 3);
  Model::LoadOptions lo;
  lo.precision = Precision::kBf16;
  const Model m = Model::load(dir.str(), lo);
  const Bf16Diff exact = bf16_diff(m, Reference(s, rounded), s.vocab), unrounded = bf16_diff(m, Reference(s, w), s.vocab);
  const double median_unrounded = [&] {
    std::vector<double> d = unrounded.emulated;
    std::sort(d.begin(), d.end());
    return d[d.size() / 2];
  }();
  std::cout << "[ info ] FP8 blocks in BF16: vs the emulated reference of the FP8 values (median prompt) "
            << median_unrounded << "; vs the plain one " << unrounded.plain << "\n";
  test::expect_meets_emulated(exact.emulated, "FP8 blocks rounded to BF16");
  EXPECT_GT(median_unrounded, 10 * test::kBf16EmulatedTol) << "the dequantized weights must be rounded to BF16";
  EXPECT_GT(unrounded.plain, test::kBf16Floor);
}

}  // namespace
}  // namespace kvq
