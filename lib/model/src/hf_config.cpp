// HF config.json: the fields kvq reads, RoPE scaling and the per-architecture attention/MLP
// features, each validated with the file and key in every error. The weights are opened in hf.cpp.
#include <cmath>
#include <string>

#include "hf_json.hpp"
#include "kvq/util/atomic_file.hpp"
#include "kvq/util/error.hpp"
#include "weights.hpp"

using nlohmann::json;

namespace kvq::detail {

json parse_json_file(const std::string& path) {
  std::string text = read_file(path);
  json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) throw Error(path, "", "is not valid JSON");
  if (!j.is_object()) throw Error(path, "", "top level is not a JSON object");
  return j;
}

namespace {


// Reads config values with the file and key in every error.
class ConfigReader {
 public:
  ConfigReader(const json& j, std::string path) : j_(j), path_(std::move(path)) {}

  bool has(const char* key) const { return j_.contains(key) && !j_[key].is_null(); }

  int positive_int(const char* key) const {
    if (!has(key)) throw Error(path_, key, "missing");
    const json& v = j_[key];
    if (!v.is_number_integer() || v.get<int64_t>() <= 0 || v.get<int64_t>() > (1 << 30))
      throw Error(path_, key, "expected a positive integer, found " + v.dump());
    return static_cast<int>(v.get<int64_t>());
  }
  int positive_int(const char* key, int def) const { return has(key) ? positive_int(key) : def; }

  double positive_number(const char* key) const {
    if (!has(key)) throw Error(path_, key, "missing");
    const json& v = j_[key];
    if (!v.is_number() || !(v.get<double>() > 0))
      throw Error(path_, key, "expected a positive number, found " + v.dump());
    return v.get<double>();
  }
  double positive_number(const char* key, double def) const {
    return has(key) ? positive_number(key) : def;
  }

  bool boolean(const char* key, bool def) const {
    if (!has(key)) return def;
    if (!j_[key].is_boolean()) throw Error(path_, key, "expected true or false, found " + j_[key].dump());
    return j_[key].get<bool>();
  }

  // Token ids may be an integer, a list (first entry is used) or null (none: -1).
  int token_id(const char* key, int def) const {
    if (!j_.contains(key)) return def;
    const json& v = j_[key];
    if (v.is_null()) return -1;
    const json& x = v.is_array() && !v.empty() ? v[0] : v;
    if (!x.is_number_integer() || x.get<int64_t>() < 0)
      throw Error(path_, key, "expected a token id, found " + v.dump());
    return static_cast<int>(x.get<int64_t>());
  }

  std::string string(const char* key) const {
    if (!has(key)) return "";
    if (!j_[key].is_string()) throw Error(path_, key, "expected a string, found " + j_[key].dump());
    return j_[key].get<std::string>();
  }

  const json& raw(const char* key) const { return j_[key]; }

