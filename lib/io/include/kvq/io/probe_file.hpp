#pragma once
// The probe file (`.kvqprobe.json`, format "kvq-probe", version 1): what kvq-probe measured, per
// layer and candidate coding, on the model's own forward (kvq/eval/probe.hpp): the mean next-token
// KL and NLL change with only that layer's K and V coded. JSON (schemas/probe.schema.json), read by
// kvq-allocate --probe. Torch-free, so the allocators read it without LibTorch.
#include <nlohmann/json.hpp>

#include <cstdint>
#include <string>
#include <vector>

namespace kvq {

inline constexpr const char* kProbeFormat = "kvq-probe";
inline constexpr int64_t kProbeVersion = 1;

struct ProbeSetting {
  std::string name;                 // vllm-turboquant: the preset's --kv-cache-dtype, or "kept"; "allocation"
  int key_bits = 0, value_bits = 0;  // vllm-turboquant's widths (16: kept in BF16); 0 for "allocation"
  std::vector<double> kl, dnll;     // per layer
};

struct ProbeFile {
  std::string candidates;           // what was probed: "vllm-turboquant", or "allocation" (an allocation's own coding)
  std::string alloc_path;           // candidates "allocation": the allocation file
  std::string model_path, model_config_sha256;
  std::string calib_path, calib_sha256, calib_digest;  // the calibration whose windows were run
  int n_layers = 0, windows = 0, seq_len = 0;
  std::string forward_precision = "fp32";  // the forwards' arithmetic; written only when "bf16"
  int64_t positions = 0, layer_forwards = 0;
  double clean_nll = 0, seconds = 0;
  std::vector<ProbeSetting> settings;
  // candidates "allocation": every layer coded at once, on the same windows (has_composite).
  bool has_composite = false;
  double composite_kl = 0, composite_dnll = 0;
};

nlohmann::ordered_json probe_json(const ProbeFile& p);

// One-line kvq::Error naming the file and the field on anything but a valid version-1 probe file
// (not JSON, another format or version, a missing field, per-layer lists of the wrong length, a
// figure that is not a finite number, a negative KL).
ProbeFile read_probe(const std::string& path);

}  // namespace kvq
