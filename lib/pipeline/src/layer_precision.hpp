#pragma once
// kvq_pipeline's private layer-precision wiring (layer_precision.cpp): what each head costs in each
// format, measured on the calibration reservoir, and the allocation from it.
#include <functional>
#include <vector>

#include "kvq/alloc/layer_precision.hpp"
#include "kvq/alloc/vllm_turboquant.hpp"
#include "kvq/io/calib_file.hpp"
#include "kvq/pipeline/allocate.hpp"

namespace kvq {

// Per (layer, KV head) and format: index (layer * H + head) * F + f, F = formats.size().
struct LayerPrecisionCosts {
  std::vector<double> k, v;
};

// The decision of head (layer, head) and side in its variant f (0 .. n_k - 1 for K, n_v - 1 for V).
using HeadVariant = std::function<HeadDecision(int layer, int head, Side side, int f)>;

// The measurement below for any set of variants per side: index (layer * H + head) * n_k + f
// (K) and * n_v + f (V).
LayerPrecisionCosts measure_head_costs(const CalibFile& c, int n_k, int n_v, const HeadVariant& variant, bool attention,
                                       int measure_tokens);

// On the reservoir's first n = min(rows, measure_tokens) rows, each head coded in each format with
// its static scale (K post-RoPE, as the serving cache stores it):
//  mse:       the mean over rows of ||x - x^||^2;
//  attention: with the group's query heads at the first min(n, kNormCorrectionQueries) rows as
//             queries (post-RoPE at their positions) and all n rows as keys and values (every
//             pair, as choose_norm_correction), logits s = q k * scale (the recorded softmax scale,
//             1/sqrt(d) unless the file records one), P = softmax over the keys:
//             K: the mean over (query, key) pairs of the squared logit error (q (k^ - k) * scale)^2;
//             V: the attention-output error of the values relative to the output,
//                mean_q ||P (V^ - V)||^2 / mean_q ||P V||^2 (keys exact; absolute if P V is 0).
//             Both are dimensionless, so a layer's K and V costs add.
LayerPrecisionCosts measure_layer_precision_costs(const CalibFile& c, const std::vector<MinifloatFormat>& formats,
                                                  double margin, bool attention, int measure_tokens,
                                                  const std::string& calib_path);

// kvq-allocate --method layer-precision: o.formats (combinations), o.objective, o.bpd.
alloc::Allocation allocate_layer_precision(const CalibFile& c, const AllocateOptions& o);

// kvq-allocate --method vllm-turboquant (vllm_turboquant.cpp): o.vllm_presets, o.objective,
// o.bpd or o.max_error. Refuses what the engine refuses (MLA, head dims it cannot code).
alloc::Allocation allocate_vllm_turboquant(const CalibFile& c, const AllocateOptions& o);
// --presets: "all" or a comma-separated list of vLLM preset names (throws kvq::Error naming flag).
std::vector<alloc::VllmTqPreset> vllm_presets_from_flag(const std::string& flag, const std::string& list);

}  // namespace kvq
