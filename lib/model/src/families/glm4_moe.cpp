// GLM-4.5 / 4.6 / 4.7 (transformers' modeling_glm4_moe.py): the common decoder layout with
// head_dim from the config, partial rotary (partial_rotary_factor, default 0.5) in HF's split-half
// pairing over the first rotary_dim dims of each head (not GLM-4-9B's adjacent pairs), q/k/v biases
// when attention_bias (o_proj never has one), per-head q/k RMSNorm before RoPE when use_qk_norm,
// and DeepSeek-V3's MoE: the sigmoid noaux_tc router with e_score_correction_bias (groups when
// n_group > 1), renormalised x routed_scaling_factor, shared experts, dense first layers. The MTP
// layer (model.layers.{num_hidden_layers}) is never read.
#include "glm4_moe.hpp"

#include "parts/moe_config.hpp"

namespace kvq::detail {
namespace {

void parse_glm4_moe(const ConfigReader& r, ModelConfig* c) {
  read_decoder_config(r, RopePairing::kSplitHalf, 0.5, c);
  c->qkv_bias = r.boolean("attention_bias", false);
  c->qk_norm = r.boolean("use_qk_norm", false);
  c->n_experts = r.positive_int("n_routed_experts", 128);
  c->n_experts_per_tok = r.positive_int("num_experts_per_tok", 8);
  if (c->n_experts_per_tok > c->n_experts)
    throw Error(r.path(), "num_experts_per_tok", std::to_string(c->n_experts_per_tok) + " is above n_routed_experts " +
                                                      std::to_string(c->n_experts));
  c->moe_intermediate_size = r.positive_int("moe_intermediate_size", 1408);
  c->n_shared_experts = r.positive_int("n_shared_experts", 1);
  c->routed_scaling_factor = r.positive_number("routed_scaling_factor", 1.0);
  c->norm_topk_prob = r.boolean("norm_topk_prob", true);
  read_group_limits(r, 1, 1, c);
  read_dense_layers(r, 1, false, c);
}

LayerPlan glm4_moe_plan(const ModelConfig& c, int l, const TensorIndex&) {
  LayerNames n = llama_layer_names(l);
  n.router_bias = "model.layers." + std::to_string(l) + ".mlp.gate.e_score_correction_bias";
  return decoder_plan(c, l, n);
}

void check_glm4_moe(const ModelConfig& c, const TensorIndex& t, const std::string& config_path) {
  check_expert_count(c, config_path, t, "n_routed_experts", llama_expert_names);
}

}  // namespace

const Family kGlm4MoeFamily = {"glm4_moe", {"Glm4MoeForCausalLM"}, parse_glm4_moe, llama_globals, check_glm4_moe,
                               glm4_moe_plan, decoder_layer};

}  // namespace kvq::detail