 private:
  const json& j_;
  std::string path_;
};

// model_type (or, without it, the first architectures class) -> the architecture kvq computes, or a
// one-line refusal that says why for the families whose math differs.
std::string architecture_of(const ConfigReader& r, const json& j, const std::string& path) {
  static const std::map<std::string, std::string> by_class = {
      {"LlamaForCausalLM", "llama"},     {"MistralForCausalLM", "mistral"},
      {"Qwen2ForCausalLM", "qwen2"},     {"Qwen3ForCausalLM", "qwen3"},
      {"Qwen3MoeForCausalLM", "qwen3_moe"}, {"MixtralForCausalLM", "mixtral"},
      {"GlmForCausalLM", "glm"},         {"Glm4ForCausalLM", "glm4"},
      {"ChatGLMModel", "chatglm"},       {"ChatGLMForConditionalGeneration", "chatglm"},
      {"DeepseekV2ForCausalLM", "deepseek_v2"}};
  static const std::map<std::string, std::string> refused = {
      {"deepseek_v3", "DeepSeek-V3's sigmoid router with a correction bias (noaux_tc) and FP8 weights are not implemented"},
      {"gemma", "(1 + w) RMSNorm, GeGLU MLP and scaled embeddings are not implemented"},
      {"gemma2", "(1 + w) RMSNorm, GeGLU MLP and logit softcapping are not implemented"},
      {"gemma3", "(1 + w) RMSNorm, GeGLU MLP, q/k norm and local/global RoPE are not implemented"},
      {"gemma3_text", "(1 + w) RMSNorm, GeGLU MLP, q/k norm and local/global RoPE are not implemented"},
      {"phi3", "LongRoPE scaling and the fused qkv_proj / gate_up_proj layout are not implemented"},
      {"qwen2_moe", "shared experts with a sigmoid shared-expert gate are not implemented"}};
  static const std::map<std::string, std::string> refused_class = {
      {"DeepseekV3ForCausalLM", "deepseek_v3"},
      {"GemmaForCausalLM", "gemma"},
      {"Gemma2ForCausalLM", "gemma2"}, {"Gemma3ForCausalLM", "gemma3_text"},
      {"Gemma3ForConditionalGeneration", "gemma3"}, {"Phi3ForCausalLM", "phi3"},
      {"Qwen2MoeForCausalLM", "qwen2_moe"}};
  const std::string supported = " (supported: llama, mistral, qwen2, qwen3, qwen3_moe, mixtral, chatglm, glm, glm4, deepseek_v2)";
  auto refuse = [&](const char* field, const std::string& name, const std::string& mt) {
    auto why = refused.find(mt);
    if (why != refused.end())
      throw Error(path, field, "'" + name + "' is not supported: " + why->second + supported);
    throw Error(path, field, "unsupported architecture '" + name + "'" + supported);
  };
  std::string mt = r.string("model_type");
  if (!mt.empty()) {
    for (const auto& kv : by_class)
      if (kv.second == mt) return mt;
    refuse("model_type", mt, mt);
  }
  if (r.has("architectures")) {
    const json& a = j["architectures"];
    if (a.is_array() && !a.empty() && a[0].is_string()) {
      const std::string cls = a[0].get<std::string>();
      auto it = by_class.find(cls);
      if (it != by_class.end()) return it->second;
      auto rc = refused_class.find(cls);
      refuse("architectures", cls, rc == refused_class.end() ? "" : rc->second);
    }
    throw Error(path, "architectures", "expected a list of class names, found " + a.dump());
  }
  throw Error(path, "model_type", "missing (and no architectures list)");
}

// `rope_scaling` (transformers <= 4) or `rope_parameters` (transformers 5, which may carry
// rope_theta itself) into c->rope_scaling; needs c->max_seq_len and c->rope_theta set.
void parse_rope_scaling(const json& j, const std::string& path, ModelConfig* c) {
  const char* key = nullptr;
  for (const char* k : {"rope_parameters", "rope_scaling"})
    if (j.contains(k) && !j[k].is_null()) { key = k; break; }
  if (!key) return;
  const json& rs = j[key];
  const std::string where = std::string(key);
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

// Per-architecture attention and MLP features, with transformers' defaults for absent keys.
void parse_architecture_features(const ConfigReader& r, const json& j, const std::string& path, ModelConfig* c) {
  const std::string& a = c->architecture;
  auto int_list = [&](const char* key) {
    std::vector<int> v;
    if (!r.has(key)) return v;
    const json& x = j[key];
    if (!x.is_array()) throw Error(path, key, "expected a list of layer indices, found " + x.dump());
    for (const json& e : x) {
      if (!e.is_number_integer() || e.get<int64_t>() < 0 || e.get<int64_t>() >= c->n_layers)
        throw Error(path, key, "expected layer indices in [0, " + std::to_string(c->n_layers) + "), found " + x.dump());
      v.push_back(int(e.get<int64_t>()));
    }
    return v;
  };
  if (a == "llama") {
    c->qkv_bias = c->o_bias = r.boolean("attention_bias", false);
  } else if (a == "qwen2") {
    c->qkv_bias = true;
  } else if (a == "qwen3" || a == "qwen3_moe") {
    c->qk_norm = true;
    c->qkv_bias = c->o_bias = r.boolean("attention_bias", false);
  } else if (a == "glm" || a == "glm4") {
    // GlmConfig / Glm4Config: attention_bias (default true) is on q, k, v only; o_proj has none.
    c->qkv_bias = r.boolean("attention_bias", true);
    c->sandwich_norm = a == "glm4";
  }

  // Sliding window. Mistral/Mixtral: every layer when `sliding_window` is non-null (MistralConfig
  // defaults it to 4096, MixtralConfig to null). Qwen2/Qwen3: only with use_sliding_window, then in
  // the layers `layer_types` marks "sliding_attention", or else layers >= max_window_layers
  // (default 28); Qwen3-MoE has no max_window_layers: every layer.
  int window = 0;
  std::vector<uint8_t> sliding(size_t(c->n_layers), 0);
  if (a == "mistral" || a == "mixtral") {
    const bool present = j.contains("sliding_window");
    if (present ? !j["sliding_window"].is_null() : a == "mistral") window = r.positive_int("sliding_window", 4096);
    std::fill(sliding.begin(), sliding.end(), uint8_t(1));
  } else if ((a == "qwen2" || a == "qwen3" || a == "qwen3_moe") && r.boolean("use_sliding_window", false)) {
    window = r.positive_int("sliding_window", 4096);
    if (r.has("layer_types")) {
      const json& lt = j["layer_types"];
      if (!lt.is_array() || lt.size() != size_t(c->n_layers))
        throw Error(path, "layer_types", "expected a list of " + std::to_string(c->n_layers) + " layer types, found " + lt.dump());
      for (size_t l = 0; l < lt.size(); ++l) {
        const std::string t = lt[l].is_string() ? lt[l].get<std::string>() : "";
        if (t != "sliding_attention" && t != "full_attention")
          throw Error(path, "layer_types[" + std::to_string(l) + "]", "expected \"sliding_attention\" or \"full_attention\", found " + lt[l].dump());
        sliding[l] = t == "sliding_attention";
      }
    } else {
      const int first = a == "qwen3_moe" ? 0 : r.positive_int("max_window_layers", 28);
      for (int l = first; l < c->n_layers; ++l) sliding[size_t(l)] = 1;
    }
  }
  c->sliding_window = window;
  if (window > 0) {
    c->layer_window.assign(size_t(c->n_layers), 0);
    for (int l = 0; l < c->n_layers; ++l) c->layer_window[size_t(l)] = sliding[size_t(l)] ? window : 0;
  }

  // Mixture of experts.
  if (a == "qwen3_moe" || a == "mixtral") {
    const bool qm = a == "qwen3_moe";
    const char* n_key = qm ? "num_experts" : "num_local_experts";
    c->n_experts = r.positive_int(n_key, qm ? 128 : 8);
    c->n_experts_per_tok = r.positive_int("num_experts_per_tok", qm ? 8 : 2);
    if (c->n_experts_per_tok > c->n_experts)
      throw Error(path, "num_experts_per_tok", std::to_string(c->n_experts_per_tok) + " is above " + n_key + " " +
                                                   std::to_string(c->n_experts));
    c->moe_intermediate_size = qm ? r.positive_int("moe_intermediate_size", 768) : c->intermediate_size;
    c->norm_topk_prob = qm ? r.boolean("norm_topk_prob", false) : true;
    c->layer_moe.assign(size_t(c->n_layers), 1);
    if (qm) {
      const int step = r.positive_int("decoder_sparse_step", 1);
      for (int l = 0; l < c->n_layers; ++l)
        if ((l + 1) % step != 0) c->layer_moe[size_t(l)] = 0;
      for (int l : int_list("mlp_only_layers")) c->layer_moe[size_t(l)] = 0;
    }
  }
}


// ChatGLM's own config.json (THUDM/glm-4-9b, glm-4-9b-chat; modeling_chatglm.py): Megatron-style
// keys, RoPE base 10000 · rope_ratio over the first kv_channels / 2 dims in adjacent pairs. The
// variants of ChatGLM's code that change the math (LayerNorm, post-layernorm residual, biased
// linears, the pre-GLM-4 RoPE) are refused by name.
void parse_chatglm_config(const ConfigReader& r, const std::string& path, ModelConfig* c) {
  c->hidden_size = r.positive_int("hidden_size");
  c->n_layers = r.positive_int("num_layers");
  c->n_heads = r.positive_int("num_attention_heads");
  c->n_kv_heads = r.boolean("multi_query_attention", false) ? r.positive_int("multi_query_group_num") : c->n_heads;
  if (!r.has("kv_channels"))
    throw Error(path, "kv_channels", "missing (chatglm: the head dim, whose first half rotates)");
  c->head_dim = r.positive_int("kv_channels");
  if (c->head_dim % 4 != 0)
    throw Error(path, "kv_channels", std::to_string(c->head_dim) + " is not a multiple of 4 (rotary dim kv_channels / 2 must be even)");
  c->intermediate_size = r.positive_int("ffn_hidden_size");
  c->vocab_size = r.positive_int("padded_vocab_size");
  c->max_seq_len = r.positive_int("seq_length");
  c->rms_norm_eps = r.positive_number("layernorm_epsilon", 1e-5);
  c->qkv_bias = r.boolean("add_qkv_bias", false);
  c->rope_theta = 10000.0 * r.positive_number("rope_ratio", 1.0);
  c->rotary_dim = c->head_dim / 2;
  c->pairing = RopePairing::kInterleaved;
  c->tie_word_embeddings = r.boolean("tie_word_embeddings", false);
  c->bos_id = r.token_id("bos_token_id", -1);
  c->eos_id = r.token_id("eos_token_id", -1);
  if (c->n_heads % c->n_kv_heads != 0)
    throw Error(path, "multi_query_group_num", std::to_string(c->n_kv_heads) + " does not divide num_attention_heads " +
                                                   std::to_string(c->n_heads));
  if (!r.boolean("rmsnorm", true)) throw Error(path, "rmsnorm", "false (LayerNorm) is not supported");
  if (r.boolean("apply_residual_connection_post_layernorm", false))
    throw Error(path, "apply_residual_connection_post_layernorm", "true is not supported");
  if (!r.boolean("post_layer_norm", true)) throw Error(path, "post_layer_norm", "false (no final norm) is not supported");
  if (r.boolean("add_bias_linear", false)) throw Error(path, "add_bias_linear", "true (dense and MLP biases) is not supported");
  if (!r.boolean("original_rope", true)) throw Error(path, "original_rope", "false is not supported");
  if (r.has("rope_scaling")) throw Error(path, "rope_scaling", "is not supported for chatglm (rope_ratio scales the base)");
}

// YaRN's magnitude correction 0.1 m ln s + 1 (1 at s <= 1), as DeepSeek's yarn_get_mscale.
double deepseek_mscale(double s, double m) { return s <= 1.0 ? 1.0 : 0.1 * m * std::log(s) + 1.0; }

// DeepSeek-V2 / V2-Lite (DeepseekV2ForCausalLM, the official modeling_deepseek.py): MLA in its
// served (absorbed) form, DeepSeek's YaRN, DeepSeekMoE. See ModelConfig for the served cache.
void parse_deepseek_config(const ConfigReader& r, const json& j, const std::string& path, ModelConfig* c) {
  c->hidden_size = r.positive_int("hidden_size");
  c->n_layers = r.positive_int("num_hidden_layers");
  c->n_heads = r.positive_int("num_attention_heads");
  c->n_kv_heads = 1;  // the served cache: one latent row per token, shared by every query head
  c->q_lora_rank = r.has("q_lora_rank") ? r.positive_int("q_lora_rank") : 0;
  c->kv_lora_rank = r.positive_int("kv_lora_rank");
  c->qk_nope_head_dim = r.positive_int("qk_nope_head_dim");
  c->qk_rope_head_dim = r.positive_int("qk_rope_head_dim");
  c->v_head_dim = r.positive_int("v_head_dim");
  if (c->qk_rope_head_dim % 2 != 0)
    throw Error(path, "qk_rope_head_dim", std::to_string(c->qk_rope_head_dim) + " is odd");
  c->head_dim = c->qk_rope_head_dim + c->kv_lora_rank;
  c->head_dim_v = c->kv_lora_rank;
  c->rotary_dim = c->qk_rope_head_dim;
  c->pairing = RopePairing::kInterleaved;  // the official code's q/k_pe permutation: planes (2i, 2i+1)
  c->intermediate_size = r.positive_int("intermediate_size");
  c->vocab_size = r.positive_int("vocab_size");
  c->max_seq_len = r.positive_int("max_position_embeddings");
  c->rope_theta = r.positive_number("rope_theta", 10000.0);
  c->rms_norm_eps = r.positive_number("rms_norm_eps", 1e-6);
  c->tie_word_embeddings = r.boolean("tie_word_embeddings", false);
  c->bos_id = r.token_id("bos_token_id", 100000);
  c->eos_id = r.token_id("eos_token_id", 100001);
  const std::string act = r.string("hidden_act");
  if (!act.empty() && act != "silu") throw Error(path, "hidden_act", "'" + act + "' is not supported (silu)");
  if (r.boolean("attention_bias", false)) throw Error(path, "attention_bias", "true is not supported");

  parse_rope_scaling(j, path, c);
  RopeScaling& rs = c->rope_scaling;
  if (rs.type == RopeType::kLlama3)
    throw Error(path, "rope_scaling", "'llama3' is not a DeepSeek-V2 RoPE (default, linear, dynamic, yarn)");
  double scale = 1.0 / std::sqrt(double(c->qk_nope_head_dim + c->qk_rope_head_dim));
  if (rs.type == RopeType::kYarn) {
    // DeepseekV2YarnRotaryEmbedding: original length 4096 by default; cos/sin times
    // ms(f, mscale) / ms(f, mscale_all_dim) with mscale 1 and mscale_all_dim 0 by default (so
    // attention_factor, which the official code never reads, is replaced).
    if (rs.original_max_position_embeddings == 0) rs.original_max_position_embeddings = 4096;
    rs.attention_factor = deepseek_mscale(rs.factor, rs.mscale > 0 ? rs.mscale : 1.0) /
                          deepseek_mscale(rs.factor, rs.mscale_all_dim);
  }
  // The official attention scales by ms(factor, mscale_all_dim)^2 whenever rope_scaling states
  // mscale_all_dim (transformers' own deepseek_v2 long lacked it).
  if (rs.type != RopeType::kDefault && rs.mscale_all_dim > 0) {
    const double m = deepseek_mscale(rs.factor, rs.mscale_all_dim);
    scale *= m * m;
  }
  c->softmax_scale = scale;

  // DeepSeekMoE. Layer l is MoE iff n_routed_experts is set, l >= first_k_dense_replace and
  // l % moe_layer_freq == 0.
  if (!r.has("n_routed_experts")) return;
  c->n_experts = r.positive_int("n_routed_experts");
  c->n_experts_per_tok = r.positive_int("num_experts_per_tok");
  c->moe_intermediate_size = r.positive_int("moe_intermediate_size");
  c->n_shared_experts = r.has("n_shared_experts") ? r.positive_int("n_shared_experts") : 0;
  if (c->n_experts_per_tok > c->n_experts)
    throw Error(path, "num_experts_per_tok", std::to_string(c->n_experts_per_tok) + " is above n_routed_experts " +
                                                 std::to_string(c->n_experts));
  c->routed_scaling_factor = r.positive_number("routed_scaling_factor", 1.0);
  // modeling_deepseek.py renormalises only for top_k > 1 (else it scales by routed_scaling_factor).
  c->norm_topk_prob = r.boolean("norm_topk_prob", false) && c->n_experts_per_tok > 1;
  const std::string scoring = r.has("scoring_func") ? r.string("scoring_func") : "softmax";
  if (scoring != "softmax")
    throw Error(path, "scoring_func", "'" + scoring + "' is not supported (softmax)");
  const std::string method = r.has("topk_method") ? r.string("topk_method") : "greedy";
  if (method == "group_limited_greedy") {
    c->n_group = r.positive_int("n_group");
    c->topk_group = r.positive_int("topk_group");
    if (c->n_experts % c->n_group != 0)
      throw Error(path, "n_group", std::to_string(c->n_group) + " does not divide n_routed_experts " +
                                       std::to_string(c->n_experts));
    if (c->topk_group > c->n_group)
      throw Error(path, "topk_group", std::to_string(c->topk_group) + " is above n_group " + std::to_string(c->n_group));
    if (c->n_experts_per_tok > c->topk_group * (c->n_experts / c->n_group))
      throw Error(path, "num_experts_per_tok", std::to_string(c->n_experts_per_tok) + " is above the " +
                                                   std::to_string(c->topk_group * (c->n_experts / c->n_group)) +
                                                   " experts of topk_group groups");
  } else if (method != "greedy") {
    throw Error(path, "topk_method", "'" + method + "' is not supported (greedy, group_limited_greedy)");
  }
  int first_dense = 0;
  if (r.has("first_k_dense_replace")) {
    const json& v = r.raw("first_k_dense_replace");
    if (!v.is_number_integer() || v.get<int64_t>() < 0 || v.get<int64_t>() > (1 << 30))
      throw Error(path, "first_k_dense_replace", "expected a layer count, found " + v.dump());
    first_dense = int(v.get<int64_t>());
  }
  const int freq = r.positive_int("moe_layer_freq", 1);
  c->layer_moe.assign(size_t(c->n_layers), 0);
  for (int l = 0; l < c->n_layers; ++l) c->layer_moe[size_t(l)] = l >= first_dense && l % freq == 0;
}
}  // namespace

ModelConfig parse_hf_config(const std::string& path) {
  const json j = parse_json_file(path);
  const ConfigReader r(j, path);
  ModelConfig c;
  c.architecture = architecture_of(r, j, path);
  if (c.architecture == "chatglm") {
    parse_chatglm_config(r, path, &c);
    return c;
  }
  if (c.architecture == "deepseek_v2") {
    parse_deepseek_config(r, j, path, &c);
    return c;
  }
  const bool glm = c.architecture == "glm" || c.architecture == "glm4";
  c.hidden_size = r.positive_int("hidden_size");
  c.n_layers = r.positive_int("num_hidden_layers");
  c.n_heads = r.positive_int("num_attention_heads");
  c.n_kv_heads = r.positive_int("num_key_value_heads", c.n_heads);
  if (!r.has("head_dim") && c.hidden_size % c.n_heads != 0)
    throw Error(path, "hidden_size", std::to_string(c.hidden_size) + " is not divisible by num_attention_heads " +
                                         std::to_string(c.n_heads) + " (and head_dim is not given)");
  c.head_dim = r.positive_int("head_dim", c.hidden_size / c.n_heads);
  c.intermediate_size = r.positive_int("intermediate_size");
  c.vocab_size = r.positive_int("vocab_size");
  c.max_seq_len = r.positive_int("max_position_embeddings");
  c.rope_theta = r.positive_number("rope_theta", 10000.0);
  c.rms_norm_eps = r.positive_number("rms_norm_eps");
  c.tie_word_embeddings = r.boolean("tie_word_embeddings", false);
  c.bos_id = r.token_id("bos_token_id", 1);
  c.eos_id = r.token_id("eos_token_id", 2);
  // HF rotate_half, except GLM's rotate_half_llm / rotate_every_two: adjacent pairs (2i, 2i+1).
  c.pairing = glm ? RopePairing::kInterleaved : RopePairing::kSplitHalf;

  if (c.n_heads % c.n_kv_heads != 0)
    throw Error(path, "num_key_value_heads", std::to_string(c.n_kv_heads) +
                                                 " does not divide num_attention_heads " + std::to_string(c.n_heads));
  if (c.head_dim % 2 != 0) throw Error(path, "head_dim", std::to_string(c.head_dim) + " is odd");

  // transformers 5 moves partial_rotary_factor into rope_parameters.
  const bool in_params = !r.has("partial_rotary_factor") && j.contains("rope_parameters") &&
                         j["rope_parameters"].is_object() && j["rope_parameters"].contains("partial_rotary_factor");
  const char* factor_key = in_params ? "rope_parameters.partial_rotary_factor" : "partial_rotary_factor";
  double factor = glm ? 0.5 : 1.0;
  if (in_params || r.has("partial_rotary_factor")) {
    const json& v = in_params ? j["rope_parameters"]["partial_rotary_factor"] : j["partial_rotary_factor"];
    if (!v.is_number() || !(v.get<double>() > 0)) throw Error(path, factor_key, "expected a positive number, found " + v.dump());
    factor = v.get<double>();
  }
  if (factor > 1.0) throw Error(path, factor_key, std::to_string(factor) + " is above 1");
  c.rotary_dim = static_cast<int>(c.head_dim * factor);
  if (c.rotary_dim < 2 || c.rotary_dim % 2 != 0)
    throw Error(path, factor_key,
                std::to_string(factor) + " gives rotary dim " + std::to_string(c.rotary_dim) +
                    " for head_dim " + std::to_string(c.head_dim) + " (must be even and >= 2)");

  // Features that change the math and are not implemented: refuse rather than compute wrong logits.
  const std::string act = r.string("hidden_act");
  if (!act.empty() && act != "silu")
    throw Error(path, "hidden_act", "'" + act + "' is not supported (silu)");
  parse_rope_scaling(j, path, &c);
  if (r.boolean("mlp_bias", false)) throw Error(path, "mlp_bias", "true is not supported");

  parse_architecture_features(r, j, path, &c);
  return c;
}

}  // namespace kvq::detail
