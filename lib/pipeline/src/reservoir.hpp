#pragma once
// kvq_pipeline's private helpers over a calibration file's reservoir (reservoir.cpp): its rows as a
// head codes them, and the norm-correction choice allocate and verify measure on them.
#include <cstddef>
#include <cstdint>
#include <vector>

#include "kvq/codec/attention.hpp"
#include "kvq/format/decision.hpp"
#include "kvq/io/calib_file.hpp"

namespace kvq {

// The RoPE the calibration file records (its windows' own), for post-RoPE K and Q.
codec::RopeSpec calib_rope(const CalibProvenance& p);
// The RoPE layer `layer` was run with: calib_rope(p), or its local RoPE (Gemma 3, version 7).
codec::RopeSpec calib_rope(const CalibProvenance& p, int layer);

// Row (t, layer, head) of one of the reservoir's arrays, laid out [n][L][heads][d] (heads:
// n_heads for q, n_kv_heads for k and v): d floats.
inline const float* reservoir_row(const payload::FloatVector& rows, int64_t t, int layer, int head, int n_layers,
                                  int heads, int d) {
  return rows.data() + ((size_t(t) * size_t(n_layers) + size_t(layer)) * size_t(heads) + size_t(head)) * size_t(d);
}

// The calibration reservoir's first n rows of (layer, KV head, side), [n][d]; K rotated by RoPE at
// each row's position when post_rope (as the serving cache stores it).
std::vector<float> reservoir_rows(const CalibFile& c, int layer, int kv_head, Side side, bool post_rope, int64_t n);
// The same for dec's (layer, KV head, side), as the codec sees them: post-RoPE when dec.post_rope.
std::vector<float> reservoir_rows(const CalibFile& c, const HeadDecision& dec, int64_t n);

// --norm-correction auto's measurement for one TQ decision (its norm_correction ignored), on the
// calibration reservoir's first n = min(rows, measure_tokens) rows of its (layer, KV head, side),
// K post-RoPE at each row's position when dec.post_rope (as the codec sees it). Coded both ways
// with HeadCodec; K: the mean over query heads j of the KV head's group, the first
// min(n, kNormCorrectionQueries) rows t as queries (post-RoPE at their positions) and all n rows s
// as keys of |q_tj . (k_s - k^_s)| (every pair, causal or not: the keys' error seen by real
// queries); V: the mean squared reconstruction error per row. err[0] = off, err[1] = on; the
// decision is on iff err[1] < err[0].
inline constexpr int kNormCorrectionQueries = 128;
struct NormCorrectionChoice {
  double err[2] = {0, 0};
  bool on = false;
};
NormCorrectionChoice choose_norm_correction(const CalibFile& c, const HeadDecision& dec, int measure_tokens);

}  // namespace kvq
