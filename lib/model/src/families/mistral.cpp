// Mistral and Mixtral: the common decoder layout with a sliding window on every layer (MistralConfig
// defaults `sliding_window` to 4096, MixtralConfig to null); Mixtral's experts under
// `block_sparse_moe` with w1 (gate), w3 (up), w2 (down), always renormalised.
#include "mistral.hpp"

namespace kvq::detail {
namespace {

void parse_window(const ConfigReader& r, bool mistral, ModelConfig* c) {
  const json& j = r.json_object();
  int window = 0;
  const bool present = j.contains("sliding_window");
  if (present ? !j["sliding_window"].is_null() : mistral) window = r.positive_int("sliding_window", 4096);
  set_layer_windows(window, std::vector<uint8_t>(size_t(c->n_layers), 1), c);
}

void parse_mistral(const ConfigReader& r, ModelConfig* c) {
  read_decoder_config(r, RopePairing::kSplitHalf, 1.0, c);
  parse_window(r, true, c);
}

void parse_mixtral(const ConfigReader& r, ModelConfig* c) {
  read_decoder_config(r, RopePairing::kSplitHalf, 1.0, c);
  parse_window(r, false, c);
  c->n_experts = r.positive_int("num_local_experts", 8);
  c->n_experts_per_tok = r.positive_int("num_experts_per_tok", 2);
  if (c->n_experts_per_tok > c->n_experts)
    throw Error(r.path(), "num_experts_per_tok", std::to_string(c->n_experts_per_tok) + " is above num_local_experts " +
                                                      std::to_string(c->n_experts));
  c->moe_intermediate_size = c->intermediate_size;
  c->norm_topk_prob = true;
  c->layer_moe.assign(size_t(c->n_layers), 1);
}

ExpertNames mixtral_expert(int l, int e) {
  const std::string p = "model.layers." + std::to_string(l) + ".block_sparse_moe.experts." + std::to_string(e) + ".";
  return {p + "w1.weight", p + "w3.weight", p + "w2.weight"};
}

LayerPlan mixtral_plan(const ModelConfig& c, int l, const TensorIndex&) {
  LayerNames n = llama_layer_names(l);
  n.router = "model.layers." + std::to_string(l) + ".block_sparse_moe.gate.weight";
  n.expert = [l](int e) { return mixtral_expert(l, e); };
  return decoder_plan(c, l, n);
}

void check_mixtral(const ModelConfig& c, const TensorIndex& t, const std::string& config_path) {
  check_expert_count(c, config_path, t, "num_local_experts", mixtral_expert);
}

}  // namespace

const Family kMistralFamily = {"mistral", {"MistralForCausalLM"}, parse_mistral, llama_globals, nullptr, llama_plan,
                               decoder_layer};
const Family kMixtralFamily = {"mixtral", {"MixtralForCausalLM"}, parse_mixtral, llama_globals, check_mixtral,
                               mixtral_plan, decoder_layer};

}  // namespace kvq::detail
