#include "kvq/export/modelopt.hpp"

#include <optional>

#include "kvq/util/atomic_file.hpp"
#include "kvq/util/error.hpp"
#include "out_dir.hpp"

namespace kvq::exporter {

namespace {

// ModelOpt's algorithm names (kv_cache_quant_algo / quant_algo).
const char* algo_name(MinifloatFormat f) {
  switch (f) {
    case MinifloatFormat::kFp8E4M3: return "FP8";
    case MinifloatFormat::kNvfp4: return "NVFP4";
  }
  return nullptr;
}

const char* side_name(Side s) { return s == Side::kK ? "K" : "V"; }

}  // namespace

std::vector<MinifloatFormat> layer_formats(const AllocFile& a, const std::string& alloc_path) {
  const std::string lp = to_string(Method::kLayerPrecision);
  if (a.method != lp || a.v_method != lp)
    throw Error(alloc_path, "method",
                "'" + a.method + "' (K) / '" + a.v_method + "' (V): kvq-export modelopt needs a " + lp +
                    " allocation (kvq-allocate --method " + lp + ")");
  const int n_layers = a.calib.n_layers;
  if (n_layers <= 0) throw Error(alloc_path, "calib.n_layers", std::to_string(n_layers) + " is not > 0");
  std::vector<std::optional<MinifloatFormat>> f(static_cast<size_t>(n_layers));
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
    auto& lf = f[size_t(h.layer)];
    if (lf && *lf != h.minifloat)
      throw Error(alloc_path, "heads",
                  where + " is " + algo_name(h.minifloat) + " but other heads of layer " + std::to_string(h.layer) +
                      " are " + algo_name(*lf) + ": ModelOpt takes one KV-cache format per layer");
    lf = h.minifloat;
  }
  std::vector<MinifloatFormat> out;
  for (int l = 0; l < n_layers; ++l) {
    if (!f[size_t(l)]) throw Error(alloc_path, "heads", "layer " + std::to_string(l) + " has no decisions");
    out.push_back(*f[size_t(l)]);
  }
  return out;
}

nlohmann::json modelopt_config_json(const AllocFile& a, const std::string& alloc_path) {
  const std::vector<MinifloatFormat> f = layer_formats(a, alloc_path);
  bool uniform = true;
  for (MinifloatFormat x : f) uniform = uniform && x == f[0];
  nlohmann::json q;
  q["quant_algo"] = nullptr;
  if (uniform) {
    q["kv_cache_quant_algo"] = algo_name(f[0]);
  } else {
    q["kv_cache_quant_algo"] = "MIXED_PRECISION";
    nlohmann::json layers = nlohmann::json::object();
    for (size_t l = 0; l < f.size(); ++l)
      layers["model.layers." + std::to_string(l) + ".self_attn"] = {{"quant_algo", algo_name(f[l])}};
    q["kv_cache_quantized_layers"] = layers;
    q["kv_cache_schema_version"] = 1;
  }
  return {{"producer", {{"name", "kvq"}, {"version", KVQ_VERSION}}}, {"quantization", q}};
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

}  // namespace kvq::exporter
