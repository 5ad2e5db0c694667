#pragma once
// kvq-verify's per-layer figures recomputed by brute force from their definitions (verify.hpp),
// with plain loops in double: the held-out K and V of one layer coded and decoded by the CPU codec
// (K post-RoPE when the decision says so, else rotated after decoding), logits q·k · scale over the
// keys each query attends (t - W < j <= t with a window, else 0..t), softmax — with exp(sink) in the
// denominator when the model has sinks (one more outcome of the distribution in the KL, no value in
// the output, not a key in the top-10) — KL(p || p~) per query, the top-10 overlap and the attention
// output's relative error with both K^ and V^. Shared by the window, sink and per-layer RoPE tests.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "kvq/codec/attention.hpp"
#include "kvq/codec/codec.hpp"
#include "kvq/io/alloc_file.hpp"
#include "kvq/io/calib_file.hpp"
#include "kvq/pipeline/verify.hpp"

namespace kvq::test {

struct BruteOptions {
  int window = 0;       // 0: full causal
  double scale = 0.0;   // 0: the recorded softmax_scale, else 1/sqrt(head_dim)
  std::function<void(float* x, int d, int64_t pos)> rotate;  // the RoPE applied to q and k rows
  std::function<double(int query_head)> sink;                // empty: no sinks
};

// The RoPE the provenance records for every layer, through the codec's reference rotation.
inline std::function<void(float*, int, int64_t)> provenance_rotate(const CalibProvenance& p) {
  codec::RopeSpec rope;
  rope.enabled = true;
  rope.theta = p.rope_theta;
  rope.rotary_dim = p.rotary_dim;
  rope.pairing = p.pairing;
  rope.inv_freq = p.rope_inv_freq;
  rope.attention_factor = p.rope_attention_factor;
  return [rope](float* x, int d, int64_t pos) { codec::reference_apply_rope(x, d, pos, rope); };
}

inline Metrics verify_brute_force(const CalibFile& c, const AllocFile& a, int layer, const BruteOptions& o) {
  const auto& p = c.prov;
  const int H = p.n_kv_heads, NH = p.n_heads, d = p.head_dim, T = p.seq_len, M = c.holdout.windows;
  const int gs = NH / H, window = o.window;
  const double scale = o.scale > 0 ? o.scale : p.softmax_scale > 0 ? p.softmax_scale : 1.0 / std::sqrt(double(d));
  double mae = 0, pairs = 0, kl = 0, top = 0, queries = 0, eo = 0, no = 0;
  for (int h = 0; h < H; ++h) {
    const HeadDecision *kd = nullptr, *vd = nullptr;
    for (const auto& x : a.heads)
      if (x.layer == layer && x.kv_head == h) (x.side == Side::kK ? kd : vd) = &x;
    EXPECT_TRUE(kd && vd);
    if (!kd || !vd) return {};
    codec::HeadCodec kc(*kd, d), vc(*vd, d);
    for (int m = 0; m < M; ++m) {
      auto kv_at = [&](const kvq::payload::FloatVector& src, int t, int i) {
        return src[(((size_t(layer) * M + m) * T + t) * H + h) * d + i];
      };
      std::vector<float> k(size_t(T) * d), v(k.size()), kh(k.size()), vh(k.size());
      for (int t = 0; t < T; ++t)
        for (int i = 0; i < d; ++i) k[size_t(t) * d + i] = kv_at(c.holdout.k, t, i), v[size_t(t) * d + i] = kv_at(c.holdout.v, t, i);
      std::vector<float> kpost = k;
      for (int t = 0; t < T; ++t) o.rotate(kpost.data() + size_t(t) * d, d, c.holdout.positions[size_t(t)]);
      if (kd->post_rope) {
        kc.round_trip(kpost.data(), T, kh.data());
      } else {
        kc.round_trip(k.data(), T, kh.data());
        for (int t = 0; t < T; ++t) o.rotate(kh.data() + size_t(t) * d, d, c.holdout.positions[size_t(t)]);
      }
      vc.round_trip(v.data(), T, vh.data());
      for (int g = h * gs; g < (h + 1) * gs; ++g) {
        const double sink = o.sink ? o.sink(g) : -std::numeric_limits<double>::infinity();
        for (int t = 0; t < T; ++t) {
          std::vector<float> q(static_cast<size_t>(d));
          for (int i = 0; i < d; ++i) q[size_t(i)] = c.holdout.q[(((size_t(layer) * M + m) * T + t) * NH + g) * d + i];
          o.rotate(q.data(), d, c.holdout.positions[size_t(t)]);
          std::vector<int> keys;
          for (int j = 0; j <= t; ++j)
            if (window == 0 || j > t - window) keys.push_back(j);
          const int n = int(keys.size());
          std::vector<double> s(n), sh(n), pr(n), ph(n);
          for (int x = 0; x < n; ++x) {
            double a1 = 0, a2 = 0;
            for (int i = 0; i < d; ++i) {
              a1 += double(q[size_t(i)]) * kpost[size_t(keys[x]) * d + i];
              a2 += double(q[size_t(i)]) * kh[size_t(keys[x]) * d + i];
            }
            s[x] = a1 * scale, sh[x] = a2 * scale;
            mae += std::fabs(s[x] - sh[x]);
            pairs += 1;
          }
          // Returns the sink's probability (0 without one).
          auto softmax = [&](const std::vector<double>& in, std::vector<double>& out) {
            double mx = sink;
            for (int x = 0; x < n; ++x) mx = std::max(mx, in[x]);
            const double zs = std::exp(sink - mx);
            double z = zs;
            for (int x = 0; x < n; ++x) z += out[x] = std::exp(in[x] - mx);
            for (int x = 0; x < n; ++x) out[x] /= z;
            return zs / z;
          };
          const double ps = softmax(s, pr), psh = softmax(sh, ph);
          double kl_t = ps > 0 ? ps * (std::log(ps) - std::log(psh)) : 0.0;
          for (int x = 0; x < n; ++x) kl_t += pr[x] * (std::log(pr[x]) - std::log(ph[x]));
          kl += kl_t;
          // top-10 by rank counting: key x is in the top k when fewer than k keys beat it (ties to
          // the lower key index).
          const int kk = std::min(10, n);
          auto in_top = [&](const std::vector<double>& w, int x) {
            int better = 0;
            for (int y = 0; y < n; ++y) better += w[y] > w[x] || (w[y] == w[x] && y < x);
            return better < kk;
          };
          int common = 0;
          for (int x = 0; x < n; ++x) common += in_top(pr, x) && in_top(ph, x);
          top += double(common) / kk;
          queries += 1;
          for (int i = 0; i < d; ++i) {
            double out = 0, out_h = 0;
            for (int x = 0; x < n; ++x) {
              out += pr[x] * v[size_t(keys[x]) * d + i];
              out_h += ph[x] * vh[size_t(keys[x]) * d + i];
            }
            eo += (out - out_h) * (out - out_h);
            no += out * out;
          }
        }
      }
    }
  }
  Metrics r;
  r.logit_mae = mae / pairs;
  r.kl = kl / queries;
  r.top10 = top / queries;
  r.out_rel_err = eo / no;
  return r;
}

// kvq-verify on the CPU (no GPU checks).
inline VerifyReport verify_cpu(const std::string& cal, const std::string& alloc) {
  VerifyOptions o;
  o.calib = cal;
  o.alloc = alloc;
  o.cuda = false;
  return run_verify(o);
}

// The tolerances: verify multiplies float Q by float K before widening, the brute force sums in
// double (relative 1e-5 on the MAE, 1e-3 on the KL and output error; top-10 exact).
constexpr double kBruteMaeTol = 1e-5, kBruteKlTol = 1e-3;
inline void expect_same(const Metrics& got, const Metrics& want, const std::string& what) {
  EXPECT_NEAR(got.logit_mae, want.logit_mae, kBruteMaeTol * want.logit_mae) << what;
  EXPECT_NEAR(got.kl, want.kl, kBruteKlTol * want.kl) << what;
  EXPECT_NEAR(got.top10, want.top10, 1e-9) << what;
  EXPECT_NEAR(got.out_rel_err, want.out_rel_err, kBruteKlTol * want.out_rel_err) << what;
}

}  // namespace kvq::test
