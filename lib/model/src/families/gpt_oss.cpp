// gpt-oss (transformers' modeling_gpt_oss.py; OpenAI's gpt_oss/torch/model.py): the common decoder
// layout with q/k/v/o biases (attention_bias), one learned sink logit per query head in every
// softmax (self_attn.sinks), sliding windows on the layers `layer_types` marks (default: even
// layers slide, odd ones are full), YaRN as config.json states it (truncate: false keeps the
// ramp's bounds unrounded); every layer an MoE: router W x + b, the top-k logits softmaxed among
// themselves, experts stacked [E, out, in] in MXFP4 (gate_up rows interleaved gate, up, ...) or,
// in a dequantized checkpoint, as plain [E, in, out] tensors (HF's GptOssExperts: columns
// interleaved), with biases, the clamped SwiGLU (limit swiglu_limit, alpha 1.702, up + 1). No shared expert, no dense
// layer, untied head, plain-w RMSNorm.
#include "gpt_oss.hpp"

namespace kvq::detail {
namespace {

void parse_gpt_oss(const ConfigReader& r, ModelConfig* c) {
  read_decoder_config(r, RopePairing::kSplitHalf, 1.0, c);
  c->qkv_bias = c->o_bias = r.boolean("attention_bias", true);
  c->attn_sinks = true;
  const int window = r.positive_int("sliding_window", 128);
  set_layer_windows(window, read_sliding_layers(r, c->n_layers, [](int l) { return l % 2 == 0; }), c);
  c->n_experts = r.positive_int("num_local_experts", 128);
  c->n_experts_per_tok = r.positive_int("num_experts_per_tok", 4);
  if (c->n_experts_per_tok > c->n_experts)
    throw Error(r.path(), "num_experts_per_tok", std::to_string(c->n_experts_per_tok) + " is above num_local_experts " +
                                                      std::to_string(c->n_experts));
  c->moe_intermediate_size = c->intermediate_size;
  // HF's expert code fixes the clamp at 7.0 (its MXFP4 kernel path reads swiglu_limit); read it.
  c->swiglu_limit = r.positive_number("swiglu_limit", 7.0);
  c->layer_moe.assign(size_t(c->n_layers), 1);
}

std::string experts_prefix(int l) { return "model.layers." + std::to_string(l) + ".mlp.experts."; }

LayerPlan gpt_oss_plan(const ModelConfig& c, int l, const TensorIndex& t) {
  const LayerNames n = llama_layer_names(l);
  const std::string p = "model.layers." + std::to_string(l) + ".";
  const int64_t D = c.hidden_size, H = c.n_heads, E = c.n_experts, I = c.moe_intermediate_size;
  const int64_t qd = H * c.head_dim, kvd = int64_t(c.n_kv_heads) * c.head_dim;
  LayerPlan plan;
  auto one = [&](std::function<at::Tensor&(LayerWeights&)> dst, const std::string& name, std::vector<int64_t> shape) {
    plan.push_back({std::move(dst), {{name, std::move(shape)}}});
  };
  one([](LayerWeights& L) -> at::Tensor& { return L.attn_norm; }, n.attn_norm, {D});
  plan.push_back({[](LayerWeights& L) -> at::Tensor& { return L.wqkv; },
                  {{n.q + ".weight", {qd, D}}, {n.k + ".weight", {kvd, D}}, {n.v + ".weight", {kvd, D}}}});
  plan.push_back({[](LayerWeights& L) -> at::Tensor& { return L.bqkv; },
                  {{n.q + ".bias", {qd}}, {n.k + ".bias", {kvd}}, {n.v + ".bias", {kvd}}}});
  one([](LayerWeights& L) -> at::Tensor& { return L.wo; }, n.o, {D, qd});
  one([](LayerWeights& L) -> at::Tensor& { return L.bo; }, n.o_bias, {D});
  one([](LayerWeights& L) -> at::Tensor& { return L.sinks; }, p + "self_attn.sinks", {H});
  one([](LayerWeights& L) -> at::Tensor& { return L.ffn_norm; }, n.ffn_norm, {D});
  one([](LayerWeights& L) -> at::Tensor& { return L.router; }, p + "mlp.router.weight", {E, D});
  one([](LayerWeights& L) -> at::Tensor& { return L.router_b; }, p + "mlp.router.bias", {E});
  const std::string x = experts_prefix(l);
  one([](LayerWeights& L) -> at::Tensor& { return L.expert_gate_up_b; }, x + "gate_up_proj_bias", {E, 2 * I});
  one([](LayerWeights& L) -> at::Tensor& { return L.expert_down_b; }, x + "down_proj_bias", {E, D});
  // MXFP4 blocks decode out-major ([E, out, in]); plain tensors are stored [E, in, out].
  const bool plain = t.owner.count(x + "gate_up_proj") != 0;
  for (int e = 0; e < E; ++e) {
    const size_t i = size_t(e);
    const WantTensor gate_up = plain ? WantTensor(x + "gate_up_proj", {2 * I, D}, e * D, {E, D, 2 * I}, true)
                                     : WantTensor(x + "gate_up_proj", {2 * I, D}, e * 2 * I, {E, 2 * I, D});
    const WantTensor down = plain ? WantTensor(x + "down_proj", {D, I}, e * I, {E, I, D}, true)
                                  : WantTensor(x + "down_proj", {D, I}, e * D, {E, D, I});
    plan.push_back({[i, E](LayerWeights& L) -> at::Tensor& {
                      L.expert_gate_up.resize(size_t(E));
                      return L.expert_gate_up[i];
                    },
                    {gate_up},
                    e});
    plan.push_back({[i, E](LayerWeights& L) -> at::Tensor& {
                      L.expert_down.resize(size_t(E));
                      return L.expert_down[i];
                    },
                    {down},
                    e});
  }
  return plan;
}

// The experts in one form per layer: both the plain tensor and MXFP4 blocks is ambiguous.
void check_gpt_oss(const ModelConfig& c, const TensorIndex& t, const std::string&) {
  for (int l = 0; l < c.n_layers; ++l)
    for (const char* w : {"gate_up_proj", "down_proj"}) {
      const std::string name = experts_prefix(l) + w;
      if (t.owner.count(name) && t.owner.count(name + "_blocks"))
        throw Error(t.owner.at(name)->path(), "tensor '" + name + "'",
                    "both a plain tensor and MXFP4 blocks ('" + name + "_blocks'): one form per expert tensor");
    }
}

}  // namespace

const Family kGptOssFamily = {"gpt_oss", {"GptOssForCausalLM"}, parse_gpt_oss, llama_globals, check_gpt_oss,
                              gpt_oss_plan, decoder_layer};

}  // namespace kvq::detail
