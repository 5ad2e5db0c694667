// DeepSeek's MLA models: V2 / V2-Lite (DeepseekV2ForCausalLM, the official modeling_deepseek.py)
// and V3 / R1 / V3.1 / Kimi-K2 (DeepseekV3ForCausalLM, the official inference/model.py). MLA in
// its served (absorbed) form (parts/mla), DeepSeek's YaRN, DeepSeekMoE (parts/moe: V2's softmax
// router, greedy or group-limited; V3's sigmoid noaux_tc router; shared experts; dense first layers).
#include "deepseek.hpp"

#include <cmath>

#include "parts/mla.hpp"
#include "parts/moe_config.hpp"

namespace kvq::detail {
namespace {

// YaRN's magnitude correction 0.1 m ln s + 1 (1 at s <= 1), as DeepSeek's yarn_get_mscale.
double deepseek_mscale(double s, double m) { return s <= 1.0 ? 1.0 : 0.1 * m * std::log(s) + 1.0; }

// config.json: MLA's ranks and head dims (see ModelConfig for the served cache), DeepSeek's YaRN
// and softmax scale: the attention DeepSeek-V2 and V3 share.
void parse_mla_attention(const ConfigReader& r, ModelConfig* c) {
  const json& j = r.json_object();
  const std::string& path = r.path();
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

}

void parse_deepseek_v2(const ConfigReader& r, ModelConfig* c) {
  const std::string& path = r.path();
  parse_mla_attention(r, c);
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
    read_group_limits(r, 0, 0, c);
  } else if (method != "greedy") {
    throw Error(path, "topk_method", "'" + method + "' is not supported (greedy, group_limited_greedy)");
  }
  read_dense_layers(r, 0, true, c);
}

// DeepSeek-V3 / R1 / V3.1 and Kimi-K2 (DeepseekV3ForCausalLM): V2's MLA and YaRN, DeepSeekMoE with
// the sigmoid noaux_tc router (parts/moe.cpp) and its e_score_correction_bias, always MoE past the
// first_k_dense_replace dense layers. The MTP layer (model.layers.{num_hidden_layers},
// num_nextn_predict_layers) is a draft head for speculative decoding: never read, never run.
void parse_deepseek_v3(const ConfigReader& r, ModelConfig* c) {
  const std::string& path = r.path();
  parse_mla_attention(r, c);
  c->n_experts = r.positive_int("n_routed_experts", 256);
  c->n_experts_per_tok = r.positive_int("num_experts_per_tok", 8);
  c->moe_intermediate_size = r.positive_int("moe_intermediate_size", 2048);
  c->n_shared_experts = r.positive_int("n_shared_experts", 1);
  if (c->n_experts_per_tok > c->n_experts)
    throw Error(path, "num_experts_per_tok", std::to_string(c->n_experts_per_tok) + " is above n_routed_experts " +
                                                 std::to_string(c->n_experts));
  c->routed_scaling_factor = r.positive_number("routed_scaling_factor", 2.5);
  c->norm_topk_prob = r.boolean("norm_topk_prob", true);
  const std::string scoring = r.has("scoring_func") ? r.string("scoring_func") : "sigmoid";
  if (scoring != "sigmoid") throw Error(path, "scoring_func", "'" + scoring + "' is not supported (sigmoid)");
  const std::string method = r.has("topk_method") ? r.string("topk_method") : "noaux_tc";
  if (method != "noaux_tc") throw Error(path, "topk_method", "'" + method + "' is not supported (noaux_tc)");
  read_group_limits(r, 8, 4, c);
  read_dense_layers(r, 3, true, c);
}

LayerNames deepseek_names(const ModelConfig& c, int l) {
  LayerNames n = llama_layer_names(l);
  if (c.architecture != "deepseek_v2") n.router_bias = "model.layers." + std::to_string(l) + ".mlp.gate.e_score_correction_bias";
  return n;
}

LayerPlan deepseek_plan(const ModelConfig& c, int l, const TensorIndex&) {
  const LayerPlan mla = mla_plan(c, "model.layers." + std::to_string(l) + ".self_attn.");
  return decoder_plan(c, l, deepseek_names(c, l), &mla);
}

void check_deepseek(const ModelConfig& c, const TensorIndex& t, const std::string& config_path) {
  if (c.n_experts > 0) check_expert_count(c, config_path, t, "n_routed_experts", llama_expert_names);
  check_kv_lora_rank(c, t, config_path);
}

}  // namespace

const Family kDeepseekV2Family = {"deepseek_v2", {"DeepseekV2ForCausalLM"}, parse_deepseek_v2, llama_globals,
                                  check_deepseek, deepseek_plan, decoder_layer};
const Family kDeepseekV3Family = {"deepseek_v3", {"DeepseekV3ForCausalLM"}, parse_deepseek_v3, llama_globals,
                                  check_deepseek, deepseek_plan, decoder_layer};
// Kimi-K2 ships DeepSeek-V3's architecture under its own model_type.
const Family kKimiK2Family = {"kimi_k2", {}, parse_deepseek_v3, llama_globals, check_deepseek, deepseek_plan,
                              decoder_layer};

}  // namespace kvq::detail
