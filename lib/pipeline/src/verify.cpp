#include "kvq/pipeline/verify.hpp"

#include <Eigen/Dense>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <deque>
#include <numeric>
#include <sstream>

#include "kvq/alloc/common.hpp"
#include "kvq/alloc/uniform.hpp"
#include "kvq/codec/attention.hpp"
#include "kvq/codec/codec.hpp"
#include "kvq/format/decision_layout.hpp"
#include "kvq/io/alloc_file.hpp"
#include "kvq/io/h5_paths.hpp"
#include "kvq/util/error.hpp"
#include "reservoir.hpp"
#include "verify_gpu.hpp"

namespace kvq {
namespace {

using RowMat = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;

struct Accum {  // sums behind one layer's Metrics
  double mae_sum = 0, pairs = 0, kl_sum = 0, top_sum = 0, queries = 0;
  double ek = 0, nk = 0, ev = 0, nv = 0, eo = 0, no = 0;
  Metrics finish() const {
    Metrics m;
    m.logit_mae = mae_sum / std::max(1.0, pairs);
    m.kl = kl_sum / std::max(1.0, queries);
    m.top10 = top_sum / std::max(1.0, queries);
    m.nmse_k = nk > 0 ? ek / nk : 0;
    m.nmse_v = nv > 0 ? ev / nv : 0;
    m.out_rel_err = no > 0 ? eo / no : 0;
    return m;
  }
};

// Softmax over the first n entries of row (double), in place into p.
// p = softmax of the n logits s, with exp(sink) in the denominator (gpt-oss's sinks; -infinity: none).
// Returns the sink's own probability (0 without one); the keys' then sum to 1 minus it.
double softmax(const double* s, int n, std::vector<double>& p, double sink) {
  const double mx = std::max(*std::max_element(s, s + n), sink);
  double z = std::exp(sink - mx);
  const double zs = z;
  for (int j = 0; j < n; ++j) z += (p[size_t(j)] = std::exp(s[j] - mx));
  for (int j = 0; j < n; ++j) p[size_t(j)] /= z;
  return zs / z;
}

double top10_overlap(const std::vector<double>& p, const std::vector<double>& pt, int n, std::vector<int>& ia,
                     std::vector<int>& ib) {
  const int k = std::min(10, n);
  ia.resize(size_t(n));
  ib.resize(size_t(n));
  std::iota(ia.begin(), ia.end(), 0);
  std::iota(ib.begin(), ib.end(), 0);
  // Ties broken by key index so the overlap is deterministic.
  auto by = [](const std::vector<double>& v) {
    return [&v](int a, int b) { return v[size_t(a)] > v[size_t(b)] || (v[size_t(a)] == v[size_t(b)] && a < b); };
  };
  std::partial_sort(ia.begin(), ia.begin() + k, ia.end(), by(p));
  std::partial_sort(ib.begin(), ib.begin() + k, ib.end(), by(pt));
  int common = 0;
  for (int x = 0; x < k; ++x)
    for (int y = 0; y < k; ++y) common += ia[size_t(x)] == ib[size_t(y)];
  return double(common) / k;
}

struct Coded {
  std::vector<float> k_post, v;  // decoded, [T][d]
};

// Codes and decodes one head's K ([T][d], token stride `stride`) and V ([T][dv], token stride
// `v_stride`) of one window; K comes back post-RoPE.
Coded code_window(const codec::HeadCodec& kc, const codec::HeadCodec& vc, const float* k_pre_src,
                  const float* v_src, size_t stride, size_t v_stride, int T, int d, int dv,
                  const codec::RopeSpec& rope, const int64_t* pos, std::vector<float>& k_post_true,
                  std::vector<float>& v_true) {
  std::vector<float> k_pre(size_t(T) * size_t(d));
  v_true.resize(size_t(T) * size_t(dv));
  for (int t = 0; t < T; ++t) {
    std::copy_n(k_pre_src + size_t(t) * stride, d, k_pre.data() + size_t(t) * size_t(d));
    std::copy_n(v_src + size_t(t) * v_stride, dv, v_true.data() + size_t(t) * size_t(dv));
  }
  k_post_true = k_pre;
  for (int t = 0; t < T; ++t) codec::reference_apply_rope(k_post_true.data() + size_t(t) * size_t(d), d, pos[t], rope);
  Coded c;
  c.k_post.resize(k_pre.size());
  c.v.resize(v_true.size());
  if (kc.decision().post_rope) {
    kc.round_trip(k_post_true.data(), T, c.k_post.data());
  } else {
    kc.round_trip(k_pre.data(), T, c.k_post.data());
    for (int t = 0; t < T; ++t) codec::reference_apply_rope(c.k_post.data() + size_t(t) * size_t(d), d, pos[t], rope);
  }
  vc.round_trip(v_true.data(), T, c.v.data());
  return c;
}

// gpu (the allocation's pass only): every (layer, KV head, side, window) also through the GPU
// encoder and decoder, and every layer as a GPU-resident cache under the fused decode attention
// (verify_gpu.hpp).
CodedReport evaluate(const CalibFile& c, const std::vector<HeadDecision>& heads, const std::string& name,
                     pipeline_detail::GpuVerifier* gpu) {
  const auto sh = c.shape();
  const int L = sh.n_layers, H = sh.n_kv_heads, NH = sh.n_heads, d = sh.head_dim, dv = sh.v_dim(),
            gs = sh.group_size();
  const int M = c.holdout.windows, T = c.prov.seq_len;
  // The logits' scale: the recorded one (MLA: 192^-1/2 mscale^2), else 1/sqrt(d) as before (in float).
  const double scale = c.prov.softmax_scale > 0 ? c.prov.softmax_scale : double(1.0f / std::sqrt(float(d)));
  CodedReport rep;
  rep.name = name;
  const bool on_gpu = gpu && gpu->on();
  // The packed cache and its fused attention take one head dim for K and V and scale by 1/sqrt(d):
  // MLA's served cache (576 / 512, its own scale) is checked through the encoder and decoder only.
  const bool gpu_cache = on_gpu && dv == d && !(c.prov.softmax_scale > 0) && !c.prov.has_sinks();
  if (on_gpu && !gpu_cache)
    gpu->note("GPU-resident cache and fused attention not run: K dim " + std::to_string(d) + ", V dim " +
              std::to_string(dv) + (c.prov.softmax_scale > 0 ? ", recorded softmax scale" : "") +
              (c.prov.has_sinks() ? ", attention sinks" : "") +
              " (the fused kernel takes equal dims, 1/sqrt(d) and no sinks); encoder and decoder checked");
  std::vector<double> p(static_cast<size_t>(T)), pt(static_cast<size_t>(T));
  std::vector<int> ia, ib;
  for (int l = 0; l < L; ++l) {
    const int W = c.prov.window_of(l);
    const auto rope = calib_rope(c.prov, l);  // the layer's own (Gemma 3's local layers)
    Accum acc;
    // The GPU path's cache of this layer: codecs per KV head, the rows as coded
    // [window][token][KV head][d] and the post-RoPE queries [window][token][head][d].
    std::deque<codec::HeadCodec> gpu_kc, gpu_vc;
    const size_t gpu_rows = gpu_cache ? size_t(M) * size_t(T) * size_t(H) * size_t(d) : 0;
    std::vector<float> gpu_k(gpu_rows), gpu_v(gpu_rows), gpu_q(gpu_cache ? size_t(M) * size_t(T) * size_t(NH) * d : 0);
    for (int h = 0; h < H; ++h) {
      const HeadDecision *kd = nullptr, *vd = nullptr;
      for (const auto& x : heads)
        if (x.layer == l && x.kv_head == h) (x.side == Side::kK ? kd : vd) = &x;
      KVQ_ASSERT(kd && vd);
      codec::HeadCodec kc(*kd, d), vc(*vd, dv);
      if (on_gpu) {
        gpu_kc.push_back(kc);
        gpu_vc.push_back(vc);
      }
      for (int m = 0; m < M; ++m) {
        const size_t base_kv = ((size_t(l) * M + size_t(m)) * size_t(T)) * size_t(H) * size_t(d) + size_t(h) * d;
        const size_t base_v = ((size_t(l) * M + size_t(m)) * size_t(T)) * size_t(H) * size_t(dv) + size_t(h) * dv;
        std::vector<float> k_true, v_true;
        Coded cd = code_window(kc, vc, c.holdout.k.data() + base_kv, c.holdout.v.data() + base_v, size_t(H) * d,
                               size_t(H) * dv, T, d, dv, rope, c.holdout.positions.data(), k_true, v_true);
        if (on_gpu) {
          // The rows each side is coded from: K post-RoPE when the decision says so, else pre-RoPE.
          std::vector<float> k_in(k_true);
          if (!kd->post_rope)
            for (int t = 0; t < T; ++t)
              std::copy_n(c.holdout.k.data() + base_kv + size_t(t) * H * d, d, k_in.data() + size_t(t) * d);
          gpu->check_side(kc, k_in.data(), T);
          gpu->check_side(vc, v_true.data(), T);
          for (int t = 0; t < T && gpu_cache; ++t) {
            const size_t at = ((size_t(m) * T + size_t(t)) * H + size_t(h)) * d;
            std::copy_n(k_in.data() + size_t(t) * d, d, gpu_k.data() + at);
            std::copy_n(v_true.data() + size_t(t) * d, d, gpu_v.data() + at);
          }
        }
        for (size_t i = 0; i < k_true.size(); ++i) {
          acc.ek += double(k_true[i] - cd.k_post[i]) * double(k_true[i] - cd.k_post[i]);
          acc.nk += double(k_true[i]) * k_true[i];
        }
        for (size_t i = 0; i < v_true.size(); ++i) {
          acc.ev += double(v_true[i] - cd.v[i]) * double(v_true[i] - cd.v[i]);
          acc.nv += double(v_true[i]) * v_true[i];
        }
        Eigen::Map<const RowMat> K(k_true.data(), T, d), Kh(cd.k_post.data(), T, d);
        Eigen::Map<const RowMat> V(v_true.data(), T, dv), Vh(cd.v.data(), T, dv);
        for (int g = h * gs; g < (h + 1) * gs; ++g) {
          RowMat Q(T, d);
          const size_t base_q = ((size_t(l) * M + size_t(m)) * size_t(T)) * size_t(NH) * d + size_t(g) * d;
          for (int t = 0; t < T; ++t) {
            std::copy_n(c.holdout.q.data() + base_q + size_t(t) * NH * d, d, Q.data() + size_t(t) * d);
            codec::reference_apply_rope(Q.data() + size_t(t) * d, d, c.holdout.positions[size_t(t)], rope);
          }
          Eigen::MatrixXd S = (Q * K.transpose()).cast<double>() * scale;
          Eigen::MatrixXd Sh = (Q * Kh.transpose()).cast<double>() * scale;
          Eigen::MatrixXd P = Eigen::MatrixXd::Zero(T, T), Ph = Eigen::MatrixXd::Zero(T, T);
          for (int i = 0; i < T; ++i) {
            // The keys the model attends: causal 0..i, or the last W of them on a sliding-window layer.
            const int lo = W > 0 ? std::max(0, i - W + 1) : 0, n = i - lo + 1;
            Eigen::RowVectorXd s = S.row(i).segment(lo, n), sh_ = Sh.row(i).segment(lo, n);
            acc.mae_sum += (s - sh_).cwiseAbs().sum();
            acc.pairs += n;
            // A sink is one more outcome of the distribution (its probability moves with the keys').
            const double sink = c.prov.sink_of(l, g);
            const double ps = softmax(s.data(), n, p, sink), pst = softmax(sh_.data(), n, pt, sink);
            double kl = ps > 0 ? ps * (std::log(ps) - std::log(std::max(pst, 1e-300))) : 0.0;
            for (int j = 0; j < n; ++j)
              if (p[size_t(j)] > 0) kl += p[size_t(j)] * (std::log(p[size_t(j)]) - std::log(std::max(pt[size_t(j)], 1e-300)));
            acc.kl_sum += kl;
            acc.top_sum += top10_overlap(p, pt, n, ia, ib);
            acc.queries += 1;
            for (int j = 0; j < n; ++j) P(i, lo + j) = p[size_t(j)], Ph(i, lo + j) = pt[size_t(j)];
          }
          Eigen::MatrixXd O = P * V.cast<double>(), Oh = Ph * Vh.cast<double>();
          acc.eo += (O - Oh).squaredNorm();
          acc.no += O.squaredNorm();
        }
      }
    }
    if (gpu_cache) {  // the layer as a GPU-resident cache: every step appended, the fused attention checked
      for (int m = 0; m < M; ++m)
        for (int t = 0; t < T; ++t) {
          const size_t at = (size_t(m) * T + size_t(t)) * size_t(NH) * d;
          const size_t base_q = ((size_t(l) * M + size_t(m)) * size_t(T) + size_t(t)) * size_t(NH) * d;
          std::copy_n(c.holdout.q.data() + base_q, size_t(NH) * d, gpu_q.data() + at);
          // At the cache's position of token t (calib-capture's held-out positions are 0..T-1 too).
          for (int g = 0; g < NH; ++g) codec::reference_apply_rope(gpu_q.data() + at + size_t(g) * d, d, t, rope);
        }
      pipeline_detail::GpuLayer gl;
      gl.layer = l;
      gl.n_q_heads = NH;
      gl.n_kv_heads = H;
      gl.head_dim = d;
      gl.windows = M;
      gl.tokens = T;
      gl.window = W;
      gl.rope = rope;
      for (int h = 0; h < H; ++h) {
        gl.k.push_back(&gpu_kc[size_t(h)]);
        gl.v.push_back(&gpu_vc[size_t(h)]);
      }
      gl.k_rows = gpu_k.data();
      gl.v_rows = gpu_v.data();
      gl.q_rows = gpu_q.data();
      gpu->cache_layer(gl);
    }
    rep.layers.push_back(acc.finish());
  }
  for (const auto& m : rep.layers) {
    rep.overall.logit_mae += m.logit_mae / L;
    rep.overall.kl += m.kl / L;
    rep.overall.top10 += m.top10 / L;
    rep.overall.nmse_k += m.nmse_k / L;
    rep.overall.nmse_v += m.nmse_v / L;
    rep.overall.out_rel_err += m.out_rel_err / L;
  }
  return rep;
}

double side_bpd(const std::vector<HeadDecision>& heads, Side s, int d) { return alloc::mean_effective_bpd(heads, s, d); }

nlohmann::json metrics_json(const Metrics& m) {
  return {{"logit_mae", m.logit_mae}, {"kl", m.kl},         {"top10", m.top10},
          {"nmse_k", m.nmse_k},       {"nmse_v", m.nmse_v}, {"out_rel_err", m.out_rel_err}};
}

nlohmann::json coded_json(const CodedReport& r) {
  nlohmann::json layers = nlohmann::json::array();
  for (const auto& m : r.layers) layers.push_back(metrics_json(m));
  return {{"name", r.name},
          {"k_bpd_nominal", r.k_bpd_nominal},
          {"k_bpd_effective", r.k_bpd_effective},
          {"v_bpd_nominal", r.v_bpd_nominal},
          {"v_bpd_effective", r.v_bpd_effective},
          {"overall", metrics_json(r.overall)},
          {"layers", layers}};
}

}  // namespace

nlohmann::json VerifyReport::to_json() const {
  return {{"allocation", coded_json(alloc)}, {"baseline", coded_json(baseline)}, {"layer_wins", layer_wins},
          {"n_layers", n_layers},           {"match", match},                   {"cuda", cuda}, {"gpu", gpu.to_json()},                     {"failed_gates", failed_gates},
          {"passed", failed_gates.empty()}};
}

nlohmann::json GpuCheck::to_json() const {
  return {{"ran", ran},
          {"device", device},
          {"k_head_windows", k_head_windows},
          {"v_head_windows", v_head_windows},
          {"tokens", tokens},
          {"byte_mismatches", byte_mismatches},
          {"code_mismatches", code_mismatches},
          {"max_abs_diff", max_abs_diff},
          {"max_scaled_diff", max_scaled_diff},
          {"decode_tolerance", kDecodeTolerance},
          {"cache_layers", cache_layers},
          {"cache_steps", cache_steps},
          {"cache_byte_mismatches", cache_byte_mismatches},
          {"cache_code_mismatches", cache_code_mismatches},
          {"cache_length_errors", cache_length_errors},
          {"attention_problems", attention_problems},
          {"attention_max_abs_diff", attention_max_abs_diff},
          {"attention_max_scaled_diff", attention_max_scaled_diff},
          {"attention_tolerance", kAttentionTolerance},
          {"notes", notes},
          {"passed", passed()}};
}

std::string GpuCheck::summary() const {
  if (!ran && !skipped.empty()) return skipped;
  if (!ran) return "not available (no GPU): CPU reference encoder and decoder only";
  char buf[1024];
  std::snprintf(buf, sizeof buf,
                "%s: GPU encoder + decoder on %lld K and %lld V head-windows (%lld tokens): %lld code / %lld byte "
                "mismatches, max |cpu - gpu| decoded %.3g (%.3g of (1 + |x|), tolerance %.0e); GPU-resident cache "
                "of %lld layers (%lld window-steps appended by the GPU encoder): %lld code / %lld byte mismatches, "
                "%lld length errors; fused attention on %lld (layer, window, step) queries: max |cpu - gpu| %.3g "
                "(%.3g of (1 + max|out|), tolerance %.0e) -> %s",
                device.c_str(), (long long)k_head_windows, (long long)v_head_windows, (long long)tokens,
                (long long)code_mismatches, (long long)byte_mismatches, max_abs_diff, max_scaled_diff,
                kDecodeTolerance, (long long)cache_layers, (long long)cache_steps, (long long)cache_code_mismatches,
                (long long)cache_byte_mismatches, (long long)cache_length_errors, (long long)attention_problems,
                attention_max_abs_diff, attention_max_scaled_diff, kAttentionTolerance,
                passed() ? "agree" : "DISAGREE");
  std::string out = buf;
  for (const std::string& n : notes) out += "; " + n;
  return out;
}

int match_effective_bits(const std::string& kind, int n_layers, int n_kv_heads, int head_dim, Side side,
                         double target, bool norm_correction) {
  return alloc::match_effective_bits(kind, alloc::Shape{n_layers, n_kv_heads, head_dim}, side, target, norm_correction);
}

VerifyReport run_verify(const VerifyOptions& o) {
  if (o.baseline != "uniform" && o.baseline != "kivi")
    throw Error("", "--baseline", "unknown baseline '" + o.baseline + "' (uniform or kivi)");
  alloc::check_match(o.match, o.baseline_k_bpd, o.baseline_v_bpd);
  CalibFile c = read_calib(o.calib, true);
  AllocFile a = read_alloc(o.alloc);
  check_alloc_matches(a, o.alloc, c, o.calib);
  if (c.holdout.windows < 1)
    throw Error(o.calib, h5path::kHoldoutWindows, "0: no held-out windows to verify on (calib-capture --holdout N)");
  const int d = c.prov.head_dim, dv = c.prov.v_dim();
  VerifyReport r;
  r.n_layers = c.prov.n_layers;
  double kb = o.baseline_k_bpd > 0 ? o.baseline_k_bpd : a.k_bpd_nominal;
  double vb = o.baseline_v_bpd > 0 ? o.baseline_v_bpd : a.v_bpd_nominal;
  const alloc::Shape shape{c.prov.n_layers, c.prov.n_kv_heads, c.prov.head_dim, dv};
  const double alloc_k_eff = side_bpd(a.heads, Side::kK, d), alloc_v_eff = side_bpd(a.heads, Side::kV, dv);
  r.match = o.match;
  if (o.match == "effective") {  // before any coding: an unreachable budget fails at once
    const bool nc = alloc::tq_norm_correction(a.heads);
    kb = match_effective_bits(o.baseline, shape.n_layers, shape.n_kv_heads, d, Side::kK, alloc_k_eff, nc);
    vb = match_effective_bits(o.baseline, shape.n_layers, shape.n_kv_heads, dv, Side::kV, alloc_v_eff, nc);
  }
  pipeline_detail::GpuVerifier gpu(o.cuda);
  gpu.limit_dims(d, dv);
  r.alloc = evaluate(c, a.heads, a.method + (a.v_method != a.method ? "/" + a.v_method : ""), &gpu);
  r.gpu = gpu.finish();
  r.cuda = r.gpu.summary();
  r.alloc.k_bpd_nominal = a.k_bpd_nominal;
  r.alloc.v_bpd_nominal = a.v_bpd_nominal;
  r.alloc.k_bpd_effective = alloc_k_eff;
  r.alloc.v_bpd_effective = alloc_v_eff;
  auto base = alloc::baseline_heads(o.baseline, shape, kb, vb, alloc::tq_norm_correction(a.heads), o.alloc,
                                    "pass --baseline-k-bpd / --baseline-v-bpd");
  // An allocation whose TQ heads differ in norm correction was made by --norm-correction auto:
  // the baseline's TQ heads decide the same way (the same reservoir measurement), not by the
  // allocation's first head.
  bool mixed_nc = false;
  for (const auto& h : a.heads)
    if (h.kind == CodingKind::kTqGroups && h.norm_correction != alloc::tq_norm_correction(a.heads)) mixed_nc = true;
  if (mixed_nc && c.reservoir.size() > 0) {
    const int rows = a.params.is_object() && a.params.contains("measure_tokens") && a.params["measure_tokens"].is_number_integer()
                         ? a.params["measure_tokens"].get<int>()
                         : 1024;
    for (auto& h : base)
      if (h.kind == CodingKind::kTqGroups) h.norm_correction = choose_norm_correction(c, h, std::max(1, rows)).on;
  }
  r.baseline = evaluate(c, base, o.baseline, nullptr);
  r.baseline.k_bpd_nominal = kb;
  r.baseline.v_bpd_nominal = vb;
  r.baseline.k_bpd_effective = side_bpd(base, Side::kK, d);
  r.baseline.v_bpd_effective = side_bpd(base, Side::kV, dv);
  for (int l = 0; l < r.n_layers; ++l)
    r.layer_wins += r.alloc.layers[size_t(l)].logit_mae < r.baseline.layers[size_t(l)].logit_mae;

  auto gate = [&](bool fail, const std::string& flag, double value, double limit) {
    if (!fail) return;
    char buf[256];
    std::snprintf(buf, sizeof buf, "%s %.6g (measured %.6g)", flag.c_str(), limit, value);
    r.failed_gates.push_back(buf);
  };
  const auto& ov = r.alloc.overall;
  gate(o.max_logit_mae >= 0 && ov.logit_mae > o.max_logit_mae, "--max-logit-mae", ov.logit_mae, o.max_logit_mae);
  gate(o.max_kl >= 0 && ov.kl > o.max_kl, "--max-kl", ov.kl, o.max_kl);
  gate(o.min_top10 >= 0 && ov.top10 < o.min_top10, "--min-top10", ov.top10, o.min_top10);
  gate(o.max_nmse_k >= 0 && ov.nmse_k > o.max_nmse_k, "--max-nmse-k", ov.nmse_k, o.max_nmse_k);
  gate(o.max_nmse_v >= 0 && ov.nmse_v > o.max_nmse_v, "--max-nmse-v", ov.nmse_v, o.max_nmse_v);
  gate(o.min_layer_wins >= 0 && r.layer_wins < o.min_layer_wins, "--min-layer-wins", r.layer_wins, o.min_layer_wins);
  if (!r.gpu.passed()) r.failed_gates.push_back("gpu: " + r.cuda);  // the GPU path must reproduce the CPU's
  return r;
}

std::string format_report(const VerifyReport& r) {
  std::ostringstream s;
  char buf[512];
  std::snprintf(buf, sizeof buf, "%-22s K bpd nominal %.3g effective %.4g | V bpd nominal %.3g effective %.4g\n",
                r.alloc.name.c_str(), r.alloc.k_bpd_nominal, r.alloc.k_bpd_effective, r.alloc.v_bpd_nominal,
                r.alloc.v_bpd_effective);
  s << buf;
  std::snprintf(buf, sizeof buf, "%-22s K bpd nominal %.3g effective %.4g | V bpd nominal %.3g effective %.4g\n",
                ("baseline " + r.baseline.name).c_str(), r.baseline.k_bpd_nominal, r.baseline.k_bpd_effective,
                r.baseline.v_bpd_nominal, r.baseline.v_bpd_effective);
  s << buf;
  if (r.match == "effective") {
    std::snprintf(buf, sizeof buf,
                  "baseline budget: --match effective, per side the nearest effective bpd >= the "
                  "allocation's (K %.4g >= %.4g, V %.4g >= %.4g)\n",
                  r.baseline.k_bpd_effective, r.alloc.k_bpd_effective, r.baseline.v_bpd_effective,
                  r.alloc.v_bpd_effective);
    s << buf;
  }
  s << "layer  logit-MAE(alloc / base)   KL(alloc / base)        top10(alloc / base)  NMSE-K(alloc / base)  "
       "NMSE-V(alloc / base)  win\n";
  auto row = [&](const std::string& label, const Metrics& a, const Metrics& b, const char* win) {
    std::snprintf(buf, sizeof buf, "%-6s %.5f / %.5f   %.3e / %.3e   %.3f / %.3f        %.4f / %.4f       %.4f / %.4f       %s\n",
                  label.c_str(), a.logit_mae, b.logit_mae, a.kl, b.kl, a.top10, b.top10, a.nmse_k, b.nmse_k, a.nmse_v,
                  b.nmse_v, win);
    s << buf;
  };
  for (int l = 0; l < r.n_layers; ++l) {
    const auto& a = r.alloc.layers[size_t(l)];
    const auto& b = r.baseline.layers[size_t(l)];
    row(std::to_string(l), a, b, a.logit_mae < b.logit_mae ? "yes" : "no");
  }
  row("all", r.alloc.overall, r.baseline.overall, "");
  std::snprintf(buf, sizeof buf, "layer wins (logit MAE): %d/%d\nGPU path: %s\n", r.layer_wins, r.n_layers,
                r.cuda.c_str());
  s << buf;
  return s.str();
}

}  // namespace kvq
