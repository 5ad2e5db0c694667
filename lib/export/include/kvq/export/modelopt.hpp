#pragma once
// ModelOpt hf_quant_config.json from a layer-precision allocation (kvq-allocate --method
// layer-precision): per layer FP8 E4M3 or NVFP4 for the layer's whole K and V cache.
//   {"producer": {"name": "kvq", "version": ...},
//    "quantization": {"quant_algo": null, "kv_cache_quant_algo": "FP8" | "NVFP4" | "MIXED_PRECISION",
//                     [mixed only:] "kv_cache_quantized_layers": {"model.layers.N.self_attn":
//                     {"quant_algo": "FP8" | "NVFP4"}}, "kv_cache_schema_version": 1}}
// Schema: schemas/modelopt-hf-quant-config.schema.json. quant_algo null: kvq quantizes no weights.
#include <nlohmann/json.hpp>

#include <string>
#include <vector>

#include "kvq/io/alloc_file.hpp"

namespace kvq::exporter {

// Per layer the format every head of it (K and V) uses. Throws kvq::Error naming `alloc_path`
// when the allocation is not layer-precision, a head is not a minifloat decision, a layer's heads
// disagree, or a layer has no decisions.
std::vector<MinifloatFormat> layer_formats(const AllocFile& a, const std::string& alloc_path);

nlohmann::json modelopt_config_json(const AllocFile& a, const std::string& alloc_path = "");

// Reads, validates, writes `out_dir`/hf_quant_config.json (out_dir created if missing). Returns the
// paths written.
std::vector<std::string> export_modelopt(const std::string& alloc_path, const std::string& out_dir);

}  // namespace kvq::exporter
