#pragma once
// The codec's names for the HeadDecision -> packed layout bridge, which lives in kvq_format
// (kvq/format/decision_layout.hpp) so that lib/alloc counts a decision's bits with the same function.
#include "kvq/format/decision_layout.hpp"

namespace kvq::codec {

// layout_for validates the decision against head_dim (kvq::Error naming the decision and the
// field) and returns its layout; effective_bpd is that layout's bits per dimension.
using ::kvq::decision_name;
using ::kvq::layout::effective_bpd;
using ::kvq::layout::layout_for;

}  // namespace kvq::codec
