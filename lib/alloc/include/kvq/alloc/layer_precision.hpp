#pragma once
// layer-precision: per layer one serving-engine format (FP8 E4M3 or NVFP4) for all of the layer's K
// heads and one for its V heads, from the combinations the target allows (ModelOpt's per-layer
// quant_algo: FP8, NVFP4 or FP8_K_NVFP4_V) — the granularity of its MIXED_PRECISION
// kv_cache_quantized_layers map — minimising the total measured distortion under a mean
// effective-bits budget.
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

// One per-layer choice: the format of the layer's K heads and of its V heads.
struct KvFormatPair {
  MinifloatFormat k = MinifloatFormat::kFp8E4M3, v = MinifloatFormat::kFp8E4M3;
  bool operator==(const KvFormatPair& o) const { return k == o.k && v == o.v; }
};
// "fp8", "nvfp4" when both sides agree, else "<k>_k_<v>_v" (e.g. "fp8_k_nvfp4_v", ModelOpt's
// FP8_K_NVFP4_V): the names of kvq-allocate --formats and the allocation's layer_formats.
std::string to_string(const KvFormatPair& p);

struct LayerPrecisionInput {
  Shape shape;
  std::vector<MinifloatFormat> formats;  // measured per side: distinct, non-empty
  // The (K, V) combinations a layer may take, each side one of `formats`, distinct. Empty: every
  // format for both sides together, (f, f) in `formats` order.
  std::vector<KvFormatPair> combos;
  // Measured per head and side when coded in formats[f] with the scale from its amax, index
  // (layer * H + head) * F + f: the reservoir MSE ||x - x^||^2 per row (K post-RoPE), or the
  // attention error (kvq-allocate --objective attention); any finite figure >= 0 that adds over
  // heads and sides.
  std::vector<double> k_mse, v_mse;
  std::vector<float> k_amax, v_amax;  // [L][H] (Moments::k_amax / v_amax)
  double margin = 1.0;
};

// All K heads (head_index order), then all V heads; kind kMinifloat, K post_rope. A layer's cost
// is the effective bits per token of its H K heads in the combination's K format plus its H V heads
// in its V format (packed layout, kvq/format/decision_layout.hpp:
// 8 and 4.5 bits per dim at d a multiple of 16); the budget is floor(bpd * L * 2H * d) bits per
// token, so the mean effective bpd over all K and V heads is <= bpd. summary.predicted_distortion
// is the minimised total; the per-head figure is its measured MSE. Throws kvq::Error for a budget
// below the cheapest assignment (all in the cheapest allowed combination), bad input sizes, formats
// or combinations. summary.params: formats (the combinations), margin, layer_formats (per layer).
Allocation allocate_layer_precision(const LayerPrecisionInput& in, double bpd);

}  // namespace kvq::alloc
