#pragma once
// vllm-turboquant: the setting vLLM's TurboQuant cache takes — one preset for the whole model
// (--kv-cache-dtype turboquant_*) and the layers it keeps in the model dtype
// (--kv-cache-dtype-skip-layers), always including the engine's own boundary layers — chosen on
// measured per-head errors: the lowest total error within a bits-per-dimension budget, or the
// fewest bytes whose total error is at most a bound. Decisions are coding kind vllm-turboquant.
#include <cstdint>
#include <string>
#include <vector>

#include "kvq/alloc/common.hpp"

namespace kvq::alloc {

// The widths a side can take (coding kind vllm-turboquant's `bits`): 16 = kept (BF16).
inline constexpr int kVllmTqKeyBits[] = {3, 4, 8, 16};
inline constexpr int kVllmTqValueBits[] = {3, 4, 16};
inline constexpr int kVllmTqKeyVariants = 4, kVllmTqValueVariants = 3;

// vLLM's boundary protection for a dense model (TurboQuantConfig.get_boundary_skip_layers with
// n = 2): the first and the last min(2, L / 2) layers, ascending, without repeats.
std::vector<int> vllm_tq_forced_layers(int n_layers);

struct VllmTqPreset {
  std::string name;  // the --kv-cache-dtype value
  int key_bits = 0;  // 3, 4 or 8 (FP8)
  int value_bits = 0;  // 3 or 4
};

struct VllmTqInput {
  Shape shape;  // head_dim == v_dim (vLLM has no MLA path)
  std::vector<VllmTqPreset> presets;  // the candidates; ties go to the earlier
  // Measured per head and width, any finite figure >= 0 that adds over heads and sides:
  // k_err[(layer * H + head) * kVllmTqKeyVariants + i] with key width kVllmTqKeyBits[i], and
  // v_err[(layer * H + head) * kVllmTqValueVariants + i] with value width kVllmTqValueBits[i].
  std::vector<double> k_err, v_err;
  // Or measured per layer as a whole (the end-to-end probe, kvq-probe: the layer's K and V coded
  // together): layer_err[layer * (P + 1) + p] for presets[p], p = P for the layer kept. When
  // non-empty it replaces the per-head sums (k_err / v_err may then be empty).
  std::vector<double> layer_err;
  std::vector<int> forced;  // layers always kept (vllm_tq_forced_layers; hybrid models: none)
};

// Exactly one of: bpd > 0 (the lowest total error whose cache is at most bpd bits per dimension
// on average over every K and V dimension, counted as the engine allocates it: a coded layer's
// slot, key + value rounded up to even bytes; a kept layer 16 bits per dim) or max_error >= 0 (the fewest bytes
// whose total error is at most max_error; ties: the lower error, then the earlier preset).
struct VllmTqTarget {
  double bpd = 0.0;
  double max_error = -1.0;
};

struct VllmTqChoice {
  size_t preset = 0;            // index into presets
  std::vector<int> kept;        // ascending, includes forced
  double error = 0.0;           // total measured error of the choice
  int64_t bits = 0;             // the engine's cache bits per token (all layers, K and V)
  double default_error = 0.0;   // the same preset with the forced layers only (vLLM's default)
  int64_t default_bits = 0;
};

// Per preset, keeping a layer costs the same extra bits wherever it is, so the best set of k kept
// layers is the forced ones plus the k largest measured gains (coded error - kept error, > 0 only);
// the choice scans k and the presets. Throws kvq::Error when no preset meets the target (the
// message names the smallest budget / error reachable) or on bad input.
VllmTqChoice choose_vllm_turboquant(const VllmTqInput& in, const VllmTqTarget& target);

// The allocation of the choice: all K heads (head_index order), then all V heads, kind
// vllm-turboquant, K post-RoPE. summary.params: preset, kept_layers, forced_layers, error,
// default_error, default_bpd, target.
Allocation allocate_vllm_turboquant(const VllmTqInput& in, const VllmTqTarget& target);

}  // namespace kvq::alloc
