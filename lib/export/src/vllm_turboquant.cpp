#include "kvq/export/vllm_turboquant.hpp"

#include <algorithm>
#include <optional>

#include "kvq/codec/vllm_turboquant.hpp"
#include "kvq/format/coding_kinds.hpp"
#include "kvq/export/model_dir.hpp"
#include "kvq/export/vllm.hpp"
#include "kvq/util/atomic_file.hpp"
#include "kvq/util/error.hpp"
#include "out_dir.hpp"

namespace kvq::exporter {

VllmTqSetting vllm_tq_setting(const AllocFile& a, const std::string& alloc_path) {
  const std::string m = to_string(Method::kVllmTurboQuant);
  if (a.method != m || a.v_method != m)
    throw Error(alloc_path, "method",
                "'" + a.method + "' (K) / '" + a.v_method + "' (V): kvq-export vllm-turboquant needs a " + m +
                    " allocation (kvq-allocate --method " + m + ")");
  if (a.calib.v_dim() != a.calib.head_dim)
    throw Error(alloc_path, "calibration.head_dim_v",
                std::to_string(a.calib.v_dim()) + " differs from head_dim " + std::to_string(a.calib.head_dim) +
                    ": an MLA latent cache, which vLLM's TurboQuant does not serve");
  if (const std::string why = vllm_tq::unsupported_head_dim(a.calib.head_dim); !why.empty())
    throw Error(alloc_path, "calibration.head_dim", why);
  const int L = a.calib.n_layers;
  if (L <= 0) throw Error(alloc_path, "calibration.n_layers", std::to_string(L) + " is not > 0");
  std::vector<std::optional<int>> bits[2];
  for (auto& b : bits) b.resize(size_t(L));
  for (const HeadDecision& h : a.heads) {
    const std::string where = decision_name(h);
    if (h.layer < 0 || h.layer >= L) throw Error(alloc_path, "heads", where + ": layer outside 0.." + std::to_string(L - 1));
    if (h.kind != CodingKind::kVllmTurboQuant)
      throw Error(alloc_path, "heads", where + ": kind " + std::string(kvq::to_string(h.kind)) + ", not vllm-turboquant");
    auto& b = bits[h.side == Side::kK ? 0 : 1][size_t(h.layer)];
    if (b && *b != h.bits)
      throw Error(alloc_path, "heads", where + ": " + std::to_string(h.bits) + " bits where the layer's other heads have " +
                                           std::to_string(*b) + " (vLLM codes a layer's heads alike)");
    b = h.bits;
  }
  VllmTqSetting s;
  std::optional<std::pair<int, int>> coded;
  for (int l = 0; l < L; ++l) {
    const auto& k = bits[0][size_t(l)];
    const auto& v = bits[1][size_t(l)];
    if (!k || !v) throw Error(alloc_path, "heads", "layer " + std::to_string(l) + " has no K or no V decisions");
    if ((*k == 16) != (*v == 16))
      throw Error(alloc_path, "heads", "layer " + std::to_string(l) + ": K " + std::to_string(*k) + " bits, V " +
                                           std::to_string(*v) + ": vLLM keeps a layer's K and V together");
    if (*k == 16) {
      s.kept.push_back(l);
      continue;
    }
    if (a.calib.window_of(l) > 0)
      throw Error(alloc_path, "heads", "layer " + std::to_string(l) + " has a sliding window (" +
                                           std::to_string(a.calib.window_of(l)) + " tokens): vLLM serves it only kept");
    if (coded && *coded != std::make_pair(*k, *v))
      throw Error(alloc_path, "heads", "layer " + std::to_string(l) + ": K " + std::to_string(*k) + " / V " +
                                           std::to_string(*v) + " bits where layer(s) before have K " +
                                           std::to_string(coded->first) + " / V " + std::to_string(coded->second) +
                                           ": vLLM has one preset per model");
    coded = std::make_pair(*k, *v);
  }
  if (!coded) {  // every layer kept: the cheapest preset of the file's choice set, as recorded
    const auto& p = a.summary.contains("joint") ? a.summary["joint"]["params"] : nlohmann::json();
    s.preset = p.is_object() && p.contains("preset") ? p["preset"].get<std::string>() : "turboquant_k8v4";
    return s;
  }
  for (int p = 0; p < vllm_tq::kNumPresets; ++p) {
    const auto& in = vllm_tq::info(vllm_tq::Preset(p));
    if (in.key_bits == coded->first && in.value_bits == coded->second) s.preset = in.name;
  }
  if (s.preset.empty())
    throw Error(alloc_path, "heads", "K " + std::to_string(coded->first) + " / V " + std::to_string(coded->second) +
                                         " bits is no vLLM preset (" + vllm_tq::preset_names() + ")");
  return s;
}

std::vector<std::string> vllm_tq_serve_args(const VllmTqSetting& s) {
  std::vector<std::string> args = {"--kv-cache-dtype", s.preset};
  if (!s.kept.empty()) {
    args.push_back("--kv-cache-dtype-skip-layers");
    for (int l : s.kept) args.push_back(std::to_string(l));
  }
  return args;
}

nlohmann::ordered_json vllm_tq_json(const AllocFile& a, const std::string& alloc_path) {
  const VllmTqSetting s = vllm_tq_setting(a, alloc_path);
  nlohmann::ordered_json j;
  j["producer"] = {{"name", "kvq"}, {"version", KVQ_VERSION}};
  j["kv_cache_dtype"] = s.preset;
  nlohmann::ordered_json kept = nlohmann::ordered_json::array();
  for (int l : s.kept) kept.push_back(std::to_string(l));
  j["kv_cache_dtype_skip_layers"] = kept;
  j["vllm_serve_args"] = vllm_tq_serve_args(s);
  const nlohmann::json p = a.summary.contains("joint") ? a.summary["joint"].value("params", nlohmann::json()) : nlohmann::json();
  nlohmann::ordered_json meas;
  meas["objective"] = a.params.value("objective", std::string("attention"));
  for (const char* k : {"error", "default_error", "default_bpd"})
    if (p.is_object() && p.contains(k)) meas[k] = std::stod(p[k].get<std::string>());
  meas["bpd"] = a.k_bpd_effective;
  j["measured"] = meas;
  return j;
}

std::vector<std::string> export_vllm_turboquant(const std::string& alloc_path, const std::string& out_dir,
                                                const std::string& model_dir, bool copy, std::string* args_line) {
  const AllocFile a = read_alloc(alloc_path);
  const nlohmann::ordered_json j = vllm_tq_json(a, alloc_path);
  std::string line;
  for (const auto& arg : j["vllm_serve_args"]) line += (line.empty() ? "" : " ") + arg.get<std::string>();
  if (args_line) *args_line = line;
  if (out_dir.empty()) return {};
  const std::string text = j.dump(2) + "\n";
  if (!model_dir.empty()) {
    check_model_out_dir(out_dir);
    const HfModelDir m = read_hf_model_dir(model_dir);
    check_same_model(m, a.calib.model_config_sha256, a.calib.n_layers, alloc_path, "calibration.model_config_sha256");
    ModelDirOutput out;
    out.config = nullptr;  // the engine takes the cache from its flags: config.json linked as it is
    out.extra.emplace_back("vllm_turboquant.json", text);
    out.extra.emplace_back("vllm_serve_args.txt", line + "\n");
    return write_model_dir(m, out_dir, copy, out);
  }
  detail::check_out_dir(out_dir);
  detail::make_out_dir(out_dir);
  const std::string pj = out_dir + "/vllm_turboquant.json", pa = out_dir + "/vllm_serve_args.txt";
  write_file_atomically(pj, text);
  write_file_atomically(pa, line + "\n");
  return {pj, pa};
}

}  // namespace kvq::exporter
