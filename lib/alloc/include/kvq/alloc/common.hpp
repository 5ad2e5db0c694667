#pragma once
// Types shared by every allocator: the head panel shape, the result (decisions + summary) and the
// seed derivation. Allocators are pure functions: statistics + budget in, decisions out.
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "kvq/format/decision.hpp"
#include "kvq/util/statistics.hpp"

namespace kvq::alloc {

// L layers x H KV heads of dimension d. Per-head inputs are indexed head_index = layer * H + head.
struct Shape {
  int n_layers = 0;
  int n_kv_heads = 0;
  int head_dim = 0;
  int head_dim_v = 0;  // V's dim when it differs from K's (MLA's served cache); 0: head_dim

  int v_dim() const { return head_dim_v > 0 ? head_dim_v : head_dim; }
  int dim(Side side) const { return side == Side::kV ? v_dim() : head_dim; }
  // The one-side shape whose head_dim is that side's dim (what the per-side allocators take).
  Shape for_side(Side side) const { return Shape{n_layers, n_kv_heads, dim(side), 0}; }
  int n_heads() const { return n_layers * n_kv_heads; }
  int layer_of(int index) const { return index / n_kv_heads; }
  int head_of(int index) const { return index % n_kv_heads; }
};

// Throws kvq::Error unless all three are positive (field names the offender).
void validate_shape(const Shape& s);

// What one allocation run did, for one side (or both, for joint K/V).
struct AllocSummary {
  Method method = Method::kUniform;
  double nominal_bpd = 0.0;         // the budget asked for, bits per dim
  double code_bits_per_dim = 0.0;   // stored code bits per token / (heads * d)
  // Mean over heads of the packed layout's bits per dim (codes, norms, KIVI scales, padding:
  // kvq/format/decision_layout.hpp); NaN when a decision is outside what the layout stores (a
  // width outside 1..8, rank 0), which the codec would refuse.
  double effective_bpd = 0.0;
  int64_t budget_total = 0;         // what the solver aimed at (sum over heads, bits per token)
  int64_t budget_assigned = 0;      // sum of per-head budgets actually handed out
  int64_t code_bits_used = 0;       // sum over heads of stored code bits per token
  bool has_prediction = false;      // false when the method has no distortion model (uniform)
  double predicted_distortion = 0.0;  // sum over heads of the solver's per-head prediction
  // Cross-head std of the per-head prediction at the uniform budget (before C2) and at the final
  // budgets (after C2). Equal when no C2 ran.
  double distortion_std_before = 0.0;
  double distortion_std_after = 0.0;
  // The per-head predictions at the uniform budget themselves, head_index order (joint K/V: all K
  // then all V); empty when the method has no before-C2 figure (uniform, Block-GTQ).
  std::vector<double> distortion_before;
  int heads_over_budget = 0;        // COBRA C1 round mode: heads with rank * bits > budget_bits
  int64_t bits_over_budget = 0;     // ... and by how many bits in total
  // Every solver parameter that shaped the result, as (name, value) text, for the allocation file.
  std::vector<std::pair<std::string, std::string>> params;
};

struct Allocation {
  std::vector<HeadDecision> heads;  // head_index order; for joint K/V, all K then all V
  AllocSummary summary;
};

// Deterministic 64-bit seed for one (layer, head, side, tag) from a user seed (splitmix64 chain),
// so every rotation / sign pattern is reproducible from the one recorded seed. tag = the group's
// bit width for TQ-MSE groups, 0 for the Hadamard sign seed.
uint64_t derive_seed(uint64_t base, int layer, int kv_head, Side side, uint64_t tag);


// Fill code_bits_per_dim / effective_bpd / code_bits_used from the decisions. head_dim_v: the dim
// of the V decisions when it differs (0: head_dim).
void summarize_bits(const std::vector<HeadDecision>& heads, int head_dim, AllocSummary* s, int head_dim_v = 0);

// Retired: a hand-kept copy of the packed layout's non-code bits (it charged low-rank tokens 0 bits
// for their fp16 norm, KIVI nothing for its scales, and ignored padding). Ignored; the options
// structs still carry it until their callers drop it.
struct Overhead {};
inline void summarize_bits(const std::vector<HeadDecision>& heads, int head_dim, const Overhead&, AllocSummary* s) {
  summarize_bits(heads, head_dim, s);
}

}  // namespace kvq::alloc
