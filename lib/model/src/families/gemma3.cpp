// Gemma 3 (transformers' modeling_gemma3.py): the common decoder layout with every RMSNorm
// x · rsqrt(mean x² + eps) · (1 + w) (the weights are offsets: 1 is added as they are converted),
// four norms a layer (input, post-attention, pre- and post-feedforward: the sandwich form), per-head
// q/k norms before RoPE, logits scaled by query_pre_attn_scalar^-½, GeGLU with the tanh GELU,
// sliding windows on the layers `layer_types` marks (default: all but every sliding_window_pattern-th,
// 6), whose RoPE is the default one at rope_local_base_freq (10k) while the full layers use
// rope_theta (1M) and rope_scaling (linear 8 on 4B+: global layers only), embeddings × √hidden
// rounded to BF16 (HF casts the normaliser to the weights' dtype), the head tied to the embedding.
// gemma3 (multimodal) reads text_config and the language model's tensors under
// language_model.model. (transformers 4.50) or model.language_model. (5); the vision tower and
// projector are never read.
#include "gemma3.hpp"

#include <c10/util/BFloat16.h>

#include <cmath>

namespace kvq::detail {
namespace {

void parse_text(const json& text, const std::string& path, const std::string& prefix, ModelConfig* c) {
  json tj = text;
  const ConfigReader raw(text, path, prefix);
  // hidden_activation (hidden_act in older files) must be the tanh GELU; the common reader would
  // refuse anything but silu under hidden_act, so it is checked here and removed.
  for (const char* k : {"hidden_activation", "hidden_act"}) {
    const std::string act = raw.string(k);
    if (!act.empty() && act != "gelu_pytorch_tanh")
      throw Error(path, prefix + k, "'" + act + "' is not supported (gelu_pytorch_tanh)");
    tj.erase(k);
  }
  if (raw.has("final_logit_softcapping"))
    throw Error(path, prefix + "final_logit_softcapping", raw.raw("final_logit_softcapping").dump() +
                                                              " is not supported (Gemma 3 ships null)");
  // transformers 5: rope_parameters per layer type.
  double local_theta = raw.positive_number("rope_local_base_freq", 10000.0);
  if (tj.contains("rope_parameters") && tj["rope_parameters"].is_object() &&
      (tj["rope_parameters"].contains("full_attention") || tj["rope_parameters"].contains("sliding_attention"))) {
    const json rp = tj["rope_parameters"];
    if (rp.contains("sliding_attention")) {
      const ConfigReader sr(rp["sliding_attention"], path, prefix + "rope_parameters.sliding_attention.");
      local_theta = sr.positive_number("rope_theta", local_theta);
    }
    if (rp.contains("full_attention"))
      tj["rope_parameters"] = rp["full_attention"];
    else
      tj.erase("rope_parameters");
  }
  const ConfigReader r(tj, path, prefix);
  read_decoder_config(r, RopePairing::kSplitHalf, 1.0, c);
  c->tie_word_embeddings = r.boolean("tie_word_embeddings", true);
  c->qk_norm = true;
  c->sandwich_norm = true;
  c->gelu_tanh_mlp = true;
  c->rope_local_theta = local_theta;
  const double qpas = r.positive_number("query_pre_attn_scalar", 256.0);
  if (qpas != double(c->head_dim)) c->softmax_scale = 1.0 / std::sqrt(qpas);
  c->embed_multiplier = double(float(c10::BFloat16(float(std::sqrt(double(c->hidden_size))))));
  const int window = r.positive_int("sliding_window", 4096);
  const int pattern = r.positive_int("sliding_window_pattern", 6);
  set_layer_windows(window, read_sliding_layers(r, c->n_layers, [pattern](int l) { return (l + 1) % pattern != 0; }), c);
}

void parse_gemma3_text(const ConfigReader& r, ModelConfig* c) { parse_text(r.json_object(), r.path(), "", c); }

void parse_gemma3(const ConfigReader& r, ModelConfig* c) {
  if (!r.has("text_config") || !r.raw("text_config").is_object())
    throw Error(r.path(), "text_config", r.has("text_config") ? "expected an object" : "missing");
  parse_text(r.raw("text_config"), r.path(), "text_config.", c);
}

// Where the language model's tensors are: model. (text-only), language_model.model. (multimodal,
// transformers 4.50) or model.language_model. (5).
std::string prefix_of(const TensorIndex& t) {
  for (const char* p : {"model.", "language_model.model.", "model.language_model."})
    if (t.has(std::string(p) + "embed_tokens.weight")) return p;
  return "model.";
}

GlobalNames gemma3_globals(const ModelConfig&, const TensorIndex& t) {
  const std::string p = prefix_of(t);
  GlobalNames g{p + "embed_tokens.weight", p + "norm.weight", "lm_head.weight"};
  g.final_norm_offset = 1.0f;
  return g;
}

LayerPlan gemma3_plan(const ModelConfig& c, int l, const TensorIndex& t) {
  const std::string p = prefix_of(t) + "layers." + std::to_string(l) + ".";
  LayerNames n;
  n.attn_norm = p + "input_layernorm.weight";
  n.post_attn_norm = p + "post_attention_layernorm.weight";
  n.ffn_norm = p + "pre_feedforward_layernorm.weight";
  n.post_mlp_norm = p + "post_feedforward_layernorm.weight";
  n.q = p + "self_attn.q_proj";
  n.k = p + "self_attn.k_proj";
  n.v = p + "self_attn.v_proj";
  n.o = p + "self_attn.o_proj.weight";
  n.q_norm = p + "self_attn.q_norm.weight";
  n.k_norm = p + "self_attn.k_norm.weight";
  n.gate = p + "mlp.gate_proj.weight";
  n.up = p + "mlp.up_proj.weight";
  n.down = p + "mlp.down_proj.weight";
  LayerPlan plan = decoder_plan(c, l, n);
  LayerWeights probe;  // which tensor a slot fills, by address: the norms hold 1 + w
  for (Slot& s : plan) {
    const at::Tensor* d = &s.dst(probe);
    if (d == &probe.attn_norm || d == &probe.ffn_norm || d == &probe.q_norm || d == &probe.k_norm ||
        d == &probe.post_attn_norm || d == &probe.post_mlp_norm)
      s.offset = 1.0f;
  }
  return plan;
}

}  // namespace

const Family kGemma3Family = {"gemma3", {"Gemma3ForConditionalGeneration"}, parse_gemma3, gemma3_globals, nullptr,
                              gemma3_plan, decoder_layer};
const Family kGemma3TextFamily = {"gemma3_text", {"Gemma3ForCausalLM"}, parse_gemma3_text, gemma3_globals, nullptr,
                                  gemma3_plan, decoder_layer};

}  // namespace kvq::detail
