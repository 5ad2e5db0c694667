#pragma once
// Fitting a TQ decision's compact group norms (HeadDecision::ratio_bits > 0) to calibration rows:
// the head norm's level range and the ratio codebook. The bytes these tables decode are defined in
// kvq/format/packed_layout.hpp (tq_group_norm) and kvq/format/decision_layout.hpp
// (tq_compact_levels).
#include <cstdint>

#include "kvq/format/decision.hpp"

namespace kvq::codec {

// Rows per head the fit uses at most (the first ones), and its Lloyd iterations at most.
inline constexpr int64_t kCompactFitMaxRows = 8192;
inline constexpr int kCompactFitMaxIterations = 60;

struct CompactNormFit {
  int64_t rows = 0;         // rows fitted (those with ||x|| > 0, at most kCompactFitMaxRows)
  int iterations = 0;       // Lloyd iterations run
  // Relative error the compact record adds on the fitted rows, against the exact group norms:
  // sqrt(sum_t sum_g (rho_g - rho~_g)^2 / sum_t rho^2) (rho~_g as the decoder reads it).
  double rel_rms = 0.0;
  double rel_rms_fp16 = 0.0;  // the same for one fp16 norm per group, for comparison
};

// Sets dec.ratio_bits = ratio_bits (1..8) and fits norm_log2_lo / norm_log2_step / ratio_codebook
// to the rows x [n][head_dim] (coded as the head will see them: post-RoPE K when dec.post_rope;
// groups of whole RoPE pairs have the same norms either way):
//  - levels: log2 of the rows' smallest nonzero norm minus 1 up to the largest plus 2 (room for
//    held-out tokens up to 4x the calibration's largest), 2^(16-k) - 1 levels evenly in log2;
//  - ratio codebook: spherical k-means of the ratio vectors (rho_g / rho)_g, weighted by rho^2
//    (so the fit minimises the squared error the norms add to the decoded vectors), k-means++
//    initialisation from `seed`, Lloyd iterations until no row changes codeword (at most
//    kCompactFitMaxIterations); codewords are unit vectors with entries >= 0. With no nonzero
//    row every codeword is the even split 1/sqrt(G).
// Deterministic: the same rows and seed give the same tables on every CPU. Throws kvq::Error for a
// decision that is not TQ with >= 2 groups, ratio_bits outside 1..8, or a non-finite row.
CompactNormFit fit_compact_group_norms(HeadDecision& dec, int head_dim, const float* x, int64_t n,
                                       int ratio_bits, uint64_t seed);

}  // namespace kvq::codec
