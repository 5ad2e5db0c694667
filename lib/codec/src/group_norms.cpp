#include "kvq/codec/group_norms.hpp"

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "kvq/format/decision_layout.hpp"
#include "kvq/util/error.hpp"
#include "kvq/util/rng.hpp"

namespace kvq::codec {

namespace {

// Index of the codeword with the largest dot product with r (the lowest on a tie).
size_t nearest_codeword(const std::vector<double>& cb, size_t K, size_t G, const double* r) {
  size_t best = 0;
  double best_dot = -1.0;
  for (size_t j = 0; j < K; ++j) {
    double dot = 0.0;
    for (size_t g = 0; g < G; ++g) dot += r[g] * cb[j * G + g];
    if (dot > best_dot) {
      best_dot = dot;
      best = j;
    }
  }
  return best;
}

}  // namespace

CompactNormFit fit_compact_group_norms(HeadDecision& dec, int head_dim, const float* x, int64_t n,
                                       int ratio_bits, uint64_t seed) {
  const std::string who = "compact group norms " + decision_name(dec);
  if (dec.kind != CodingKind::kTqGroups || dec.groups.size() < 2)
    throw Error("", who, "needs a TQ decision with >= 2 groups");
  if (ratio_bits < 1 || ratio_bits > static_cast<int>(layout::kMaxRatioBits))
    throw Error("", who, "ratio bits must be in 1..8, got " + std::to_string(ratio_bits));
  const size_t G = dec.groups.size();
  const size_t K = size_t{1} << ratio_bits;
  const int64_t n_use = std::min(n, kCompactFitMaxRows);

  // Ratio vectors, weights (rho^2) and the norms' range.
  std::vector<double> r, w, rho_g;
  r.reserve(static_cast<size_t>(n_use) * G);
  double lmin = INFINITY, lmax = -INFINITY;
  for (int64_t t = 0; t < n_use; ++t) {
    const float* xt = x + static_cast<size_t>(t) * static_cast<size_t>(head_dim);
    double n2 = 0.0;
    const size_t base = rho_g.size();
    for (const TqGroup& grp : dec.groups) {
      double s2 = 0.0;
      for (int c : grp.dims) {
        if (!std::isfinite(xt[c])) throw Error("", who, "non-finite input at row " + std::to_string(t));
        s2 += static_cast<double>(xt[c]) * xt[c];
      }
      rho_g.push_back(std::sqrt(s2));
      n2 += s2;
    }
    if (!(n2 > 0.0)) {
      rho_g.resize(base);
      continue;
    }
    const double rho = std::sqrt(n2);
    for (size_t g = 0; g < G; ++g) r.push_back(rho_g[base + g] / rho);
    w.push_back(n2);
    lmin = std::min(lmin, std::log2(rho));
    lmax = std::max(lmax, std::log2(rho));
  }
  const size_t N = w.size();

  dec.ratio_bits = ratio_bits;
  const uint32_t n_levels = 1u << (layout::kCompactRecordBits - static_cast<uint32_t>(ratio_bits));
  if (N == 0) {
    lmin = 0.0;
    lmax = 0.0;
  }
  const double lo = std::max(lmin - 1.0, -140.0);
  const double hi = std::max(lmax + 2.0, lo + 1.0);
  dec.norm_log2_lo = static_cast<float>(lo);
  dec.norm_log2_step = static_cast<float>((hi - lo) / double(n_levels - 2));

  // Spherical k-means++ then Lloyd.
  std::vector<double> cb(K * G, 1.0 / std::sqrt(double(G)));
  CompactNormFit fit;
  fit.rows = static_cast<int64_t>(N);
  if (N > 0) {
    Rng rng(seed);
    std::vector<double> dist(N, 1.0);  // 1 - max dot with the chosen codewords
    for (size_t j = 0; j < K; ++j) {
      double total = 0.0;
      for (size_t t = 0; t < N; ++t) total += w[t] * dist[t];
      size_t pick = 0;
      if (total > 0.0) {
        double u = rng.uniform() * total;
        for (pick = 0; pick + 1 < N; ++pick) {
          u -= w[pick] * dist[pick];
          if (u < 0.0) break;
        }
        while (pick > 0 && w[pick] * dist[pick] <= 0.0) --pick;  // never a row already covered
      } else {
        pick = static_cast<size_t>(rng.below(N));  // fewer distinct rows than codewords
      }
      std::copy_n(r.begin() + std::ptrdiff_t(pick * G), G, cb.begin() + std::ptrdiff_t(j * G));
      for (size_t t = 0; t < N; ++t) {
        double dot = 0.0;
        for (size_t g = 0; g < G; ++g) dot += r[t * G + g] * cb[j * G + g];
        dist[t] = std::min(dist[t], std::max(0.0, 1.0 - dot));
      }
    }
    std::vector<size_t> assign(N, K);
    std::vector<double> sum(K * G);
    for (int it = 0; it < kCompactFitMaxIterations; ++it) {
      bool changed = false;
      for (size_t t = 0; t < N; ++t) {
        const size_t j = nearest_codeword(cb, K, G, &r[t * G]);
        if (j != assign[t]) changed = true;
        assign[t] = j;
      }
      fit.iterations = it + 1;
      if (!changed) break;
      std::fill(sum.begin(), sum.end(), 0.0);
      for (size_t t = 0; t < N; ++t)
        for (size_t g = 0; g < G; ++g) sum[assign[t] * G + g] += w[t] * r[t * G + g];
      for (size_t j = 0; j < K; ++j) {
        double s2 = 0.0;
        for (size_t g = 0; g < G; ++g) s2 += sum[j * G + g] * sum[j * G + g];
        if (!(s2 > 0.0)) continue;  // no row: the codeword stays where it is
        const double inv = 1.0 / std::sqrt(s2);
        for (size_t g = 0; g < G; ++g) cb[j * G + g] = sum[j * G + g] * inv;
      }
    }
  }
  dec.ratio_codebook.resize(K * G);
  for (size_t i = 0; i < K * G; ++i) dec.ratio_codebook[i] = static_cast<float>(cb[i]);

  // The error the record adds, as the decoder reads it (levels and float codebook).
  const std::vector<float> levels = layout::tq_compact_levels(dec);
  double e_c = 0.0, e_h = 0.0, tot = 0.0;
  for (size_t t = 0, row = 0; t < N; ++t, row += G) {
    const float rho = static_cast<float>(std::sqrt(w[t]));
    const auto itl = std::upper_bound(levels.begin(), levels.end(), rho);
    size_t q = itl == levels.begin() ? 0 : static_cast<size_t>(itl - levels.begin()) - 1;
    if (q + 1 < levels.size() && levels[q + 1] - rho < rho - levels[q]) ++q;
    std::vector<double> rr(r.begin() + std::ptrdiff_t(row), r.begin() + std::ptrdiff_t(row + G));
    const size_t j = nearest_codeword(cb, K, G, rr.data());
    for (size_t g = 0; g < G; ++g) {
      const double exact = rr[g] * std::sqrt(w[t]);
      const double dc = exact - double(levels[q] * dec.ratio_codebook[j * G + g]);
      const double dh = exact - double(layout::f16_to_f32(layout::f32_to_f16(static_cast<float>(exact))));
      e_c += dc * dc;
      e_h += dh * dh;
    }
    tot += w[t];
  }
  fit.rel_rms = tot > 0 ? std::sqrt(e_c / tot) : 0.0;
  fit.rel_rms_fp16 = tot > 0 ? std::sqrt(e_h / tot) : 0.0;
  return fit;
}

}  // namespace kvq::codec
