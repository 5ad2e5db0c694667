#pragma once
// Uniform baseline: every head coded with TQ-MSE at one width, one group = the whole head vector.
#include <cstdint>
#include <string>
#include <vector>

#include "kvq/alloc/common.hpp"

namespace kvq::alloc {

struct UniformOptions {
  int b_max = 8;            // widest codebook accepted
  bool post_rope = false;   // K coded after RoPE (to compare against Block-GTQ at the same point)
  uint64_t seed = 42;       // base of derive_seed(); recorded by the caller
  Overhead overhead;
};

// bits_per_dim must be a whole number in [1, b_max] (a TQ-MSE codebook has an integer width);
// anything else throws kvq::Error naming "bits_per_dim" and the value.
Allocation allocate_uniform(const Shape& shape, Side side, double bits_per_dim,
                            const UniformOptions& opt = {});

// The baselines kvq-verify and kvq-eval compare an allocation against, at whole K and V bits:
// "uniform" = allocate_uniform (seed 42) for each side, decoding with norm correction as the compared
// allocation's TQ heads do (`norm_correction`: see tq_norm_correction), so the comparison is between
// allocations, not codec settings; "kivi" = KIVI (per-channel K, per-token V,
// groups of 32 tokens). A fractional or out-of-range width throws kvq::Error naming `source` and
// budget.k_bpd_nominal / budget.v_bpd_nominal, ending with "(<remedy>)" when the caller gives one
// (what the user can do about it, in the caller's words); an unknown kind names "kind".
std::vector<HeadDecision> baseline_heads(const std::string& kind, const Shape& shape, double k_bpd, double v_bpd,
                                         bool norm_correction, const std::string& source,
                                         const std::string& remedy = "");

// Mean effective bpd (the packed layout's bits per coordinate, side information included) of the
// `side` decisions among heads; 0 when there are none.
double mean_effective_bpd(const std::vector<HeadDecision>& heads, Side side, int head_dim);

// --match effective (kvq-verify, kvq-eval): the whole bits b in 1..8 at which the `kind` baseline
// (baseline_heads) of `shape` has the smallest mean effective bpd on `side` >= target (within
// 1e-9), and of the widths with that same effective bpd (padding: at d = 8 uniform 1 and 2 bits
// both store 4 bytes) the widest, so the baseline gets every bit the bytes hold.
// None reaches it: kvq::Error naming --match, the side, target and the baseline's widest.
int match_effective_bits(const std::string& kind, const Shape& shape, Side side, double target,
                         bool norm_correction);
// A --match value with the baseline's explicit bits (0: not given): kvq::Error naming --match
// unless it is nominal, or effective without explicit bits (effective chooses them).
void check_match(const std::string& match, double baseline_k_bpd, double baseline_v_bpd);

// The norm-correction setting of an allocation's TQ heads (one per file); kvq-allocate's default
// (on) when it has none.
bool tq_norm_correction(const std::vector<HeadDecision>& heads);

}  // namespace kvq::alloc
