// GLM-4 in its three forms. chatglm: THUDM's own layout (transformer.encoder.layers.N ...: fused
// query_key_value + bias, dense, fused dense_h_to_4h = [gate; up]). glm / glm4 (GlmForCausalLM,
// Glm4ForCausalLM): the Llama layout with q/k/v biases (no o_proj bias), a fused gate_up_proj, or an
// older converter's fused qkv_proj, and in glm4 the sandwich norms (post_self_attn_layernorm,
// post_mlp_layernorm on each sublayer's output before the residual add). All rotate the first
// half of the head in adjacent pairs (rotate_half_llm / rotate_every_two).
#include "glm.hpp"

namespace kvq::detail {
namespace {

// ChatGLM's own config.json (THUDM/glm-4-9b, glm-4-9b-chat; modeling_chatglm.py): Megatron-style
// keys, RoPE base 10000 · rope_ratio over the first kv_channels / 2 dims in adjacent pairs. The
// variants of ChatGLM's code that change the math (LayerNorm, post-layernorm residual, biased
// linears, the pre-GLM-4 RoPE) are refused by name.
void parse_chatglm(const ConfigReader& r, ModelConfig* c) {
  const std::string& path = r.path();
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

void parse_glm(const ConfigReader& r, ModelConfig* c) {
  read_decoder_config(r, RopePairing::kInterleaved, 0.5, c);
  // GlmConfig / Glm4Config: attention_bias (default true) is on q, k, v only; o_proj has none.
  c->qkv_bias = r.boolean("attention_bias", true);
  c->sandwich_norm = c->architecture == "glm4";
}

GlobalNames chatglm_globals(const ModelConfig&, const TensorIndex&) {
  return {"transformer.embedding.word_embeddings.weight", "transformer.encoder.final_layernorm.weight",
          "transformer.output_layer.weight"};
}

LayerNames chatglm_names(int l) {
  LayerNames n;
  const std::string p = "transformer.encoder.layers." + std::to_string(l) + ".";
  n.attn_norm = p + "input_layernorm.weight";
  n.ffn_norm = p + "post_attention_layernorm.weight";
  n.qkv = p + "self_attention.query_key_value.weight";
  n.qkv_bias = p + "self_attention.query_key_value.bias";
  n.o = p + "self_attention.dense.weight";
  n.gate_up = p + "mlp.dense_h_to_4h.weight";
  n.down = p + "mlp.dense_4h_to_h.weight";
  return n;
}

// glm / glm4: an older converter wrote q, k and v as one qkv_proj.
bool fused_qkv(const TensorIndex& t) { return t.has("model.layers.0.self_attn.qkv_proj.weight"); }

LayerNames glm_names(const ModelConfig& c, int l, bool fused) {
  LayerNames n = llama_layer_names(l);
  const std::string p = "model.layers." + std::to_string(l) + ".";
  if (fused) {
    n.qkv = p + "self_attn.qkv_proj.weight";
    n.qkv_bias = p + "self_attn.qkv_proj.bias";
  }
  n.gate_up = p + "mlp.gate_up_proj.weight";
  if (c.sandwich_norm) {
    n.post_attn_norm = p + "post_self_attn_layernorm.weight";
    n.post_mlp_norm = p + "post_mlp_layernorm.weight";
  }
  return n;
}

LayerPlan chatglm_plan(const ModelConfig& c, int l, const TensorIndex&) { return decoder_plan(c, l, chatglm_names(l)); }
LayerPlan glm_plan(const ModelConfig& c, int l, const TensorIndex& t) { return decoder_plan(c, l, glm_names(c, l, fused_qkv(t))); }

// A fused [Q; K; V] projection must have the rows the config's head counts give: a checkpoint
// whose rows do not add up is a config/weights mismatch, named as such (not a bare shape error).
void check_fused_qkv(const ModelConfig& c, const TensorIndex& t, const std::string& config_path) {
  const bool chat = c.architecture == "chatglm";
  if (!chat && !fused_qkv(t)) return;
  const int64_t qd = int64_t(c.n_heads) * c.head_dim, kvd = int64_t(c.n_kv_heads) * c.head_dim;
  for (int l = 0; l < c.n_layers; ++l) {
    const LayerNames n = chat ? chatglm_names(l) : glm_names(c, l, true);
    for (const std::string* name : {&n.qkv, c.qkv_bias ? &n.qkv_bias : nullptr}) {
      if (!name) continue;
      const StTensorInfo* info = t.file_of(*name).find(*name);  // an absent tensor is named here
      if (!info || info->shape.empty() || info->shape[0] == qd + 2 * kvd) continue;
      throw Error(t.file_of(*name).path(), "tensor '" + *name + "'",
                  std::to_string(info->shape[0]) + " rows do not add up to Q + K + V = " + std::to_string(qd) + " + " +
                      std::to_string(kvd) + " + " + std::to_string(kvd) + " = " + std::to_string(qd + 2 * kvd) +
                      " (" + config_path + ": num_attention_heads " +
                      std::to_string(c.n_heads) + ", " + (chat ? "multi_query_group_num " : "num_key_value_heads ") +
                      std::to_string(c.n_kv_heads) + ", " + (chat ? "kv_channels " : "head_dim ") +
                      std::to_string(c.head_dim) + ")");
    }
  }
}

}  // namespace

const Family kChatGlmFamily = {"chatglm", {"ChatGLMModel", "ChatGLMForConditionalGeneration"}, parse_chatglm,
                               chatglm_globals, check_fused_qkv, chatglm_plan, decoder_layer};
const Family kGlmFamily = {"glm", {"GlmForCausalLM"}, parse_glm, llama_globals, check_fused_qkv, glm_plan, decoder_layer};
const Family kGlm4Family = {"glm4", {"Glm4ForCausalLM"}, parse_glm, llama_globals, check_fused_qkv, glm_plan,
                            decoder_layer};

}  // namespace kvq::detail
