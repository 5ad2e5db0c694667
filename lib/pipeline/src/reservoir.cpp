// The calibration reservoir as a head codes it (rows in the cache's space: K post-RoPE at their own
// positions) and what allocate and verify measure on it: the norm-correction choice of a TQ head.
#include "reservoir.hpp"

#include <algorithm>
#include <cmath>

#include "kvq/codec/attention.hpp"
#include "kvq/codec/codec.hpp"
#include "kvq/util/error.hpp"

namespace kvq {

codec::RopeSpec calib_rope(const CalibProvenance& p) {
  codec::RopeSpec rope;
  rope.enabled = true;
  rope.theta = p.rope_theta;
  rope.rotary_dim = p.rotary_dim;
  rope.pairing = p.pairing;
  rope.inv_freq = p.rope_inv_freq;
  rope.attention_factor = p.rope_attention_factor;
  return rope;
}

codec::RopeSpec calib_rope(const CalibProvenance& p, int layer) {
  codec::RopeSpec rope = calib_rope(p);
  if (p.local_rope(layer)) {
    rope.inv_freq = p.rope_local_inv_freq;
    rope.attention_factor = p.rope_local_attention_factor;
  }
  return rope;
}

std::vector<float> reservoir_rows(const CalibFile& c, int layer, int kv_head, Side side, bool post_rope, int64_t n) {
  const auto sh = c.shape();
  const int d = side_dim(sh, side), L = sh.n_layers, H = sh.n_kv_heads;
  KVQ_ASSERT(n >= 0 && n <= int64_t(c.reservoir.size()));
  const codec::RopeSpec rope = calib_rope(c.prov, layer);
  const auto& src = side == Side::kK ? c.reservoir.k : c.reservoir.v;
  std::vector<float> x(size_t(n) * size_t(d));
  for (int64_t t = 0; t < n; ++t) {
    float* row = x.data() + size_t(t) * size_t(d);
    std::copy_n(reservoir_row(src, t, layer, kv_head, L, H, d), d, row);
    if (post_rope) codec::reference_apply_rope(row, d, c.reservoir.source[size_t(2 * t + 1)], rope);
  }
  return x;
}

std::vector<float> reservoir_rows(const CalibFile& c, const HeadDecision& dec, int64_t n) {
  return reservoir_rows(c, dec.layer, dec.kv_head, dec.side, dec.post_rope, n);
}

NormCorrectionChoice choose_norm_correction(const CalibFile& c, const HeadDecision& dec, int measure_tokens) {
  KVQ_ASSERT(dec.kind == CodingKind::kTqGroups);
  const auto sh = c.shape();
  const int d = side_dim(sh, dec.side), L = sh.n_layers, H = sh.n_kv_heads, NQ = c.prov.n_heads;
  const int G = NQ / H;
  const int64_t n = std::min<int64_t>(c.reservoir.size(), measure_tokens);
  KVQ_ASSERT(n >= 1);
  const int64_t nq = std::min<int64_t>(n, kNormCorrectionQueries);
  const codec::RopeSpec rope = calib_rope(c.prov, dec.layer);
  const bool k_side = dec.side == Side::kK;
  const std::vector<float> x = reservoir_rows(c, dec, n);
  // Queries (K only): the group's query heads, rotated at their own positions.
  std::vector<double> q;
  if (k_side) {
    q.resize(size_t(nq) * size_t(G) * size_t(d));
    std::vector<float> row(static_cast<size_t>(d), 0.f);
    for (int64_t t = 0; t < nq; ++t)
      for (int j = 0; j < G; ++j) {
        const int qh = dec.kv_head * G + j;
        std::copy_n(reservoir_row(c.reservoir.q, t, dec.layer, qh, L, NQ, d), d, row.data());
        codec::reference_apply_rope(row.data(), d, c.reservoir.source[size_t(2 * t + 1)], rope);
        std::copy(row.begin(), row.end(), q.begin() + std::ptrdiff_t((size_t(t) * size_t(G) + size_t(j)) * size_t(d)));
      }
  }
  NormCorrectionChoice out;
  std::vector<float> y(x.size());
  std::vector<double> e(static_cast<size_t>(d), 0.0);
  for (int on = 0; on < 2; ++on) {
    HeadDecision dd = dec;
    dd.norm_correction = on == 1;
    codec::HeadCodec(dd, d).round_trip(x.data(), int(n), y.data());
    double acc = 0;
    for (int64_t s = 0; s < n; ++s) {
      for (int i = 0; i < d; ++i) e[size_t(i)] = double(x[size_t(s) * size_t(d) + size_t(i)]) - y[size_t(s) * size_t(d) + size_t(i)];
      if (!k_side) {
        for (int i = 0; i < d; ++i) acc += e[size_t(i)] * e[size_t(i)];
        continue;
      }
      for (size_t r = 0; r < size_t(nq) * size_t(G); ++r) {
        const double* qr = q.data() + r * size_t(d);
        double dot = 0;
        for (int i = 0; i < d; ++i) dot += qr[i] * e[size_t(i)];
        acc += std::fabs(dot);
      }
    }
    out.err[on] = k_side ? acc / (double(n) * double(nq) * double(G)) : acc / double(n);
  }
  out.on = out.err[1] < out.err[0];
  return out;
}

}  // namespace kvq
