#pragma once
// A model directory an engine loads as it is (kvq-export vllm/modelopt --model M --out DIR): every
// file of the HF checkpoint M symlinked (or copied with --copy), the files kvq changes rewritten
// (config.json where the engine reads the KV scheme there), the KV scales in a safetensors file of
// their own, and model.safetensors.index.json listing every tensor of every shard and of the scale
// file exactly once (written for a single-file checkpoint too: loaders that follow the index, such
// as vLLM's, otherwise never see the scales). DIR is built in a hidden sibling directory and
// renamed into place at the end, so an error leaves nothing.
#include <nlohmann/json.hpp>

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "kvq/export/safetensors_writer.hpp"

namespace kvq::exporter {

inline constexpr const char* kIndexName = "model.safetensors.index.json";
inline constexpr const char* kScalesName = "kv_scales.safetensors";

// An HF checkpoint directory as kvq-export reads it.
struct HfModelDir {
  std::string dir;
  nlohmann::ordered_json config;   // config.json, field order kept
  std::string config_sha256;       // of config.json's bytes: what a calibration records
  int n_layers = 0;                // config's num_hidden_layers
  std::vector<std::string> shards; // safetensors files holding the weights (names in dir), sorted
  std::map<std::string, std::string> weight_map;  // tensor -> shard, from the shards' own headers
  uint64_t total_size = 0;         // bytes of every tensor's data
  nlohmann::ordered_json index_metadata = nlohmann::ordered_json::object();  // the index's, if any
};

// Tensor name -> data bytes of a safetensors file, from its header (8-byte little-endian length,
// JSON); kvq::Error naming the file on a short file, bad JSON or offsets outside the file.
std::map<std::string, uint64_t> safetensors_tensor_bytes(const std::string& path);

// Reads config.json and the shards' headers: model.safetensors, or the shards the index names.
// kvq::Error naming the file and field: no config.json, no weights, a shard the index names that is
// missing or does not hold the tensor the index puts there, a tensor in two shards.
HfModelDir read_hf_model_dir(const std::string& dir);

// What kvq adds to the directory.
struct ModelDirOutput {
  nlohmann::ordered_json config;  // written as config.json; null: the original is linked
  std::vector<StTensor> scales;   // written to kv_scales.safetensors and listed in the index (none:
                                  // neither is written, the checkpoint's own index is linked)
  std::map<std::string, std::string> scales_metadata;
  std::vector<std::pair<std::string, std::string>> extra;  // more files: name, bytes
};

// `out` must be absent or an empty directory (kvq::Error naming --out otherwise).
void check_model_out_dir(const std::string& out);

// The index kvq writes: {"metadata": {..., "total_size": N}, "weight_map": {tensor: file}}, sorted.
nlohmann::ordered_json model_index_json(const HfModelDir& m, const std::vector<StTensor>& scales);

// Builds `out`: checks (out, name clashes between the scales and the checkpoint's tensors, files
// kvq writes that the model already has), then links or copies, writes, renames. Returns the paths
// of the files kvq wrote (not the links).
std::vector<std::string> write_model_dir(const HfModelDir& m, const std::string& out, bool copy,
                                         const ModelDirOutput& o);

}  // namespace kvq::exporter
