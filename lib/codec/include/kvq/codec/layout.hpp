#pragma once
// Host-side bridge from the allocator's HeadDecision to the packed layout (packed_layout.hpp).
#include <string>

#include "kvq/alloc/decision.hpp"
#include "kvq/codec/packed_layout.hpp"

namespace kvq::codec {

// Validates the decision against head_dim and returns its layout. Throws kvq::Error naming the
// decision (layer, KV head, side) and the field for anything the codec cannot represent: TQ groups
// that are not a partition of [0, d), widths outside 1..8, more than 32 groups, a basis or mean of
// the wrong size, rank outside [1, d], KIVI group_size < 1, d outside [1, 4096].
layout::PackedLayout layout_for(const HeadDecision& dec, int head_dim);

// Effective bits per dimension of the decision's packed layout (every stored bit per token per
// dim, see schemas/packed-layout.md); same validation as layout_for.
double effective_bpd(const HeadDecision& dec, int head_dim);

// "L3 H1 K": names a decision in messages.
std::string decision_name(const HeadDecision& dec);

}  // namespace kvq::codec
