#pragma once
// kvq-export vllm-turboquant: the `vllm serve` arguments of a vllm-turboquant allocation
// (kvq-allocate --method vllm-turboquant): --kv-cache-dtype <preset> --kv-cache-dtype-skip-layers
// <every kept layer, space-separated global layer indices> (the engine unions the list with its own
// boundary layers, which the allocation always keeps), and the same as JSON:
//   {"producer": {...}, "kv_cache_dtype": "turboquant_k3v4_nc",
//    "kv_cache_dtype_skip_layers": ["0", "1", ...], "vllm_serve_args": [...],
//    "measured": {"objective", "error", "default_error", "bits_per_dim", "default_bits_per_dim"}}
#include <nlohmann/json.hpp>

#include <string>
#include <vector>

#include "kvq/io/alloc_file.hpp"

namespace kvq::exporter {

struct VllmTqSetting {
  std::string preset;
  std::vector<int> kept;  // ascending
};

// The preset and kept layers the allocation's decisions spell (every head of a layer alike; K and V
// widths one preset's), refusing in one line (naming alloc_path) what the engine cannot serve: not a
// vllm-turboquant allocation, a layer with mixed decisions, widths no preset has, a head dim vLLM
// cannot code, an MLA latent cache, a sliding-window layer not kept.
VllmTqSetting vllm_tq_setting(const AllocFile& a, const std::string& alloc_path);

std::vector<std::string> vllm_tq_serve_args(const VllmTqSetting& s);
nlohmann::ordered_json vllm_tq_json(const AllocFile& a, const std::string& alloc_path);

// The arguments as one line into *args_line; with out_dir, writes out_dir/vllm_turboquant.json and
// out_dir/vllm_serve_args.txt (the line) and returns their paths. With model_dir: out_dir is the
// checkpoint's files linked (or copied) plus those two (write_model_dir), refused for an
// allocation of another model. Call inside an OutputBatch (kvq-export's main).
std::vector<std::string> export_vllm_turboquant(const std::string& alloc_path, const std::string& out_dir,
                                                const std::string& model_dir, bool copy, std::string* args_line);

}  // namespace kvq::exporter
