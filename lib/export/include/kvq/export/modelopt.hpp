#pragma once
// ModelOpt hf_quant_config.json from a layer-precision allocation (kvq-allocate --method
// layer-precision): per layer FP8 E4M3 or NVFP4 for the layer's K heads and for its V heads.
//   {"producer": {"name": "kvq", "version": ...},
//    "quantization": {"quant_algo": null, "quantized_layers": {},
//                     "kv_cache_quant_algo": "FP8" | "NVFP4" | "FP8_K_NVFP4_V" | "MIXED_PRECISION",
//                     "kv_cache_quantized_layers": {"model.layers.N.self_attn":
//                     {"quant_algo": "FP8" | "NVFP4" | "FP8_K_NVFP4_V"}}, "kv_cache_schema_version": 1}}
// (ModelOpt's own KV-cache-only export: the per-layer map also when every layer agrees.)
// Schema: schemas/modelopt-hf-quant-config.schema.json. quant_algo null: kvq quantizes no weights.
// FP8_K_NVFP4_V: keys FP8, values NVFP4. NVFP4 keys with FP8 values have no ModelOpt name: refused.
#include <nlohmann/json.hpp>

#include <string>
#include <vector>

#include "kvq/export/model_dir.hpp"
#include "kvq/export/safetensors_writer.hpp"
#include "kvq/io/alloc_file.hpp"

namespace kvq::exporter {

struct LayerKvFormats {
  MinifloatFormat k = MinifloatFormat::kFp8E4M3, v = MinifloatFormat::kFp8E4M3;
  bool operator==(const LayerKvFormats& o) const { return k == o.k && v == o.v; }
};
// "FP8", "NVFP4", "FP8_K_NVFP4_V"; nullptr for a pair ModelOpt lacks.
const char* modelopt_algo(const LayerKvFormats& f);

// Per layer the format of its K heads and of its V heads. Throws kvq::Error naming `alloc_path`
// when the allocation is not layer-precision, a head is not a minifloat decision, a layer's heads of
// one side disagree, a layer has no decisions, or a layer's pair is one ModelOpt lacks.
std::vector<LayerKvFormats> layer_formats(const AllocFile& a, const std::string& alloc_path);

nlohmann::json modelopt_config_json(const AllocFile& a, const std::string& alloc_path = "");

// The per-layer scale tensors ModelOpt writes in a checkpoint: model.layers.N.self_attn.k_proj.k_scale
// and .v_proj.v_scale, F32 scalars (shape []), amax / 448 with amax the max over the layer's heads
// of that side, recovered from the heads' static scales (FP8: amax/448; NVFP4: amax/(448*6)).
std::vector<StTensor> modelopt_tensors(const AllocFile& a, const std::string& alloc_path = "");

// Reads, validates, writes `out_dir`/hf_quant_config.json (out_dir created if missing). Returns the
// paths written.
std::vector<std::string> export_modelopt(const std::string& alloc_path, const std::string& out_dir);

// kvq-export modelopt --model: the checkpoint's files linked (or copied), hf_quant_config.json, the
// scale tensors in kv_scales.safetensors and the index listing them (model_dir.hpp). Refuses
// (nothing written) an --out that exists and is not empty, an allocation of another model, a
// config.json that already has a KV-cache scheme, a model that already has hf_quant_config.json.
std::vector<std::string> export_modelopt_model(const std::string& model_dir, const std::string& alloc_path,
                                               const std::string& out_dir, bool copy);

}  // namespace kvq::exporter
