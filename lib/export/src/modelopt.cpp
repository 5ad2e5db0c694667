#include "kvq/export/modelopt.hpp"

#include <algorithm>
#include <cmath>
#include <optional>

#include "kvq/codec/minifloat.hpp"
#include "kvq/export/vllm.hpp"
#include "kvq/util/atomic_file.hpp"
#include "kvq/util/error.hpp"
#include "out_dir.hpp"

namespace kvq::exporter {

namespace {

// ModelOpt's algorithm names of one side's format.
const char* algo_name(MinifloatFormat f) {
  switch (f) {
    case MinifloatFormat::kFp8E4M3: return "FP8";
    case MinifloatFormat::kNvfp4: return "NVFP4";
  }
  return nullptr;
}

const char* side_name(Side s) { return s == Side::kK ? "K" : "V"; }

}  // namespace

const char* modelopt_algo(const LayerKvFormats& f) {
  if (f.k == f.v) return algo_name(f.k);
  if (f.k == MinifloatFormat::kFp8E4M3 && f.v == MinifloatFormat::kNvfp4) return "FP8_K_NVFP4_V";
  return nullptr;  // NVFP4 keys with FP8 values: ModelOpt has no such algorithm
}

std::vector<LayerKvFormats> layer_formats(const AllocFile& a, const std::string& alloc_path) {
  const std::string lp = to_string(Method::kLayerPrecision);
  if (a.method != lp || a.v_method != lp)
    throw Error(alloc_path, "method",
                "'" + a.method + "' (K) / '" + a.v_method + "' (V): kvq-export modelopt needs a " + lp +
                    " allocation (kvq-allocate --method " + lp + ")");
  const int n_layers = a.calib.n_layers;
  if (n_layers <= 0) throw Error(alloc_path, "calib.n_layers", std::to_string(n_layers) + " is not > 0");
  std::vector<std::optional<MinifloatFormat>> f[2];
  for (auto& side : f) side.resize(static_cast<size_t>(n_layers));
  for (const HeadDecision& h : a.heads) {
    const std::string where = "layer " + std::to_string(h.layer) + " " + side_name(h.side) + " head " +
                              std::to_string(h.kv_head);
    if (h.layer < 0 || h.layer >= n_layers)
      throw Error(alloc_path, "heads", where + ": layer outside 0.." + std::to_string(n_layers - 1));
    if (h.kind != CodingKind::kMinifloat)
      throw Error(alloc_path, "heads", where + ": not a minifloat (FP8/NVFP4) decision (kind " +
                                           std::to_string(static_cast<uint32_t>(h.kind)) + ")");
    if (!algo_name(h.minifloat))
      throw Error(alloc_path, "heads", where + ": unknown minifloat format " +
                                           std::to_string(static_cast<uint32_t>(h.minifloat)));
    auto& lf = f[h.side == Side::kK ? 0 : 1][size_t(h.layer)];
    if (lf && *lf != h.minifloat)
      throw Error(alloc_path, "heads",
                  where + " is " + algo_name(h.minifloat) + " but other " + side_name(h.side) + " heads of layer " +
                      std::to_string(h.layer) + " are " + algo_name(*lf) +
                      ": ModelOpt takes one KV-cache format per layer (for its K, and for its V)");
    lf = h.minifloat;
  }
  std::vector<LayerKvFormats> out;
  for (int l = 0; l < n_layers; ++l) {
    if (!f[0][size_t(l)] || !f[1][size_t(l)])
      throw Error(alloc_path, "heads", "layer " + std::to_string(l) + " has no decisions");
    const LayerKvFormats p{*f[0][size_t(l)], *f[1][size_t(l)]};
    if (!modelopt_algo(p))
      throw Error(alloc_path, "heads",
                  "layer " + std::to_string(l) + ": K " + algo_name(p.k) + " with V " + algo_name(p.v) +
                      " is a combination ModelOpt lacks (FP8, NVFP4 or FP8_K_NVFP4_V); allocate with kvq-allocate "
                      "--formats fp8,nvfp4,fp8_k_nvfp4_v");
    out.push_back(p);
  }
  return out;
}

nlohmann::json modelopt_config_json(const AllocFile& a, const std::string& alloc_path) {
  const std::vector<LayerKvFormats> f = layer_formats(a, alloc_path);
  bool uniform = true;
  for (const LayerKvFormats& x : f) uniform = uniform && x == f[0];
  // ModelOpt's KV-cache-only export (get_quant_config with no weight quantizer): no weight
  // algorithm, an empty weight-layer map, and the per-layer KV map even when every layer agrees.
  nlohmann::json q;
  q["quant_algo"] = nullptr;
  q["quantized_layers"] = nlohmann::json::object();
  q["kv_cache_quant_algo"] = uniform ? modelopt_algo(f[0]) : "MIXED_PRECISION";
  nlohmann::json layers = nlohmann::json::object();
  for (size_t l = 0; l < f.size(); ++l)
    layers["model.layers." + std::to_string(a.calib.decoder_index(int(l))) + ".self_attn"] = {{"quant_algo", modelopt_algo(f[l])}};
  q["kv_cache_quantized_layers"] = layers;
  q["kv_cache_schema_version"] = 1;
  return {{"producer", {{"name", "kvq"}, {"version", KVQ_VERSION}}}, {"quantization", q}};
}

std::vector<StTensor> modelopt_tensors(const AllocFile& a, const std::string& alloc_path) {
  layer_formats(a, alloc_path);  // validated
  const int L = a.calib.n_layers;
  std::vector<double> amax[2] = {std::vector<double>(size_t(L), 0.0), std::vector<double>(size_t(L), 0.0)};
  for (const HeadDecision& h : a.heads) {
    // The head's static scale is amax/448 (FP8) or amax/(448*6) (NVFP4's global scale).
    const double am = double(h.scale) * codec::kE4M3Max * (h.minifloat == MinifloatFormat::kNvfp4 ? 6.0 : 1.0);
    if (!(am > 0) || !std::isfinite(am))
      throw Error(alloc_path, "heads", "layer " + std::to_string(h.layer) + " " + side_name(h.side) + " head " +
                                           std::to_string(h.kv_head) + ": scale " + std::to_string(h.scale) +
                                           " is not a finite number > 0");
    auto& m = amax[h.side == Side::kK ? 0 : 1][size_t(h.layer)];
    m = std::max(m, am);
  }
  std::vector<StTensor> t;
  for (int l = 0; l < L; ++l) {
    const std::string p = "model.layers." + std::to_string(a.calib.decoder_index(l)) + ".self_attn.";
    t.push_back(f32_tensor(p + "k_proj.k_scale", {}, {float(amax[0][size_t(l)] / codec::kE4M3Max)}));
    t.push_back(f32_tensor(p + "v_proj.v_scale", {}, {float(amax[1][size_t(l)] / codec::kE4M3Max)}));
  }
  return t;
}

std::vector<std::string> export_modelopt(const std::string& alloc_path, const std::string& out_dir) {
  detail::check_out_dir(out_dir);
  const AllocFile a = read_alloc(alloc_path);
  const std::string text = modelopt_config_json(a, alloc_path).dump(2) + "\n";
  detail::make_out_dir(out_dir);
  const std::string p = out_dir + "/hf_quant_config.json";
  write_file_atomically(p, text);
  return {p};
}

std::vector<std::string> export_modelopt_model(const std::string& model_dir, const std::string& alloc_path,
                                               const std::string& out_dir, bool copy) {
  check_model_out_dir(out_dir);
  const HfModelDir m = read_hf_model_dir(model_dir);
  const std::string where = m.dir + "/config.json";
  if (m.config.contains("quantization_config") && m.config["quantization_config"].is_object()) {
    const auto& q = m.config["quantization_config"];
    for (const char* k : {"kv_cache_scheme", "kv_cache_quant_algo"})
      if (q.contains(k) && !q[k].is_null())
        throw Error(where, std::string("quantization_config.") + k,
                    q[k].dump() + ": the model already has a KV-cache scheme; export from a checkpoint without one");
  }
  const AllocFile a = read_alloc(alloc_path);
  check_same_model(m, a.calib.model_config_sha256, a.calib.decoder_layer_count(), alloc_path, "calibration.model_config_sha256");
  ModelDirOutput out;
  out.config = nullptr;  // config.json linked as it is: ModelOpt reads hf_quant_config.json
  out.scales = modelopt_tensors(a, alloc_path);
  out.scales_metadata = {{"format", "pt"}, {"producer", std::string("kvq ") + KVQ_VERSION}};
  out.extra.emplace_back("hf_quant_config.json", modelopt_config_json(a, alloc_path).dump(2) + "\n");
  return write_model_dir(m, out_dir, copy, out);
}

}  // namespace kvq::exporter
