#pragma once
// Reading an HF config.json: the typed reader every family's config parser uses (the file and key in
// every error), RoPE scaling, the per-layer sliding windows, and the fields of the common decoder
// layout (Llama's keys) most families start from. Internal to kvq_model.
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "kvq/model/config.hpp"
#include "kvq/util/error.hpp"

namespace kvq::detail {

using nlohmann::json;

// Reads config.json values with the file and key in every error.
class ConfigReader {
 public:
  // prefix: what errors put before a key (a nested object's path, "text_config.").
  ConfigReader(const json& j, std::string path, std::string prefix = "")
      : j_(j), path_(std::move(path)), prefix_(std::move(prefix)) {}

  bool has(const char* key) const { return j_.contains(key) && !j_[key].is_null(); }

  int positive_int(const char* key) const {
    if (!has(key)) throw Error(path_, prefix_ + key, "missing");
    const json& v = j_[key];
    if (!v.is_number_integer() || v.get<int64_t>() <= 0 || v.get<int64_t>() > (1 << 30))
      throw Error(path_, prefix_ + key, "expected a positive integer, found " + v.dump());
    return static_cast<int>(v.get<int64_t>());
  }
  int positive_int(const char* key, int def) const { return has(key) ? positive_int(key) : def; }

  double positive_number(const char* key) const {
    if (!has(key)) throw Error(path_, prefix_ + key, "missing");
    const json& v = j_[key];
    if (!v.is_number() || !(v.get<double>() > 0))
      throw Error(path_, prefix_ + key, "expected a positive number, found " + v.dump());
    return v.get<double>();
  }
  double positive_number(const char* key, double def) const {
    return has(key) ? positive_number(key) : def;
  }

  bool boolean(const char* key, bool def) const {
    if (!has(key)) return def;
    if (!j_[key].is_boolean()) throw Error(path_, prefix_ + key, "expected true or false, found " + j_[key].dump());
    return j_[key].get<bool>();
  }

  // Token ids may be an integer, a list (first entry is used) or null (none: -1).
  int token_id(const char* key, int def) const {
    if (!j_.contains(key)) return def;
    const json& v = j_[key];
    if (v.is_null()) return -1;
    const json& x = v.is_array() && !v.empty() ? v[0] : v;
    if (!x.is_number_integer() || x.get<int64_t>() < 0)
      throw Error(path_, prefix_ + key, "expected a token id, found " + v.dump());
    return static_cast<int>(x.get<int64_t>());
  }

  std::string string(const char* key) const {
    if (!has(key)) return "";
    if (!j_[key].is_string()) throw Error(path_, prefix_ + key, "expected a string, found " + j_[key].dump());
    return j_[key].get<std::string>();
  }

  const json& raw(const char* key) const { return j_[key]; }
  const json& json_object() const { return j_; }
  const std::string& path() const { return path_; }
  const std::string& prefix() const { return prefix_; }

  // A list of layer indices in [0, n_layers) (absent: empty).
  std::vector<int> layer_list(const char* key, int n_layers) const;

 private:
  const json& j_;
  std::string path_;
  std::string prefix_;
};

// `rope_scaling` (transformers <= 4) or `rope_parameters` (transformers 5, which may carry
// rope_theta itself) into c->rope_scaling; needs c->max_seq_len and c->rope_theta set.
void parse_rope_scaling(const json& j, const std::string& path, ModelConfig* c, const std::string& prefix = "");

// The common decoder layout's keys (hidden_size, num_hidden_layers, num_attention_heads,
// num_key_value_heads, head_dim, intermediate_size, vocab_size, max_position_embeddings,
// rope_theta, rms_norm_eps, tie_word_embeddings, bos/eos ids, partial_rotary_factor, hidden_act,
// rope_scaling, mlp_bias), with the family's RoPE pairing and default partial rotary factor.
void read_decoder_config(const ConfigReader& r, RopePairing pairing, double default_rotary_factor, ModelConfig* c);

// config.json's `layer_types` ([n_layers] of "sliding_attention" / "full_attention") as 1 = sliding;
// absent: default_sliding(l). A list of the wrong length or an unknown type names the key.
std::vector<uint8_t> read_sliding_layers(const ConfigReader& r, int n_layers, const std::function<bool(int)>& default_sliding);

// W > 0 on the layers marked in `sliding` (c->sliding_window = W); W == 0: full attention everywhere.
void set_layer_windows(int window, const std::vector<uint8_t>& sliding, ModelConfig* c);

}  // namespace kvq::detail
