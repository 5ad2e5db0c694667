#pragma once
// vLLM / SGLang FP8 KV-cache scales from a calibration file's activation maxima.
//   scale = amax * margin / 448 (kvq::codec::kE4M3Max): the engine stores E4M3(x / scale).
// Files (names frozen; schemas/vllm-kv-cache-scheme.schema.json, vllm-kv-cache-scales.schema.json):
//   kv_scales.safetensors   model.layers.{i}.self_attn.{k,v,q}_scale, F32; strategy "tensor": [1]
//                           each (max over the layer's heads), "attn_head": k/v [n_kv_heads],
//                           q [n_heads]
//   kv_cache_scheme.json    {"kv_cache_scheme": {...}} to merge into config.json's quantization_config
//   kv_cache_scales.json    (tp > 0) the legacy --quantization-param-path file: one scale per layer,
//                           max of that layer's per-tensor k and v scales (the loader applies it to
//                           both), the same for every tensor-parallel rank.
#include <nlohmann/json.hpp>

#include <string>
#include <vector>

#include "kvq/export/model_dir.hpp"
#include "kvq/export/safetensors_writer.hpp"
#include "kvq/io/calib_file.hpp"

namespace kvq::exporter {

enum class ScaleStrategy { kTensor, kAttnHead };
const char* to_string(ScaleStrategy s);  // "tensor", "attn_head" (vLLM's names)

struct VllmOptions {
  ScaleStrategy strategy = ScaleStrategy::kTensor;
  double margin = 1.0;  // > 0, finite: scale = amax * margin / 448
  int tp = 0;           // > 0: also write kv_cache_scales.json for this tensor-parallel size
};

// Per layer, row-major: k, v [L][per] with per = 1 (tensor) or n_kv_heads; q [L][1] or [L][n_heads].
struct VllmScales {
  ScaleStrategy strategy = ScaleStrategy::kTensor;
  int n_layers = 0, n_heads = 0, n_kv_heads = 0;
  std::vector<float> k, v, q;
  // A hybrid model's decoder layer of each KV layer (the calibration's provenance.decoder_layers);
  // the tensors and JSON name decoder layers. Empty: the same numbers.
  std::vector<int> decoder_layers;
  int name_of(int layer) const { return decoder_layers.empty() ? layer : decoder_layers[size_t(layer)]; }
  int k_per_layer() const { return strategy == ScaleStrategy::kTensor ? 1 : n_kv_heads; }
  int q_per_layer() const { return strategy == ScaleStrategy::kTensor ? 1 : n_heads; }
  // The legacy file's per-layer scale: max over the layer's k and v scales.
  float kv_layer_scale(int layer) const;
};

// Validates and computes. Throws kvq::Error naming `calib_path` when the file has no maxima (written
// before they were recorded), a shape disagrees, an amax is 0 or not finite (layer and head named:
// that head never fired), the margin is not > 0 and finite, or a scale is not a finite float > 0.
VllmScales vllm_scales(const CalibFile& c, const std::string& calib_path, const VllmOptions& o);

std::vector<StTensor> vllm_tensors(const VllmScales& s);
nlohmann::json vllm_kv_cache_scheme(ScaleStrategy s);
// `model_type`: the HF config's model_type; vLLM refuses a file naming another one.
nlohmann::json vllm_legacy_scales(const VllmScales& s, const std::string& model_type, int tp);

// Reads `calib_path`, validates everything, then writes the files into `out_dir` (created if
// missing). Nothing is written when any check fails. Returns the paths written.
std::vector<std::string> export_vllm(const std::string& calib_path, const std::string& out_dir, const VllmOptions& o);

// kvq::Error naming `file`/`field` unless the recorded config sha256 (a calibration's
// model_config_sha256) is m's config.json's and the layer counts agree.
void check_same_model(const HfModelDir& m, const std::string& recorded_sha, int recorded_layers, const std::string& file,
                      const std::string& field);

// m's config.json with quantization_config.kv_cache_scheme set to kvq's (every other field as it
// was; a quantization_config is created, quant_method compressed-tensors with no weight groups, when
// there is none). kvq::Error naming config.json when it already has a different KV-cache scheme.
nlohmann::ordered_json vllm_merged_config(const HfModelDir& m, ScaleStrategy s);

// kvq-export vllm --model: a model directory vLLM loads as it is (model_dir.hpp): config.json
// merged, kv_scales.safetensors, the index listing it, kv_cache_scales.json with o.tp > 0. Refuses
// (nothing written) an --out that exists and is not empty, a calibration of another model, a
// config with another KV scheme, a checkpoint that already has the scale tensors.
std::vector<std::string> export_vllm_model(const std::string& model_dir, const std::string& calib_path,
                                           const std::string& out_dir, const VllmOptions& o, bool copy);

}  // namespace kvq::exporter
