// Qwen2 (q/k/v biases), Qwen3 and Qwen3-MoE (per-head q/k RMSNorm before RoPE, `attention_bias`):
// the common decoder layout. Sliding windows only with `use_sliding_window`, then on the layers
// `layer_types` marks "sliding_attention", or else on layers >= max_window_layers (default 28;
// Qwen3-MoE has no max_window_layers: every layer). Qwen3-MoE: softmax router over `num_experts`,
// top `num_experts_per_tok`, `norm_topk_prob`, dense layers by `decoder_sparse_step` and
// `mlp_only_layers`.
#include "qwen.hpp"

namespace kvq::detail {
namespace {

void parse_window(const ConfigReader& r, bool moe, ModelConfig* c) {
  int window = 0;
  std::vector<uint8_t> sliding(size_t(c->n_layers), 0);
  if (r.boolean("use_sliding_window", false)) {
    window = r.positive_int("sliding_window", 4096);
    const int first = moe || r.has("layer_types") ? 0 : r.positive_int("max_window_layers", 28);
    sliding = read_sliding_layers(r, c->n_layers, [first](int l) { return l >= first; });
  }
  set_layer_windows(window, sliding, c);
}

void parse_qwen2(const ConfigReader& r, ModelConfig* c) {
  read_decoder_config(r, RopePairing::kSplitHalf, 1.0, c);
  c->qkv_bias = true;
  parse_window(r, false, c);
}

void parse_qwen3(const ConfigReader& r, ModelConfig* c) {
  read_decoder_config(r, RopePairing::kSplitHalf, 1.0, c);
  c->qk_norm = true;
  c->qkv_bias = c->o_bias = r.boolean("attention_bias", false);
  parse_window(r, false, c);
}

void parse_qwen3_moe(const ConfigReader& r, ModelConfig* c) {
  read_decoder_config(r, RopePairing::kSplitHalf, 1.0, c);
  c->qk_norm = true;
  c->qkv_bias = c->o_bias = r.boolean("attention_bias", false);
  parse_window(r, true, c);
  c->n_experts = r.positive_int("num_experts", 128);
  c->n_experts_per_tok = r.positive_int("num_experts_per_tok", 8);
  if (c->n_experts_per_tok > c->n_experts)
    throw Error(r.path(), "num_experts_per_tok", std::to_string(c->n_experts_per_tok) + " is above num_experts " +
                                                      std::to_string(c->n_experts));
  c->moe_intermediate_size = r.positive_int("moe_intermediate_size", 768);
  c->norm_topk_prob = r.boolean("norm_topk_prob", false);
  c->layer_moe.assign(size_t(c->n_layers), 1);
  const int step = r.positive_int("decoder_sparse_step", 1);
  for (int l = 0; l < c->n_layers; ++l)
    if ((l + 1) % step != 0) c->layer_moe[size_t(l)] = 0;
  for (int l : r.layer_list("mlp_only_layers", c->n_layers)) c->layer_moe[size_t(l)] = 0;
}

void check_qwen3_moe(const ModelConfig& c, const TensorIndex& t, const std::string& config_path) {
  check_expert_count(c, config_path, t, "num_experts", llama_expert_names);
}

}  // namespace

const Family kQwen2Family = {"qwen2", {"Qwen2ForCausalLM"}, parse_qwen2, llama_globals, nullptr, llama_plan, decoder_layer};
const Family kQwen3Family = {"qwen3", {"Qwen3ForCausalLM"}, parse_qwen3, llama_globals, nullptr, llama_plan, decoder_layer};
const Family kQwen3MoeFamily = {"qwen3_moe", {"Qwen3MoeForCausalLM"}, parse_qwen3_moe, llama_globals, check_qwen3_moe,
                                llama_plan, decoder_layer};

}  // namespace kvq::detail
