#include "config_reader.hpp"

#include <cmath>
#include <string>

#include "hf_json.hpp"
#include "kvq/util/atomic_file.hpp"

namespace kvq::detail {

json parse_json_file(const std::string& path) {
  std::string text = read_file(path);
  json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) throw Error(path, "", "is not valid JSON");
  if (!j.is_object()) throw Error(path, "", "top level is not a JSON object");
  return j;
}

std::vector<int> ConfigReader::layer_list(const char* key, int n_layers) const {
  std::vector<int> v;
  if (!has(key)) return v;
  const json& x = j_[key];
  if (!x.is_array()) throw Error(path_, prefix_ + key, "expected a list of layer indices, found " + x.dump());
  for (const json& e : x) {
    if (!e.is_number_integer() || e.get<int64_t>() < 0 || e.get<int64_t>() >= n_layers)
      throw Error(path_, prefix_ + key, "expected layer indices in [0, " + std::to_string(n_layers) + "), found " + x.dump());
    v.push_back(int(e.get<int64_t>()));
  }
  return v;
}

void parse_rope_scaling(const json& j, const std::string& path, ModelConfig* c, const std::string& prefix) {
  const char* key = nullptr;
  for (const char* k : {"rope_parameters", "rope_scaling"})
    if (j.contains(k) && !j[k].is_null()) { key = k; break; }
  if (!key) return;
  const json& rs = j[key];
  const std::string where = prefix + key;
  if (!rs.is_object()) throw Error(path, where, "expected an object, found " + rs.dump());
  const ConfigReader r(rs, path);
  auto field = [&](const char* k) { return where + "." + k; };
  auto number = [&](const char* k, bool positive) {
    const json& v = rs[k];
    if (!v.is_number() || !std::isfinite(v.get<double>()) || (positive && !(v.get<double>() > 0)))
      throw Error(path, field(k), std::string("expected a ") + (positive ? "positive " : "") + "number, found " + v.dump());
    return v.get<double>();
  };
  auto required = [&](const char* k) {
    if (!r.has(k)) throw Error(path, field(k), std::string("missing (required by rope_type '") + to_string(c->rope_scaling.type) + "')");
    return number(k, true);
  };
  auto optional = [&](const char* k, double def) { return r.has(k) ? number(k, true) : def; };
  if (r.has("rope_theta")) c->rope_theta = number("rope_theta", true);

  std::string type;
  const char* type_key = r.has("rope_type") ? "rope_type" : (r.has("type") ? "type" : nullptr);
  if (type_key) {
    if (!rs[type_key].is_string()) throw Error(path, field(type_key), "expected a string, found " + rs[type_key].dump());
    type = rs[type_key].get<std::string>();
  } else if (std::string(key) == "rope_parameters") {
    type = "default";
  } else {
    throw Error(path, field("rope_type"), "missing (and no legacy 'type')");
  }
  RopeScaling& s = c->rope_scaling;
  if (type == "longrope" || type == "su")
    throw Error(path, field(type_key), "'" + type + "' (Phi-3 LongRoPE: per-dimension factor lists) is not supported");
  try {
    s.type = rope_type_from_string(type);
  } catch (const Error&) {
    throw Error(path, field(type_key ? type_key : "rope_type"),
                "unsupported '" + type + "' (supported: default, linear, dynamic, llama3, yarn)");
  }
  if (s.type == RopeType::kDefault) return;
  s.factor = required("factor");
  switch (s.type) {
    case RopeType::kLinear:
    case RopeType::kDynamic:
    case RopeType::kDefault:
      break;
    case RopeType::kLlama3: {
      s.low_freq_factor = required("low_freq_factor");
      s.high_freq_factor = required("high_freq_factor");
      const double orig = required("original_max_position_embeddings");
      if (orig != std::floor(orig) || orig > (1 << 30))
        throw Error(path, field("original_max_position_embeddings"), "expected a positive integer, found " + rs["original_max_position_embeddings"].dump());
      s.original_max_position_embeddings = int(orig);
      if (!(s.high_freq_factor > s.low_freq_factor))
        throw Error(path, field("high_freq_factor"), rs["high_freq_factor"].dump() + " is not above low_freq_factor " +
                                                         rs["low_freq_factor"].dump());
      break;
    }
    case RopeType::kYarn: {
      s.beta_fast = optional("beta_fast", 32.0);
      s.beta_slow = optional("beta_slow", 1.0);
      s.mscale = optional("mscale", 0.0);
      s.mscale_all_dim = optional("mscale_all_dim", 0.0);
      s.attention_factor = optional("attention_factor", 0.0);
      s.truncate = r.boolean("truncate", true);
      if (r.has("original_max_position_embeddings")) {
        const double orig = number("original_max_position_embeddings", true);
        if (orig != std::floor(orig) || orig > (1 << 30))
          throw Error(path, field("original_max_position_embeddings"), "expected a positive integer, found " + rs["original_max_position_embeddings"].dump());
        s.original_max_position_embeddings = int(orig);
      }
      break;
    }
  }
}

