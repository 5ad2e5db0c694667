#include "kvq/export/vllm.hpp"

#include <algorithm>
#include <cmath>
#include <limits>

#include "kvq/codec/minifloat.hpp"
#include "kvq/export/model_dir.hpp"
#include "kvq/io/h5_paths.hpp"
#include "kvq/util/atomic_file.hpp"
#include "kvq/util/error.hpp"
#include "out_dir.hpp"

namespace kvq::exporter {

const char* to_string(ScaleStrategy s) { return s == ScaleStrategy::kTensor ? "tensor" : "attn_head"; }

float VllmScales::kv_layer_scale(int layer) const {
  const int per = k_per_layer();
  float m = 0.f;
  for (int h = 0; h < per; ++h) m = std::max({m, k[size_t(layer) * per + h], v[size_t(layer) * per + h]});
  return m;
}

namespace {

std::string num(double x) { return nlohmann::json(x).dump(); }

// amax [L][heads] -> scales [L][heads] or [L][1] (max over the layer's heads).
std::vector<float> side_scales(const std::vector<float>& amax, int n_layers, int heads, ScaleStrategy s, double margin,
                               const std::string& path, const char* dataset, const char* head_word) {
  if (amax.size() != size_t(n_layers) * size_t(heads))
    throw Error(path, dataset,
                std::to_string(amax.size()) + " maxima, expected " + std::to_string(n_layers) + " x " +
                    std::to_string(heads));
  for (int l = 0; l < n_layers; ++l)
    for (int h = 0; h < heads; ++h) {
      const float a = amax[size_t(l) * heads + h];
      if (!(a > 0.f) || !std::isfinite(a))
        throw Error(path, dataset,
                    "layer " + std::to_string(l) + " " + head_word + " " + std::to_string(h) + ": amax " +
                        num(double(a)) +
                        (a == 0.f ? " (the head never fired on the calibration tokens)" : " (not a finite maximum)") +
                        ", so no FP8 scale can be derived for it; recapture over more or other text");
    }
  const int per = s == ScaleStrategy::kTensor ? 1 : heads;
  std::vector<float> out(size_t(n_layers) * per);
  for (int l = 0; l < n_layers; ++l)
    for (int j = 0; j < per; ++j) {
      float a = amax[size_t(l) * heads + j];
      if (s == ScaleStrategy::kTensor)
        a = *std::max_element(amax.begin() + ptrdiff_t(l) * heads, amax.begin() + ptrdiff_t(l + 1) * heads);
      // In double, then one rounding to the fp32 the engines store.
      const double scale = double(a) * margin / double(codec::kE4M3Max);
      const float f = float(scale);
      if (!(f > 0.f) || !std::isfinite(f))
        throw Error(path, dataset,
                    "layer " + std::to_string(l) + ": scale amax " + num(double(a)) + " * margin " + num(margin) +
                        " / 448 = " + num(scale) + " is not a finite fp32 > 0");
      out[size_t(l) * per + j] = f;
    }
  return out;
}

std::string layer_name(int l, const char* what) {
  return "model.layers." + std::to_string(l) + ".self_attn." + what;
}

}  // namespace

VllmScales vllm_scales(const CalibFile& c, const std::string& calib_path, const VllmOptions& o) {
  if (!(o.margin > 0.0) || !std::isfinite(o.margin))
    throw Error("", "--margin", num(o.margin) + " is not a finite number > 0");
  if (o.tp < 0) throw Error("", "--tp", std::to_string(o.tp) + " is not > 0");
  const Moments& m = c.moments;
  if (!m.has_amax())
    throw Error(calib_path, h5path::kStatsAmaxK,
                "the calibration file lacks activation maxima (max |x| per head, recorded from calibration format "
                "version 3 on); recapture it with this version of calib-capture");
  VllmScales s;
  s.strategy = o.strategy;
  s.n_layers = c.prov.n_layers;
  s.n_heads = c.prov.n_heads;
  s.n_kv_heads = c.prov.n_kv_heads;
  s.decoder_layers = c.prov.decoder_layers;
  if (s.n_layers <= 0 || s.n_heads <= 0 || s.n_kv_heads <= 0)
    throw Error(calib_path, h5path::kProvenance, "n_layers, n_heads and n_kv_heads must be > 0");
  s.k = side_scales(m.k_amax, s.n_layers, s.n_kv_heads, o.strategy, o.margin, calib_path, h5path::kStatsAmaxK, "KV head");
  s.v = side_scales(m.v_amax, s.n_layers, s.n_kv_heads, o.strategy, o.margin, calib_path, h5path::kStatsAmaxV, "KV head");
  s.q = side_scales(m.q_amax, s.n_layers, s.n_heads, o.strategy, o.margin, calib_path, h5path::kStatsAmaxQ, "query head");
  return s;
}

std::vector<StTensor> vllm_tensors(const VllmScales& s) {
  std::vector<StTensor> t;
  const int kp = s.k_per_layer(), qp = s.q_per_layer();
  auto slice = [](const std::vector<float>& x, int l, int per) {
    return std::vector<float>(x.begin() + ptrdiff_t(l) * per, x.begin() + ptrdiff_t(l + 1) * per);
  };
  for (int l = 0; l < s.n_layers; ++l) {
    // Named by the decoder layer (a hybrid model's KV layers are some of them).
    const int dl = s.name_of(l);
    t.push_back(f32_tensor(layer_name(dl, "k_scale"), {kp}, slice(s.k, l, kp)));
    t.push_back(f32_tensor(layer_name(dl, "v_scale"), {kp}, slice(s.v, l, kp)));
    t.push_back(f32_tensor(layer_name(dl, "q_scale"), {qp}, slice(s.q, l, qp)));
  }
  return t;
}

nlohmann::json vllm_kv_cache_scheme(ScaleStrategy s) {
  return {{"kv_cache_scheme",
           {{"num_bits", 8}, {"type", "float"}, {"strategy", to_string(s)}, {"dynamic", false}, {"symmetric", true}}}};
}

nlohmann::json vllm_legacy_scales(const VllmScales& s, const std::string& model_type, int tp) {
  KVQ_ASSERT(tp > 0);
  nlohmann::json layers = nlohmann::json::object();
  // double(float) is exact: the number in the file reads back as the same fp32.
  for (int l = 0; l < s.n_layers; ++l) layers[std::to_string(s.name_of(l))] = double(s.kv_layer_scale(l));
  nlohmann::json ranks = nlohmann::json::object();
  for (int r = 0; r < tp; ++r) ranks[std::to_string(r)] = layers;
  nlohmann::json j;
  j["model_type"] = model_type.empty() ? nlohmann::json(nullptr) : nlohmann::json(model_type);
  j["kv_cache"] = {{"dtype", "float8_e4m3fn"}, {"scaling_factor", ranks}};
  return j;
}

std::vector<std::string> export_vllm(const std::string& calib_path, const std::string& out_dir, const VllmOptions& o) {
  detail::check_out_dir(out_dir);
  const CalibFile c = read_calib(calib_path, /*samples=*/false);
  const VllmScales s = vllm_scales(c, calib_path, o);
  const std::map<std::string, std::string> meta = {{"format", "pt"},
                                                   {"producer", std::string("kvq ") + KVQ_VERSION},
                                                   {"kvq_strategy", to_string(o.strategy)},
                                                   {"kvq_margin", num(o.margin)}};
  const std::string st = safetensors_bytes(vllm_tensors(s), meta);
  const std::string scheme = vllm_kv_cache_scheme(o.strategy).dump(2) + "\n";
  const std::string legacy = o.tp > 0 ? vllm_legacy_scales(s, c.prov.architecture, o.tp).dump(2) + "\n" : "";

  detail::make_out_dir(out_dir);
  std::vector<std::string> written;
  auto put = [&](const std::string& name, const std::string& bytes) {
    const std::string p = out_dir + "/" + name;
    write_file_atomically(p, bytes);
    written.push_back(p);
  };
  put("kv_scales.safetensors", st);
  put("kv_cache_scheme.json", scheme);
  if (o.tp > 0) put("kv_cache_scales.json", legacy);
  return written;
}

void check_same_model(const HfModelDir& m, const std::string& recorded_sha, int recorded_layers, const std::string& file,
                      const std::string& field) {
  if (recorded_sha != m.config_sha256)
    throw Error(file, field,
                "made from another model: config sha256 " + recorded_sha.substr(0, 12) + "..., but " + m.dir +
                    "/config.json is " + m.config_sha256.substr(0, 12) + "... (give the model it was calibrated on)");
  if (recorded_layers != m.n_layers)
    throw Error(file, field, std::to_string(recorded_layers) + " layers, the model has " + std::to_string(m.n_layers));
}

nlohmann::ordered_json vllm_merged_config(const HfModelDir& m, ScaleStrategy s) {
  const std::string where = m.dir + "/config.json";
  nlohmann::ordered_json cfg = m.config;
  const nlohmann::ordered_json scheme = nlohmann::ordered_json::parse(vllm_kv_cache_scheme(s)["kv_cache_scheme"].dump());
  if (!cfg.contains("quantization_config")) {
    // compressed-tensors is the quant_method vLLM reads kv_cache_scheme from; no weight groups.
    nlohmann::ordered_json q = nlohmann::ordered_json::object();
    q["quant_method"] = "compressed-tensors";
    q["config_groups"] = nlohmann::ordered_json::object();
    q["ignore"] = nlohmann::ordered_json::array();
    q["kv_cache_scheme"] = scheme;
    cfg["quantization_config"] = q;
    return cfg;
  }
  auto& q = cfg["quantization_config"];
  if (!q.is_object()) throw Error(where, "quantization_config", "not an object: " + q.dump());
  if (q.contains("kv_cache_scheme") && !q["kv_cache_scheme"].is_null() && q["kv_cache_scheme"] != scheme)
    throw Error(where, "quantization_config.kv_cache_scheme",
                q["kv_cache_scheme"].dump() + " is a different KV-cache scheme than kvq's " + scheme.dump() +
                    ": export from a checkpoint without one");
  for (const char* other : {"kv_cache_quant_algo", "kv_cache_quant_method"})
    if (q.contains(other) && !q[other].is_null())
      throw Error(where, std::string("quantization_config.") + other,
                  q[other].dump() + ": the model already has another KV-cache scheme; export from a checkpoint without one");
  q["kv_cache_scheme"] = scheme;
  return cfg;
}

std::vector<std::string> export_vllm_model(const std::string& model_dir, const std::string& calib_path,
                                           const std::string& out_dir, const VllmOptions& o, bool copy) {
  check_model_out_dir(out_dir);
  const HfModelDir m = read_hf_model_dir(model_dir);
  ModelDirOutput out;
  out.config = vllm_merged_config(m, o.strategy);
  const CalibFile c = read_calib(calib_path, /*samples=*/false);
  check_same_model(m, c.prov.model_config_sha256, c.prov.decoder_layer_count(), calib_path, "provenance.model_config_sha256");
  const VllmScales s = vllm_scales(c, calib_path, o);
  out.scales = vllm_tensors(s);
  out.scales_metadata = {{"format", "pt"},
                         {"producer", std::string("kvq ") + KVQ_VERSION},
                         {"kvq_strategy", to_string(o.strategy)},
                         {"kvq_margin", num(o.margin)}};
  if (o.tp > 0) {
    const std::string model_type = m.config.contains("model_type") && m.config["model_type"].is_string()
                                       ? m.config["model_type"].get<std::string>()
                                       : c.prov.architecture;
    out.extra.emplace_back("kv_cache_scales.json", vllm_legacy_scales(s, model_type, o.tp).dump(2) + "\n");
  }
  return write_model_dir(m, out_dir, copy, out);
}

}  // namespace kvq::exporter
