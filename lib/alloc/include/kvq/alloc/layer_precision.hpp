#pragma once
// layer-precision: per layer one serving-engine format (FP8 E4M3 or NVFP4) for all of the layer's K
// and V heads — the granularity of ModelOpt's MIXED_PRECISION kv_cache_quantized_layers map —
// minimising the total measured distortion under a mean effective-bits budget.
#include <cstdint>
#include <string>
#include <vector>

#include "kvq/alloc/common.hpp"

namespace kvq::alloc {

// The static scale a format is coded with, from a head's calibration amax (max |x|):
//   FP8:   amax * margin / 448        (vLLM k_scale / v_scale; margin >= 1 leaves headroom)
//   NVFP4: amax * margin / (448 * 6)  (the fp32 global scale, so the largest block scale is 448)
// Throws kvq::Error (field `field`) unless amax and margin are finite and > 0 and the scale is a
// normal float: a head whose amax is 0 never fired and has no scale (an error, not a silent 1.0).
float minifloat_scale(MinifloatFormat f, double amax, double margin, const std::string& field);

// Exact multiple-choice knapsack: one option per group (layer), option cost integer >= 0,
// minimise the sum of distortions subject to sum of costs <= budget. cost[g][o], distortion[g][o]
// (finite). Dynamic programme over cost in units of the gcd of all costs; ties go to the smaller
// total cost, then to the lower option indices of the earlier groups. Throws kvq::Error (field
// "bits_per_dim") when even the cheapest choice costs more than the budget.
struct GroupChoice {
  std::vector<int> option;  // per group
  double distortion = 0.0;  // sum over groups, in group order
  int64_t cost = 0;
};
GroupChoice solve_group_choice(const std::vector<std::vector<int64_t>>& cost,
                               const std::vector<std::vector<double>>& distortion, int64_t budget);

struct LayerPrecisionInput {
  Shape shape;
  std::vector<MinifloatFormat> formats;  // allowed, distinct, non-empty
  // Measured per head: the mean over the calibration reservoir's rows of ||x - x^||^2 (K post-RoPE)
  // when coded in formats[f] with the scale from its amax; index (layer * H + head) * F + f.
  std::vector<double> k_mse, v_mse;
  std::vector<float> k_amax, v_amax;  // [L][H] (Moments::k_amax / v_amax)
  double margin = 1.0;
};

// All K heads (head_index order), then all V heads; kind kMinifloat, K post_rope. A layer's cost
// is the effective bits per token of its 2H heads (packed layout, kvq/format/decision_layout.hpp:
// 8 and 4.5 bits per dim at d a multiple of 16); the budget is floor(bpd * L * 2H * d) bits per
// token, so the mean effective bpd over all K and V heads is <= bpd. summary.predicted_distortion
// is the minimised total; the per-head figure is its measured MSE. Throws kvq::Error for a budget
// below the cheapest assignment (all in the cheapest allowed format), bad input sizes or formats.
Allocation allocate_layer_precision(const LayerPrecisionInput& in, double bpd);

}  // namespace kvq::alloc