void read_decoder_config(const ConfigReader& r, RopePairing pairing, double default_rotary_factor, ModelConfig* c) {
  const json& j = r.json_object();
  const std::string& path = r.path();
  c->hidden_size = r.positive_int("hidden_size");
  c->n_layers = r.positive_int("num_hidden_layers");
  c->n_heads = r.positive_int("num_attention_heads");
  c->n_kv_heads = r.positive_int("num_key_value_heads", c->n_heads);
  if (!r.has("head_dim") && c->hidden_size % c->n_heads != 0)
    throw Error(path, r.prefix() + "hidden_size", std::to_string(c->hidden_size) + " is not divisible by num_attention_heads " +
                                         std::to_string(c->n_heads) + " (and head_dim is not given)");
  c->head_dim = r.positive_int("head_dim", c->hidden_size / c->n_heads);
  c->intermediate_size = r.positive_int("intermediate_size");
  c->vocab_size = r.positive_int("vocab_size");
  c->max_seq_len = r.positive_int("max_position_embeddings");
  c->rope_theta = r.positive_number("rope_theta", 10000.0);
  c->rms_norm_eps = r.positive_number("rms_norm_eps");
  c->tie_word_embeddings = r.boolean("tie_word_embeddings", false);
  c->bos_id = r.token_id("bos_token_id", 1);
  c->eos_id = r.token_id("eos_token_id", 2);
  c->pairing = pairing;

  if (c->n_heads % c->n_kv_heads != 0)
    throw Error(path, r.prefix() + "num_key_value_heads", std::to_string(c->n_kv_heads) +
                                                 " does not divide num_attention_heads " + std::to_string(c->n_heads));
  if (c->head_dim % 2 != 0) throw Error(path, r.prefix() + "head_dim", std::to_string(c->head_dim) + " is odd");

  // transformers 5 moves partial_rotary_factor into rope_parameters.
  const bool in_params = !r.has("partial_rotary_factor") && j.contains("rope_parameters") &&
                         j["rope_parameters"].is_object() && j["rope_parameters"].contains("partial_rotary_factor");
  const char* factor_key = in_params ? "rope_parameters.partial_rotary_factor" : "partial_rotary_factor";
  double factor = default_rotary_factor;
  if (in_params || r.has("partial_rotary_factor")) {
    const json& v = in_params ? j["rope_parameters"]["partial_rotary_factor"] : j["partial_rotary_factor"];
    if (!v.is_number() || !(v.get<double>() > 0)) throw Error(path, r.prefix() + factor_key, "expected a positive number, found " + v.dump());
    factor = v.get<double>();
  }
  if (factor > 1.0) throw Error(path, r.prefix() + factor_key, std::to_string(factor) + " is above 1");
  c->rotary_dim = static_cast<int>(c->head_dim * factor);
  if (c->rotary_dim < 2 || c->rotary_dim % 2 != 0)
    throw Error(path, r.prefix() + factor_key,
                std::to_string(factor) + " gives rotary dim " + std::to_string(c->rotary_dim) +
                    " for head_dim " + std::to_string(c->head_dim) + " (must be even and >= 2)");

  // Features that change the math and are not implemented: refuse rather than compute wrong logits.
  const std::string act = r.string("hidden_act");
  if (!act.empty() && act != "silu")
    throw Error(path, r.prefix() + "hidden_act", "'" + act + "' is not supported (silu)");
  parse_rope_scaling(j, path, c, r.prefix());
  if (r.boolean("mlp_bias", false)) throw Error(path, r.prefix() + "mlp_bias", "true is not supported");

}

std::vector<uint8_t> read_sliding_layers(const ConfigReader& r, int n_layers, const std::function<bool(int)>& default_sliding) {
  std::vector<uint8_t> sliding(size_t(n_layers), 0);
  if (!r.has("layer_types")) {
    for (int l = 0; l < n_layers; ++l) sliding[size_t(l)] = default_sliding(l);
    return sliding;
  }
  const json& lt = r.raw("layer_types");
  if (!lt.is_array() || lt.size() != size_t(n_layers))
    throw Error(r.path(), r.prefix() + "layer_types", "expected a list of " + std::to_string(n_layers) + " layer types, found " + lt.dump());
  for (size_t l = 0; l < lt.size(); ++l) {
    const std::string t = lt[l].is_string() ? lt[l].get<std::string>() : "";
    if (t != "sliding_attention" && t != "full_attention")
      throw Error(r.path(), r.prefix() + "layer_types[" + std::to_string(l) + "]",
                  "expected \"sliding_attention\" or \"full_attention\", found " + lt[l].dump());
    sliding[l] = t == "sliding_attention";
  }
  return sliding;
}

void set_layer_windows(int window, const std::vector<uint8_t>& sliding, ModelConfig* c) {
  c->sliding_window = window;
  if (window > 0) {
    c->layer_window.assign(size_t(c->n_layers), 0);
    for (int l = 0; l < c->n_layers; ++l) c->layer_window[size_t(l)] = sliding[size_t(l)] ? window : 0;
  }
}

}  // namespace kvq::detail
