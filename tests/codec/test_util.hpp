#pragma once
// Shared helpers for the codec tests: seeded data and decision builders.
#include <cmath>
#include <cstdint>
#include <numeric>
#include <vector>

#include "kvq/codec/group_norms.hpp"
#include "kvq/format/decision.hpp"
#include "kvq/util/rng.hpp"

namespace kvq::codec::test {

inline std::vector<float> gaussian_rows(int n, int d, uint64_t seed, double sigma = 1.0) {
  Rng rng(seed);
  std::vector<float> x(static_cast<size_t>(n) * d);
  for (float& v : x) v = static_cast<float>(sigma * rng.normal());
  return x;
}

inline HeadDecision tq_uniform(int d, int bits, uint64_t seed = 7, Side side = Side::kK) {
  HeadDecision dec;
  dec.side = side;
  dec.kind = CodingKind::kTqGroups;
  TqGroup g;
  g.bits = bits;
  g.dims.resize(static_cast<size_t>(d));
  std::iota(g.dims.begin(), g.dims.end(), 0);
  g.rotation_seed = seed;
  dec.groups.push_back(g);
  return dec;
}

// Block-GTQ-shaped decision: split-half RoPE blocks (i, i + d/2) assigned widths cyclically from
// `widths`; blocks of equal width form one group, in block order.
inline HeadDecision tq_blocks(int d, const std::vector<int>& widths) {
  HeadDecision dec;
  dec.kind = CodingKind::kTqGroups;
  dec.post_rope = true;
  const int nb = d / 2;
  for (size_t w = 0; w < widths.size(); ++w) {
    TqGroup g;
    g.bits = widths[w];
    g.rotation_seed = 42 + static_cast<uint64_t>(widths[w]);
    for (int i = static_cast<int>(w); i < nb; i += static_cast<int>(widths.size())) {
      g.dims.push_back(i);
      g.dims.push_back(i + nb);
    }
    if (!g.dims.empty()) dec.groups.push_back(g);
  }
  dec.block_bits.resize(static_cast<size_t>(nb));
  return dec;
}

// The same TQ decision decoding with norm correction (allocation version 2).
inline HeadDecision norm_corrected(HeadDecision dec) {
  dec.norm_correction = true;
  return dec;
}

// The same TQ decision with groups narrower than `below` bits unrotated (--rotate-below).
inline HeadDecision rotate_below(HeadDecision dec, int below) {
  for (TqGroup& g : dec.groups)
    if (g.bits < below) g.rotation = TqRotation::kIdentity;
  return dec;
}

// The same TQ decision (>= 2 groups) with compact group norms (kvq-allocate --group-norms compact):
// tables fitted to seeded rows whose groups have different scales (so the ratios vary).
inline HeadDecision compact_norms(HeadDecision dec, int d, int ratio_bits, uint64_t seed = 5) {
  std::vector<float> x = gaussian_rows(512, d, seed);
  Rng rng(seed + 1);
  for (int t = 0; t < 512; ++t) {
    const double scale = std::exp2(4.0 * rng.uniform() - 2.0);
    for (int i = 0; i < d; ++i) x[static_cast<size_t>(t) * d + i] *= static_cast<float>(scale * (1.0 + (i % 5)));
  }
  fit_compact_group_norms(dec, d, x.data(), 512, ratio_bits, seed);
  return dec;
}

// Orthonormal basis from a seeded Gaussian (Gram-Schmidt), [d][r] row-major.
inline std::vector<float> random_basis(int d, int r, uint64_t seed) {
  Rng rng(seed);
  std::vector<double> cols(static_cast<size_t>(r) * d);
  for (int k = 0; k < r; ++k) {
    double* c = &cols[static_cast<size_t>(k) * d];
    for (int i = 0; i < d; ++i) c[i] = rng.normal();
    for (int p = 0; p < k; ++p) {
      const double* q = &cols[static_cast<size_t>(p) * d];
      double dot = 0;
      for (int i = 0; i < d; ++i) dot += c[i] * q[i];
      for (int i = 0; i < d; ++i) c[i] -= dot * q[i];
    }
    double n = 0;
    for (int i = 0; i < d; ++i) n += c[i] * c[i];
    n = std::sqrt(n);
    for (int i = 0; i < d; ++i) c[i] /= n;
  }
  std::vector<float> basis(static_cast<size_t>(d) * r);
  for (int i = 0; i < d; ++i)
    for (int k = 0; k < r; ++k)
      basis[static_cast<size_t>(i) * r + k] = static_cast<float>(cols[static_cast<size_t>(k) * d + i]);
  return basis;
}

inline HeadDecision lrh(int d, int rank, int bits, uint64_t seed = 3, Side side = Side::kK) {
  HeadDecision dec;
  dec.side = side;
  dec.kind = CodingKind::kLowRankHadamard;
  dec.rank = rank;
  dec.bits = bits;
  dec.budget_bits = rank * bits;
  dec.basis = random_basis(d, rank, seed + 1000);
  dec.mean.assign(static_cast<size_t>(d), 0.f);
  dec.hadamard_seed = seed;
  return dec;
}

// A non-zero mean, so tests see whether decoders and kernels add it back (and score with it).
inline HeadDecision with_mean(HeadDecision dec, float amplitude = 0.7f) {
  for (size_t i = 0; i < dec.mean.size(); ++i) dec.mean[i] = amplitude * static_cast<float>(std::sin(1.0 + 0.37 * i));
  return dec;
}

inline HeadDecision kivi(Side side, int bits, int group = 32) {
  HeadDecision dec;
  dec.side = side;
  dec.kind = CodingKind::kKivi;
  dec.bits = bits;
  dec.group_size = group;
  return dec;
}

}  // namespace kvq::codec::test
