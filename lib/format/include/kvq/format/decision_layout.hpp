#pragma once
// From a HeadDecision to its packed layout (packed_layout.hpp): the one function that says how many
// bytes a decision stores, used by the codec (lib/codec, which encodes into it), the allocation
// file's reader and the allocators' summary (lib/alloc, AllocSummary::effective_bpd). Each kind's
// checks and builder are its row of kCodingKinds (coding_kinds.hpp). Host-only.
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "kvq/format/coding_kinds.hpp"
#include "kvq/format/decision.hpp"
#include "kvq/format/packed_layout.hpp"
#include "kvq/util/error.hpp"

namespace kvq {
namespace layout {

// The layout of the decision's bytes, checking everything they depend on but not the payload that
// fixes what the codes mean (the low-rank basis and mean, the compact ratio codebook). Throws
// kvq::Error naming the decision (layer, KV head, side) and the field: an unknown kind or side,
// d outside [1, 4096], then the kind's own checks (coding_kinds.hpp): TQ groups that are not a
// partition of [0, d) or whose rotation is not haar/identity or codebook not gaussian/sphere
// (sphere: 2..64 dims), widths outside 1..8, more than 32 groups, rank outside [1, d], KIVI
// group_size outside 1..65536, a minifloat format that is not FP8/NVFP4 or a minifloat scale that
// is not finite and > 0.
inline PackedLayout layout_ignoring_payload(const HeadDecision& dec, int head_dim) {
  if (head_dim < 1 || head_dim > static_cast<int>(kMaxHeadDim))
    detail::bad_decision(dec, "head_dim", "must be in 1..4096, got " + std::to_string(head_dim));
  if (dec.side != Side::kK && dec.side != Side::kV)
    detail::bad_decision(dec, "side", "unknown value " + std::to_string(static_cast<uint32_t>(dec.side)));
  const CodingKindTraits* kind = find_coding_kind(dec.kind);
  if (!kind) detail::bad_decision(dec, "kind", "unknown coding kind " + std::to_string(static_cast<uint32_t>(dec.kind)));
  return kind->layout(dec, head_dim);
}

// What the codec codes with: layout_ignoring_payload's checks, then the kind's payload checks (a
// low-rank basis of d*rank and a mean of d finite values; a compact ratio codebook of
// 2^ratio_bits * groups finite values >= 0).
inline PackedLayout layout_for(const HeadDecision& dec, int head_dim) {
  const PackedLayout L = layout_ignoring_payload(dec, head_dim);
  const CodingKindTraits& kind = coding_kind(dec.kind);
  if (kind.check_payload) kind.check_payload(dec, head_dim);
  return L;
}

// The head-norm levels of a compact TQ decision (HeadDecision::ratio_bits > 0): 2^(16 - k) floats,
// level 0 = 0, level q >= 1 = float(2^(lo + (q - 1) step)) computed in double; increasing. Every
// coder (CPU encoder and decoder, the CUDA tables) uses this one table. Empty when ratio_bits == 0.
inline std::vector<float> tq_compact_levels(const HeadDecision& dec) {
  std::vector<float> lv;
  if (dec.ratio_bits <= 0) return lv;
  lv.resize(size_t{1} << (kCompactRecordBits - static_cast<uint32_t>(dec.ratio_bits)));
  lv[0] = 0.f;
  for (size_t q = 1; q < lv.size(); ++q)
    lv[q] = static_cast<float>(std::exp2(double(dec.norm_log2_lo) + double(q - 1) * double(dec.norm_log2_step)));
  return lv;
}

// Effective bits per dimension of the decision's packed layout (every stored bit per token per
// dim, see schemas/packed-layout.md); same validation as layout_for.
inline double effective_bpd(const HeadDecision& dec, int head_dim) {
  return effective_bpd(layout_for(dec, head_dim));
}

}  // namespace layout

// Code bits of each head coordinate (the kind's dim_widths; zeros for an unknown kind).
inline std::vector<int> dim_widths(const HeadDecision& dec, int head_dim) {
  std::vector<int> w(static_cast<size_t>(std::max(head_dim, 0)), 0);
  if (const CodingKindTraits* kind = find_coding_kind(dec.kind)) kind->dim_widths(dec, head_dim, w.data());
  return w;
}

// Code bits per token of the decision (the sum of dim_widths): the allocators' cost model.
inline int64_t code_bits(const HeadDecision& dec, int head_dim) {
  int64_t s = 0;
  for (int w : dim_widths(dec, head_dim)) s += w;
  return s;
}

}  // namespace kvq
