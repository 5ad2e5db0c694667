#include "kvq/io/probe_file.hpp"

#include <cmath>
#include <fstream>
#include <sstream>

#include "kvq/util/error.hpp"

namespace kvq {

nlohmann::ordered_json probe_json(const ProbeFile& p) {
  nlohmann::ordered_json j;
  j["format"] = kProbeFormat;
  j["version"] = kProbeVersion;
  j["producer"] = std::string("kvq ") + KVQ_VERSION;
  j["candidates"] = p.candidates;
  if (!p.alloc_path.empty()) j["alloc"] = p.alloc_path;
  j["model"] = {{"path", p.model_path}, {"config_sha256", p.model_config_sha256}, {"n_layers", p.n_layers}};
  j["calibration"] = {{"path", p.calib_path}, {"sha256", p.calib_sha256}, {"content_digest", p.calib_digest}};
  j["windows"] = p.windows;
  j["seq_len"] = p.seq_len;
  if (p.forward_precision != "fp32") j["forward_precision"] = p.forward_precision;
  j["positions"] = p.positions;
  j["clean_nll"] = p.clean_nll;
  j["cost"] = {{"layer_forwards", p.layer_forwards}, {"seconds", p.seconds}};
  nlohmann::ordered_json s = nlohmann::ordered_json::array();
  for (const auto& x : p.settings)
    s.push_back({{"name", x.name}, {"key_bits", x.key_bits}, {"value_bits", x.value_bits}, {"kl", x.kl}, {"dnll", x.dnll}});
  j["settings"] = s;
  if (p.has_composite) {
    double sum = 0;
    for (double v : p.settings.at(0).kl) sum += v;
    j["composite"] = {{"kl", p.composite_kl},
                      {"dnll", p.composite_dnll},
                      {"sum_of_layers_kl", sum},
                      {"additivity_ratio", sum > 0 ? p.composite_kl / sum : 0.0}};
  }
  return j;
}

namespace {

const nlohmann::json& at(const std::string& path, const nlohmann::json& j, const std::string& where, const char* key) {
  if (!j.is_object() || !j.contains(key)) throw Error(path, where.empty() ? key : where + "." + key, "missing");
  return j.at(key);
}

std::string str(const std::string& path, const nlohmann::json& j, const std::string& where, const char* key) {
  const auto& v = at(path, j, where, key);
  if (!v.is_string()) throw Error(path, where.empty() ? key : where + "." + key, "not a string: " + v.dump());
  return v.get<std::string>();
}

int64_t integer(const std::string& path, const nlohmann::json& j, const std::string& where, const char* key, int64_t lo) {
  const auto& v = at(path, j, where, key);
  if (!v.is_number_integer() || v.get<int64_t>() < lo)
    throw Error(path, where.empty() ? key : where + "." + key, "not an integer >= " + std::to_string(lo) + ": " + v.dump());
  return v.get<int64_t>();
}

double number(const std::string& path, const nlohmann::json& j, const std::string& where, const char* key) {
  const auto& v = at(path, j, where, key);
  if (!v.is_number() || !std::isfinite(v.get<double>()))
    throw Error(path, where.empty() ? key : where + "." + key, "not a finite number: " + v.dump());
  return v.get<double>();
}

std::vector<double> per_layer(const std::string& path, const nlohmann::json& j, const std::string& where, const char* key,
                              int n_layers, bool non_negative) {
  const auto& v = at(path, j, where, key);
  const std::string field = where + "." + key;
  if (!v.is_array() || int(v.size()) != n_layers)
    throw Error(path, field, "expected " + std::to_string(n_layers) + " per-layer numbers, got " +
                                 (v.is_array() ? std::to_string(v.size()) + " values" : v.dump()));
  std::vector<double> out;
  for (size_t i = 0; i < v.size(); ++i) {
    if (!v[i].is_number() || !std::isfinite(v[i].get<double>()) || (non_negative && v[i].get<double>() < 0))
      throw Error(path, field + "[" + std::to_string(i) + "]",
                  std::string(non_negative ? "not a finite number >= 0: " : "not a finite number: ") + v[i].dump());
    out.push_back(v[i].get<double>());
  }
  return out;
}

}  // namespace

ProbeFile read_probe(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw Error(path, "--probe", "cannot open");
  std::stringstream ss;
  ss << in.rdbuf();
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(ss.str());
  } catch (const std::exception&) {
    throw Error(path, "--probe", "not valid JSON");
  }
  if (!j.is_object()) throw Error(path, "--probe", "not a JSON object");
  if (str(path, j, "", "format") != kProbeFormat)
    throw Error(path, "format", "'" + j["format"].get<std::string>() + "', expected '" + kProbeFormat + "'");
  const int64_t version = integer(path, j, "", "version", 1);
  if (version != kProbeVersion)
    throw Error(path, "version", "expected " + std::to_string(kProbeVersion) + ", found " + std::to_string(version) +
                                     (version > kProbeVersion ? " (written by a newer kvq)" : ""));
  ProbeFile p;
  p.candidates = str(path, j, "", "candidates");
  if (p.candidates != "vllm-turboquant" && p.candidates != "allocation")
    throw Error(path, "candidates", "unknown value '" + p.candidates + "' (vllm-turboquant or allocation)");
  if (j.contains("alloc")) p.alloc_path = str(path, j, "", "alloc");
  const auto& m = at(path, j, "", "model");
  p.model_path = str(path, m, "model", "path");
  p.model_config_sha256 = str(path, m, "model", "config_sha256");
  p.n_layers = int(integer(path, m, "model", "n_layers", 1));
  const auto& c = at(path, j, "", "calibration");
  p.calib_path = str(path, c, "calibration", "path");
  p.calib_sha256 = str(path, c, "calibration", "sha256");
  p.calib_digest = str(path, c, "calibration", "content_digest");
  p.windows = int(integer(path, j, "", "windows", 1));
  p.seq_len = int(integer(path, j, "", "seq_len", 2));
  if (j.contains("forward_precision")) {
    p.forward_precision = str(path, j, "", "forward_precision");
    if (p.forward_precision != "fp32" && p.forward_precision != "bf16")
      throw Error(path, "forward_precision", "'" + p.forward_precision + "' is neither fp32 nor bf16");
  }
  p.positions = integer(path, j, "", "positions", 1);
  p.clean_nll = number(path, j, "", "clean_nll");
  const auto& cost = at(path, j, "", "cost");
  p.layer_forwards = integer(path, cost, "cost", "layer_forwards", 0);
  p.seconds = number(path, cost, "cost", "seconds");
  const auto& s = at(path, j, "", "settings");
  if (!s.is_array() || s.empty()) throw Error(path, "settings", "expected a non-empty array");
  for (size_t i = 0; i < s.size(); ++i) {
    const std::string w = "settings[" + std::to_string(i) + "]";
    ProbeSetting x;
    x.name = str(path, s[i], w, "name");
    x.key_bits = int(integer(path, s[i], w, "key_bits", 0));
    x.value_bits = int(integer(path, s[i], w, "value_bits", 0));
    x.kl = per_layer(path, s[i], w, "kl", p.n_layers, true);
    x.dnll = per_layer(path, s[i], w, "dnll", p.n_layers, false);
    for (const auto& e : p.settings)
      if (e.name == x.name) throw Error(path, w + ".name", "'" + x.name + "' appears twice");
    p.settings.push_back(std::move(x));
  }
  if (j.contains("composite")) {
    p.has_composite = true;
    p.composite_kl = number(path, j["composite"], "composite", "kl");
    p.composite_dnll = number(path, j["composite"], "composite", "dnll");
    if (p.composite_kl < 0) throw Error(path, "composite.kl", "negative: " + std::to_string(p.composite_kl));
  }
  return p;
}

}  // namespace kvq
