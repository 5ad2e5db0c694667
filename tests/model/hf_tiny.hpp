#pragma once
// Tiny HF checkpoints of every family kvq opens, written from a spec: config.json in the family's
// own keys, seeded random weights rounded to BF16 and sharded through model.safetensors.index.json.
// The weights come back as doubles (the exact BF16 values) so a reference forward can use them.
// No GoogleTest and no kvq library here: tests/tools/kvq-make-tiny-hf uses it too.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

namespace kvq::test::hf {

struct Tensor {
  std::vector<int64_t> shape;
  std::vector<double> v;  // exactly representable in BF16 (or F32 / the dequantized value, below)
  // How it is written: "BF16" (from v), "F32" (from v), or raw little-endian bytes of another dtype
  // ("F8_E4M3", "I32"); write = false keeps a logical weight (its dequantized v, what a reference
  // forward reads) that the checkpoint stores under other names (INT4: X.weight_packed ...).
  std::string dtype = "BF16";
  std::vector<uint8_t> raw;
  bool write = true;
};
using TensorMap = std::map<std::string, Tensor>;

// Round to nearest even (finite inputs only).
inline uint16_t f32_to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  u += 0x7FFFu + ((u >> 16) & 1u);
  return uint16_t(u >> 16);
}
inline float bf16_to_f32(uint16_t h) {
  const uint32_t u = uint32_t(h) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
inline double bf16_round(double x) { return double(bf16_to_f32(f32_to_bf16(float(x)))); }

// family: llama | mistral | qwen2 | qwen3 | qwen3_moe | mixtral | chatglm | glm | glm4 |
// deepseek_v2 | deepseek_v3 | glm4_moe | gpt_oss | gemma3_text | gemma3 | qwen3_5 | qwen3_5_moe |
// qwen3_next (the HF model_type). The GLM-4 forms: chatglm in ChatGLM's own keys and tensor names
// (fused query_key_value with bias, dense_h_to_4h), glm / glm4 in the Llama layout with split q/k/v
// + bias and a fused gate_up_proj, glm4 with the sandwich norms.
struct Spec {
  std::string family = "llama";
  int hidden = 32, layers = 3, heads = 4, kv_heads = 2, head_dim = 16, inter = 48, vocab = 64;
  int max_pos = 512;
  double theta = 10000.0, eps = 1e-6;
  bool tied = false;
  // MoE (qwen3_moe, mixtral)
  int experts = 0, top_k = 0, moe_inter = 0;
  bool norm_topk_prob = true;        // qwen3_moe / qwen3_next (Mixtral always renormalises)
  int decoder_sparse_step = 1;
  std::vector<int> mlp_only_layers;
  // Sliding window: mistral/mixtral when > 0; qwen2/qwen3/qwen3_moe when use_sliding_window.
  int sliding_window = 0;
  bool use_sliding_window = false;
  int max_window_layers = 0;
  int bos_id = 1, eos_id = 2;
  // Weight scales: N(0, scale) for linear layers, N(0, embed_scale) for the embedding, norms
  // 1 + N(0, norm_jitter), q/k norms 1 + N(0, qk_norm_jitter); the router gets router_scale.
  double scale = 0.2, embed_scale = 1.0, norm_jitter = 0.1, router_scale = 1.0, qk_norm_jitter = 0.5;
  uint32_t seed = 1;
  // GLM-4: chatglm's rope_ratio (base 10000 · rope_ratio, rotary dim head_dim / 2); glm/glm4's
  // partial_rotary_factor (base theta); glm/glm4 fused_qkv writes the older converter's qkv_proj.
  double rope_ratio = 1.0, partial_rotary_factor = 0.5;
  bool fused_qkv = false;
  nlohmann::json extra = nlohmann::json::object();  // merged into config.json last (rope_scaling ...)
  // deepseek_v2 (MLA + DeepSeekMoE): heads, inter (dense layers), experts / top_k / moe_inter /
  // norm_topk_prob as above; head_dim and kv_heads are not used. q_lora_rank 0 writes null (q_proj).
  int q_lora_rank = 0, kv_lora_rank = 24, qk_nope_head_dim = 16, qk_rope_head_dim = 8, v_head_dim = 12;
  int n_shared_experts = 0, first_k_dense_replace = 0, moe_layer_freq = 1;
  double routed_scaling_factor = 1.0;
  std::string topk_method = "greedy";
  int n_group = 1, topk_group = 1;
  bool mtp = false;  // deepseek_v3: also write an MTP layer at model.layers.{layers} (never to be read)
  // gpt_oss (gpt-oss, HF GptOssConfig): experts / top_k / inter (each expert's width) /
  // sliding_window as above; every layer MoE. layer_types: empty means HF's default (even layers
  // "sliding_attention", odd "full_attention"); written unless write_layer_types is false. RoPE: YaRN
  // (yarn_factor over yarn_original positions, beta 32 / 1, truncate false). Sinks N(0, sink_scale);
  // the experts' gate_up weights N(0, gate_up_scale), down weights N(0, scale), the experts' and the
  // router's biases N(0, bias_scale); the experts ship in MXFP4 (see quantize_mxfp4 below).
  std::vector<std::string> layer_types;
  bool write_layer_types = true;
  double yarn_factor = 32.0;
  int yarn_original = 4096;
  double sink_scale = 1.0, gate_up_scale = 0.2, bias_scale = 0.2;
  double swiglu_limit = 7.0;
  // gemma3_text / gemma3 (HF Gemma3TextConfig; MODEL-FAMILIES-2026.md §4.1): head_dim, kv_heads,
  // sliding_window and layer_types as above (HF's default rule: sliding unless (l + 1) %
  // sliding_window_pattern == 0); with write_sliding_window_pattern the config states
  // sliding_window_pattern (the transformers 4.50 form) instead of layer_types. rope_theta (theta)
  // for the full layers, rope_local_base_freq (rope_local_theta) for the sliding ones;
  // rope_linear_factor > 0 writes rope_scaling {"rope_type": "linear", "factor": F} (full layers
  // only), 0 writes null. query_pre_attn_scalar (0: head_dim). Every norm weight is an offset w
  // (the norm multiplies by 1 + w): N(0, norm_jitter), q/k norms N(0, qk_norm_jitter). Tied head.
  // gemma3 is the multimodal wrapper: the text fields under text_config, a dummy vision_config, the
  // text tensors under language_prefix ("language_model.model." as transformers 4.50 saves,
  // "model.language_model." as v5 does) and a few vision_tower / multi_modal_projector tensors
  // (under "model." too in the v5 form) that a reader must ignore.
  double rope_local_theta = 10000.0, rope_linear_factor = 0.0, query_pre_attn_scalar = 0.0;
  int sliding_window_pattern = 6;
  bool write_sliding_window_pattern = false;
  std::string language_prefix = "language_model.model.";
  // qwen3_5 / qwen3_5_moe (HF Qwen3_5(Moe)TextConfig inside Qwen3_5(Moe)Config; MODEL-FAMILIES-2026.md
  // §1): the multimodal wrapper (text fields under text_config, a dummy vision_config; the text
  // tensors under model.language_model., beside model.visual.* and mtp.* tensors a reader must
  // ignore). heads / kv_heads / head_dim are the full-attention layers' (q_proj [H·hd·2, hidden]:
  // per head hd query rows then hd gate rows); partial_rotary_factor of head_dim rotates (split-half
  // within it). layer_types as above, or (write_layer_types false) HF's default rule: layer l is
  // full_attention when (l + 1) % full_attention_interval == 0, else linear_attention (Gated
  // DeltaNet: lin_k_heads q/k heads of lin_k_dim, lin_v_heads value heads of lin_v_dim, a causal
  // depthwise conv of conv_kernel taps). RoPE: rope_parameters {rope_type default, rope_theta,
  // partial_rotary_factor, mrope_section, mrope_interleaved} (transformers 5), or with classic_rope
  // top-level rope_theta + partial_rotary_factor. qwen3_5: dense SwiGLU (inter); qwen3_5_moe: every
  // layer a router over experts (top_k, moe_inter, always renormalised) plus a shared expert of
  // shared_inter (0: moe_inter) gated by sigmoid(shared_expert_gate · x); the experts fused as
  // mlp.experts.gate_up_proj [E, 2I, hidden] / down_proj [E, hidden, I], or per_expert_keys
  // mlp.experts.{e}.{gate,up,down}_proj.weight (the same values for the same seed).
  // Weights: every (1 + w) norm (input / post_attention / final: N(0, norm_jitter); q/k:
  // N(0, qk_norm_jitter)) is stored as the offset w; the DeltaNet's output norm (plain w) is
  // 1 + N(0, lin_norm_jitter); conv1d N(0, conv_scale); A_log N(a_log_center, a_log_jitter) and
  // dt_bias N(0, dt_bias_scale) with in_proj_a N(0, proj_a_scale), so that the decay exp(g) =
  // exp(-exp(A_log) · softplus(a + dt_bias)) lies mostly in (0.3, 0.95); other projections N(0, scale).
  // lin_qk_overlap c > 0 correlates each q channel with its k channel (in_proj_qkv's q rows and
  // conv1d's q taps become c · k's + sqrt(1 - c²) · their own draw): random q and k in a few dims are
  // often near-orthogonal, which leaves o = Sᵀq a near-zero cancellation that the DeltaNet's output
  // norm scales back to unit size, amplifying fp32 roundoff (trained models' q and k are correlated).
  int lin_k_heads = 2, lin_v_heads = 4, lin_k_dim = 8, lin_v_dim = 8, conv_kernel = 4;
  int full_attention_interval = 4;
  int shared_inter = 0;
  bool classic_rope = false, per_expert_keys = false;
  double lin_norm_jitter = 0.2, conv_scale = 0.5, a_log_center = -0.9, a_log_jitter = 0.4, dt_bias_scale = 0.3,
         proj_a_scale = 0.05;
  double lin_qk_overlap = 0.0;
  // qwen3_next (HF Qwen3NextConfig; MODEL-FAMILIES-2026.md §1.7): Qwen3.5-MoE's math in a text-only
  // checkpoint. config.json at the top level (model_type qwen3_next, Qwen3NextForCausalLM; rope_theta
  // and partial_rotary_factor as top-level keys, whatever classic_rope says; layer_types written or
  // not as above); tensors under model. (an MTP block mtp.* a reader must ignore; no model.visual.*).
  // The Gated DeltaNet's projections fused and grouped per key head (see group_qkvz / group_ba):
  // linear_attn.in_proj_qkvz [Hk·(2·dk + 2·r·dv), D], linear_attn.in_proj_ba [2·Hv, D], r = Hv / Hk.
  // The MLP as Qwen2-MoE: layer l is MoE iff experts > 0, (l + 1) % decoder_sparse_step == 0 and l is
  // not in mlp_only_layers (else the dense SwiGLU of inter, mlp.{gate,up,down}_proj); the router
  // renormalises only with norm_topk_prob; experts under per-expert keys
  // mlp.experts.{e}.{gate,up,down}_proj.weight; the gated shared expert as qwen3_5_moe's. The values:
  // exactly those the qwen3_5_moe writer draws for the same spec with per_expert_keys (the grouped
  // tensors are its in_proj_qkv / in_proj_z / in_proj_b / in_proj_a rows regrouped), so a reader that
  // un-groups them must recover that checkpoint's reference; the dense layers' MLPs (in place of that
  // layer's MoE tensors) come from a second generator, so they change no other value.

  bool glm() const { return family == "chatglm" || family == "glm" || family == "glm4"; }
  bool deepseek() const { return family == "deepseek_v2" || family == "deepseek_v3"; }
  bool v3() const { return family == "deepseek_v3"; }
  // glm4_moe (GLM-4.5): head_dim, partial_rotary_factor, q/k/v biases, q/k norm, a sigmoid router
  // with e_score_correction_bias, n_shared_experts, first_k_dense_replace, an MTP layer (mtp).
  bool glm4_moe() const { return family == "glm4_moe"; }
  bool gpt_oss() const { return family == "gpt_oss"; }
  bool gemma3() const { return family == "gemma3" || family == "gemma3_text"; }
  bool qwen3_5() const { return family == "qwen3_5" || family == "qwen3_5_moe"; }
  bool qwen3_next() const { return family == "qwen3_next"; }
  // The Gated DeltaNet hybrids (layer types linear_attention / full_attention).
  bool hybrid() const { return qwen3_5() || qwen3_next(); }
  // The prefix of the Gemma 3 text model's tensors (embed_tokens, layers.N., norm).
  std::string text_prefix() const { return family == "gemma3" ? language_prefix : "model."; }
  // gpt_oss / gemma3 / qwen3_5: layer l's type as the config states it, else HF's default rule.
  std::string layer_type(int l) const {
    if (!layer_types.empty()) return layer_types[size_t(l)];
    if (hybrid()) return (l + 1) % full_attention_interval ? "linear_attention" : "full_attention";
    const int pattern = gemma3() ? sliding_window_pattern : 2;
    return (l + 1) % pattern ? "sliding_attention" : "full_attention";
  }

  bool moe() const {
    return family == "qwen3_moe" || family == "mixtral" || family == "qwen3_5_moe" || gpt_oss() ||
           ((deepseek() || glm4_moe() || qwen3_next()) && experts > 0);
  }
  bool qk_norm() const { return family == "qwen3" || family == "qwen3_moe"; }
  bool is_moe_layer(int l) const {
    if (!moe()) return false;
    if (family == "mixtral" || gpt_oss() || qwen3_5()) return true;
    if (deepseek()) return l >= first_k_dense_replace && l % moe_layer_freq == 0;
    if (glm4_moe()) return l >= first_k_dense_replace;
    for (int x : mlp_only_layers)
      if (x == l) return false;
    return (l + 1) % decoder_sparse_step == 0;
  }
  // The attention window of layer l as transformers applies it (0: full causal).
  int window_of(int l) const {
    if (family == "mistral" || family == "mixtral") return sliding_window;
    if (gpt_oss() || gemma3()) return layer_type(l) == "sliding_attention" ? sliding_window : 0;
    if (!use_sliding_window) return 0;
    if (family == "qwen3_moe") return sliding_window;
    return l >= max_window_layers ? sliding_window : 0;
  }
};

inline const char* class_of(const std::string& family) {
  if (family == "llama") return "LlamaForCausalLM";
  if (family == "mistral") return "MistralForCausalLM";
  if (family == "qwen2") return "Qwen2ForCausalLM";
  if (family == "qwen3") return "Qwen3ForCausalLM";
  if (family == "qwen3_moe") return "Qwen3MoeForCausalLM";
  if (family == "mixtral") return "MixtralForCausalLM";
  if (family == "chatglm") return "ChatGLMModel";
  if (family == "glm") return "GlmForCausalLM";
  if (family == "glm4") return "Glm4ForCausalLM";
  if (family == "deepseek_v2") return "DeepseekV2ForCausalLM";
  if (family == "deepseek_v3") return "DeepseekV3ForCausalLM";
  if (family == "glm4_moe") return "Glm4MoeForCausalLM";
  if (family == "gpt_oss") return "GptOssForCausalLM";
  if (family == "gemma3_text") return "Gemma3ForCausalLM";
  if (family == "gemma3") return "Gemma3ForConditionalGeneration";
  if (family == "qwen3_5") return "Qwen3_5ForConditionalGeneration";
  if (family == "qwen3_5_moe") return "Qwen3_5MoeForConditionalGeneration";
  if (family == "qwen3_next") return "Qwen3NextForCausalLM";
  throw std::invalid_argument("unknown family " + family);
}

// ChatGLM's config.json keys (glm-4-9b's, with the tiny shape).
inline nlohmann::json make_chatglm_config(const Spec& s) {
  nlohmann::json c = {{"architectures", {"ChatGLMModel"}},
                      {"model_type", "chatglm"},
                      {"hidden_size", s.hidden},
                      {"num_layers", s.layers},
                      {"num_attention_heads", s.heads},
                      {"multi_query_attention", true},
                      {"multi_query_group_num", s.kv_heads},
                      {"kv_channels", s.head_dim},
                      {"ffn_hidden_size", s.inter},
                      {"padded_vocab_size", s.vocab},
                      {"seq_length", s.max_pos},
                      {"layernorm_epsilon", s.eps},
                      {"rmsnorm", true},
                      {"add_qkv_bias", true},
                      {"add_bias_linear", false},
                      {"apply_residual_connection_post_layernorm", false},
                      {"post_layer_norm", true},
                      {"original_rope", true},
                      {"rope_ratio", s.rope_ratio},
                      {"tie_word_embeddings", false},
                      {"eos_token_id", {s.eos_id}},
                      {"pad_token_id", s.eos_id},
                      {"torch_dtype", "bfloat16"}};
  for (auto it = s.extra.begin(); it != s.extra.end(); ++it) c[it.key()] = it.value();
  return c;
}

// DeepSeek-V2's config.json keys (DeepSeek-V2-Lite's, with the tiny shape).
inline nlohmann::json make_deepseek_config(const Spec& s) {
  using nlohmann::json;
  json c = {{"architectures", {class_of(s.family)}},
            {"model_type", s.family},
            {"hidden_size", s.hidden},
            {"num_hidden_layers", s.layers},
            {"num_attention_heads", s.heads},
            {"num_key_value_heads", s.heads},
            {"q_lora_rank", s.q_lora_rank > 0 ? json(s.q_lora_rank) : json(nullptr)},
            {"kv_lora_rank", s.kv_lora_rank},
            {"qk_nope_head_dim", s.qk_nope_head_dim},
            {"qk_rope_head_dim", s.qk_rope_head_dim},
            {"v_head_dim", s.v_head_dim},
            {"intermediate_size", s.inter},
            {"vocab_size", s.vocab},
            {"max_position_embeddings", s.max_pos},
            {"rope_theta", s.theta},
            {"rope_scaling", nullptr},
            {"rms_norm_eps", s.eps},
            {"tie_word_embeddings", s.tied},
            {"hidden_act", "silu"},
            {"attention_bias", false},
            {"bos_token_id", s.bos_id},
            {"eos_token_id", s.eos_id},
            {"torch_dtype", "bfloat16"}};
  if (s.experts > 0) {
    c["n_routed_experts"] = s.experts;
    c["num_experts_per_tok"] = s.top_k;
    c["moe_intermediate_size"] = s.moe_inter;
    c["n_shared_experts"] = s.n_shared_experts > 0 ? json(s.n_shared_experts) : json(nullptr);
    c["first_k_dense_replace"] = s.first_k_dense_replace;
    c["moe_layer_freq"] = s.moe_layer_freq;
    c["routed_scaling_factor"] = s.routed_scaling_factor;
    c["norm_topk_prob"] = s.norm_topk_prob;
    c["topk_method"] = s.topk_method;
    c["n_group"] = s.n_group;
    c["topk_group"] = s.topk_group;
    c["scoring_func"] = s.v3() ? "sigmoid" : "softmax";
    if (s.v3()) c["num_nextn_predict_layers"] = s.mtp ? 1 : 0;
    c["aux_loss_alpha"] = 0.001;
    c["seq_aux"] = true;
  } else {
    c["n_routed_experts"] = nullptr;
  }
  for (auto it = s.extra.begin(); it != s.extra.end(); ++it) c[it.key()] = it.value();
  return c;
}

// GLM-4.5's config.json keys (Glm4MoeForCausalLM), with the tiny shape.
inline nlohmann::json make_glm4_moe_config(const Spec& s) {
  nlohmann::json c = {{"architectures", {class_of(s.family)}},
                      {"model_type", s.family},
                      {"hidden_size", s.hidden},
                      {"num_hidden_layers", s.layers},
                      {"num_attention_heads", s.heads},
                      {"num_key_value_heads", s.kv_heads},
                      {"head_dim", s.head_dim},
                      {"partial_rotary_factor", s.partial_rotary_factor},
                      {"intermediate_size", s.inter},
                      {"moe_intermediate_size", s.moe_inter},
                      {"n_routed_experts", s.experts},
                      {"n_shared_experts", s.n_shared_experts},
                      {"num_experts_per_tok", s.top_k},
                      {"n_group", s.n_group},
                      {"topk_group", s.topk_group},
                      {"first_k_dense_replace", s.first_k_dense_replace},
                      {"routed_scaling_factor", s.routed_scaling_factor},
                      {"norm_topk_prob", s.norm_topk_prob},
                      {"use_qk_norm", true},
                      {"attention_bias", true},
                      {"num_nextn_predict_layers", s.mtp ? 1 : 0},
                      {"vocab_size", s.vocab},
                      {"max_position_embeddings", s.max_pos},
                      {"rope_theta", s.theta},
                      {"rms_norm_eps", s.eps},
                      {"hidden_act", "silu"},
                      {"tie_word_embeddings", s.tied},
                      {"bos_token_id", s.bos_id},
                      {"eos_token_id", s.eos_id},
                      {"torch_dtype", "bfloat16"}};
  for (auto it = s.extra.begin(); it != s.extra.end(); ++it) c[it.key()] = it.value();
  return c;
}

// gpt-oss's config.json keys (HF GptOssConfig, as openai/gpt-oss-20b ships them), tiny shape.
inline nlohmann::json make_gpt_oss_config(const Spec& s) {
  nlohmann::json c = {{"architectures", {class_of(s.family)}},
                      {"model_type", s.family},
                      {"hidden_size", s.hidden},
                      {"num_hidden_layers", s.layers},
                      {"num_attention_heads", s.heads},
                      {"num_key_value_heads", s.kv_heads},
                      {"head_dim", s.head_dim},
                      {"intermediate_size", s.inter},
                      {"num_local_experts", s.experts},
                      {"num_experts_per_tok", s.top_k},
                      {"experts_per_token", s.top_k},
                      {"vocab_size", s.vocab},
                      {"max_position_embeddings", s.max_pos},
                      {"rope_theta", s.theta},
                      {"rope_scaling",
                       {{"rope_type", "yarn"},
                        {"factor", s.yarn_factor},
                        {"beta_fast", 32.0},
                        {"beta_slow", 1.0},
                        {"original_max_position_embeddings", s.yarn_original},
                        {"truncate", false}}},
                      {"rms_norm_eps", s.eps},
                      {"sliding_window", s.sliding_window},
                      {"attention_bias", true},
                      {"attention_dropout", 0.0},
                      {"hidden_act", "silu"},
                      {"tie_word_embeddings", false},
                      {"swiglu_limit", s.swiglu_limit},
                      {"router_aux_loss_coef", 0.9},
                      {"output_router_logits", false},
                      {"initial_context_length", s.yarn_original},
                      {"use_cache", true},
                      {"bos_token_id", s.bos_id},
                      {"eos_token_id", s.eos_id},
                      {"pad_token_id", s.eos_id},
                      {"torch_dtype", "bfloat16"},
                      {"quantization_config",
                       {{"quant_method", "mxfp4"},
                        {"modules_to_not_convert",
                         {"model.layers.*.self_attn", "model.layers.*.mlp.router", "model.embed_tokens", "lm_head"}}}}};
  if (s.write_layer_types) {
    nlohmann::json t = nlohmann::json::array();
    for (int l = 0; l < s.layers; ++l) t.push_back(s.layer_type(l));
    c["layer_types"] = t;
  }
  for (auto it = s.extra.begin(); it != s.extra.end(); ++it) c[it.key()] = it.value();
  return c;
}

// Gemma 3's config.json (HF Gemma3TextConfig keys, as google/gemma-3-1b-it ships them, tiny
// shape); gemma3: Gemma3Config with these under text_config (model_type gemma3_text) and a dummy
// SigLIP vision_config. Spec::extra is merged into the text fields.
inline nlohmann::json make_gemma3_config(const Spec& s) {
  using nlohmann::json;
  json t = {{"model_type", "gemma3_text"},
            {"vocab_size", s.vocab},
            {"hidden_size", s.hidden},
            {"intermediate_size", s.inter},
            {"num_hidden_layers", s.layers},
            {"num_attention_heads", s.heads},
            {"num_key_value_heads", s.kv_heads},
            {"head_dim", s.head_dim},
            {"hidden_activation", "gelu_pytorch_tanh"},
            {"max_position_embeddings", s.max_pos},
            {"rms_norm_eps", s.eps},
            {"rope_theta", s.theta},
            {"rope_local_base_freq", s.rope_local_theta},
            {"rope_scaling", s.rope_linear_factor > 0 ? json{{"rope_type", "linear"}, {"factor", s.rope_linear_factor}}
                                                       : json(nullptr)},
            {"query_pre_attn_scalar", s.query_pre_attn_scalar > 0 ? s.query_pre_attn_scalar : double(s.head_dim)},
            {"sliding_window", s.sliding_window},
            {"final_logit_softcapping", nullptr},
            {"attn_logit_softcapping", nullptr},
            {"attention_bias", false},
            {"attention_dropout", 0.0},
            {"tie_word_embeddings", true},
            {"bos_token_id", s.bos_id},
            {"eos_token_id", s.eos_id},
            {"pad_token_id", 0},
            {"initializer_range", 0.02},
            {"use_cache", true},
            {"torch_dtype", "bfloat16"}};
  if (s.write_layer_types) {
    json lt = json::array();
    for (int l = 0; l < s.layers; ++l) lt.push_back(s.layer_type(l));
    t["layer_types"] = lt;
  }
  if (s.write_sliding_window_pattern) t["sliding_window_pattern"] = s.sliding_window_pattern;
  for (auto it = s.extra.begin(); it != s.extra.end(); ++it) t[it.key()] = it.value();
  if (s.family == "gemma3_text") {
    t["architectures"] = {class_of(s.family)};
    return t;
  }
  t.erase("torch_dtype");
  return {{"architectures", {class_of(s.family)}},
          {"model_type", "gemma3"},
          {"text_config", t},
          {"vision_config",
           {{"model_type", "siglip_vision_model"},
            {"hidden_size", 16},
            {"intermediate_size", 32},
            {"num_hidden_layers", 1},
            {"num_attention_heads", 2},
            {"image_size", 32},
            {"patch_size", 16},
            {"vision_use_head", false}}},
          {"mm_tokens_per_image", 4},
          {"boi_token_index", s.vocab - 3},
          {"eoi_token_index", s.vocab - 2},
          {"image_token_index", s.vocab - 1},
          {"initializer_range", 0.02},
          {"torch_dtype", "bfloat16"}};
}

// The config fields Qwen3.5's text_config and Qwen3-Next's config.json write alike: the shape,
// norms and token ids, the Gated DeltaNet's keys, layer_types when written, and with `moe` the MoE
// keys (num_experts, num_experts_per_tok, moe_intermediate_size, shared_expert_intermediate_size,
// router_aux_loss_coef, output_router_logits). nlohmann::json keeps its keys sorted, so the
// callers' own keys may be added after; each merges Spec::extra last (merge_extra).
inline nlohmann::json hybrid_config_fields(const Spec& s, bool moe) {
  using nlohmann::json;
  json t = {{"vocab_size", s.vocab},
            {"hidden_size", s.hidden},
            {"num_hidden_layers", s.layers},
            {"num_attention_heads", s.heads},
            {"num_key_value_heads", s.kv_heads},
            {"head_dim", s.head_dim},
            {"hidden_act", "silu"},
            {"max_position_embeddings", s.max_pos},
            {"rms_norm_eps", s.eps},
            {"tie_word_embeddings", s.tied},
            {"attention_bias", false},
            {"attention_dropout", 0.0},
            {"linear_conv_kernel_dim", s.conv_kernel},
            {"linear_key_head_dim", s.lin_k_dim},
            {"linear_value_head_dim", s.lin_v_dim},
            {"linear_num_key_heads", s.lin_k_heads},
            {"linear_num_value_heads", s.lin_v_heads},
            {"full_attention_interval", s.full_attention_interval},
            {"initializer_range", 0.02},
            {"use_cache", true},
            {"bos_token_id", s.bos_id},
            {"eos_token_id", s.eos_id}};
  if (moe) {
    t["num_experts"] = s.experts;
    t["num_experts_per_tok"] = s.top_k;
    t["moe_intermediate_size"] = s.moe_inter;
    t["shared_expert_intermediate_size"] = s.shared_inter > 0 ? s.shared_inter : s.moe_inter;
    t["router_aux_loss_coef"] = 0.001;
    t["output_router_logits"] = false;
  }
  if (s.write_layer_types) {
    json lt = json::array();
    for (int l = 0; l < s.layers; ++l) lt.push_back(s.layer_type(l));
    t["layer_types"] = lt;
  }
  return t;
}
inline void merge_extra(nlohmann::json& c, const Spec& s) {
  for (auto it = s.extra.begin(); it != s.extra.end(); ++it) c[it.key()] = it.value();
}

// Qwen3.5's config.json (HF Qwen3_5(Moe)Config as Qwen/Qwen3.5-* ship it, tiny shape): the text
// fields under text_config (model_type qwen3_5_text / qwen3_5_moe_text, with the keys the real
// configs carry beside the ones kvq needs: attn_output_gate, mamba_ssm_dtype, mtp_*), a dummy
// vision_config, tie_word_embeddings at both levels. Spec::extra is merged into the text fields.
inline nlohmann::json make_qwen3_5_config(const Spec& s) {
  using nlohmann::json;
  const bool moe = s.family == "qwen3_5_moe";
  const int rotary_half = int(s.head_dim * s.partial_rotary_factor) / 2;
  // mrope_section splits the rotary frequencies over the (t, h, w) streams ([11, 11, 10] of 32); for
  // text all three are the token index, so it changes nothing.
  const int ms = (rotary_half + 2) / 3;
  const json mrope = {ms, ms, rotary_half - 2 * ms};
  json t = hybrid_config_fields(s, moe);
  t["model_type"] = moe ? "qwen3_5_moe_text" : "qwen3_5_text";
  t["attn_output_gate"] = true;
  t["mamba_ssm_dtype"] = "float32";
  t["mtp_num_hidden_layers"] = 1;
  t["mtp_use_dedicated_embeddings"] = false;
  t["dtype"] = "bfloat16";
  if (!moe) t["intermediate_size"] = s.inter;
  if (s.classic_rope) {
    t["rope_theta"] = s.theta;
    t["partial_rotary_factor"] = s.partial_rotary_factor;
  } else {
    t["rope_parameters"] = {{"rope_type", "default"},
                            {"rope_theta", s.theta},
                            {"partial_rotary_factor", s.partial_rotary_factor},
                            {"mrope_section", mrope},
                            {"mrope_interleaved", true}};
  }
  merge_extra(t, s);
  return {{"architectures", {class_of(s.family)}},
          {"model_type", s.family},
          {"text_config", t},
          {"vision_config",
           {{"model_type", moe ? "qwen3_5_moe_vision" : "qwen3_5_vision"},
            {"depth", 1},
            {"hidden_size", 16},
            {"intermediate_size", 32},
            {"num_heads", 2},
            {"in_channels", 3},
            {"patch_size", 2},
            {"spatial_merge_size", 2},
            {"temporal_patch_size", 2},
            {"out_hidden_size", s.hidden},
            {"num_position_embeddings", 16},
            {"hidden_act", "gelu_pytorch_tanh"}}},
          {"image_token_id", s.vocab - 1},
          {"video_token_id", s.vocab - 2},
          {"vision_start_token_id", s.vocab - 3},
          {"vision_end_token_id", s.vocab - 4},
          {"tie_word_embeddings", s.tied},
          {"transformers_version", "5.0.0"}};
}

// Qwen3-Next's config.json (HF Qwen3NextConfig as Qwen/Qwen3-Next-80B-A3B-* ship it, tiny shape):
// every field at the top level, rope_theta and partial_rotary_factor as plain keys, the Qwen2-MoE
// keys (decoder_sparse_step, mlp_only_layers, norm_topk_prob) beside Qwen3.5's DeltaNet keys.
// Spec::extra is merged last.
inline nlohmann::json make_qwen3_next_config(const Spec& s) {
  using nlohmann::json;
  json c = hybrid_config_fields(s, true);
  c["architectures"] = {class_of(s.family)};
  c["model_type"] = s.family;
  c["intermediate_size"] = s.inter;
  c["rope_theta"] = s.theta;
  c["partial_rotary_factor"] = s.partial_rotary_factor;
  c["rope_scaling"] = nullptr;
  c["norm_topk_prob"] = s.norm_topk_prob;
  c["decoder_sparse_step"] = s.decoder_sparse_step;
  c["mlp_only_layers"] = s.mlp_only_layers;
  c["use_sliding_window"] = false;
  c["torch_dtype"] = "bfloat16";
  c["transformers_version"] = "4.57.0.dev0";
  merge_extra(c, s);
  return c;
}

inline nlohmann::json make_config(const Spec& s) {
  using nlohmann::json;
  if (s.family == "chatglm") return make_chatglm_config(s);
  if (s.qwen3_next()) return make_qwen3_next_config(s);
  if (s.gemma3()) return make_gemma3_config(s);
  if (s.qwen3_5()) return make_qwen3_5_config(s);
  if (s.gpt_oss()) return make_gpt_oss_config(s);
  if (s.deepseek()) return make_deepseek_config(s);
  if (s.glm4_moe()) return make_glm4_moe_config(s);
  json c = {{"architectures", {class_of(s.family)}},
            {"model_type", s.family},
            {"hidden_size", s.hidden},
            {"num_hidden_layers", s.layers},
            {"num_attention_heads", s.heads},
            {"num_key_value_heads", s.kv_heads},
            {"head_dim", s.head_dim},
            {"intermediate_size", s.inter},
            {"vocab_size", s.vocab},
            {"max_position_embeddings", s.max_pos},
            {"rope_theta", s.theta},
            {"rms_norm_eps", s.eps},
            {"tie_word_embeddings", s.tied},
            {"hidden_act", "silu"},
            {"bos_token_id", s.bos_id},
            {"eos_token_id", s.eos_id},
            {"torch_dtype", "bfloat16"}};
  const json window = s.sliding_window > 0 ? json(s.sliding_window) : json(nullptr);
  if (s.family == "llama" || s.family == "qwen3" || s.family == "qwen3_moe") c["attention_bias"] = false;
  if (s.family == "mistral" || s.family == "mixtral") c["sliding_window"] = window;
  if (s.family == "qwen2" || s.family == "qwen3" || s.family == "qwen3_moe") {
    c["use_sliding_window"] = s.use_sliding_window;
    c["sliding_window"] = window;
    if (s.family != "qwen3_moe") c["max_window_layers"] = s.max_window_layers;
  }
  if (s.family == "qwen3_moe") {
    c["num_experts"] = s.experts;
    c["num_experts_per_tok"] = s.top_k;
    c["moe_intermediate_size"] = s.moe_inter;
    c["norm_topk_prob"] = s.norm_topk_prob;
    c["decoder_sparse_step"] = s.decoder_sparse_step;
    c["mlp_only_layers"] = s.mlp_only_layers;
  }
  if (s.family == "mixtral") {
    c["num_local_experts"] = s.experts;
    c["num_experts_per_tok"] = s.top_k;
  }
  if (s.glm()) {
    c["partial_rotary_factor"] = s.partial_rotary_factor;
    c["attention_bias"] = true;
    c.erase("bos_token_id");  // GlmConfig: bos_token_id None
  }
  for (auto it = s.extra.begin(); it != s.extra.end(); ++it) c[it.key()] = it.value();
  return c;
}

// Tensor names of one MoE expert (gate, up, down) in the family's layout.
inline std::vector<std::string> expert_tensor_names(const Spec& s, int l, int e) {
  const std::string p = "model.layers." + std::to_string(l) + ".";
  if (s.family == "mixtral") {
    const std::string q = p + "block_sparse_moe.experts." + std::to_string(e) + ".";
    return {q + "w1.weight", q + "w3.weight", q + "w2.weight"};
  }
  const std::string q = p + "mlp.experts." + std::to_string(e) + ".";
  return {q + "gate_proj.weight", q + "up_proj.weight", q + "down_proj.weight"};
}
inline std::string router_tensor_name(const Spec& s, int l) {
  return "model.layers." + std::to_string(l) + (s.family == "mixtral" ? ".block_sparse_moe.gate.weight" : ".mlp.gate.weight");
}

// GLM-4's tensors in the spec's form (see Spec): fused tensors stack their parts as rows.
template <typename Add>
void make_glm_weights(const Spec& s, Add& add) {
  const int64_t D = s.hidden, I = s.inter, qd = int64_t(s.heads) * s.head_dim, kvd = int64_t(s.kv_heads) * s.head_dim;
  const bool chat = s.family == "chatglm";
  add(chat ? "transformer.embedding.word_embeddings.weight" : "model.embed_tokens.weight", {s.vocab, D}, s.embed_scale);
  for (int l = 0; l < s.layers; ++l) {
    const std::string p = (chat ? "transformer.encoder.layers." : "model.layers.") + std::to_string(l) + ".";
    add(p + "input_layernorm.weight", {D}, s.norm_jitter, 1.0);
    add(p + "post_attention_layernorm.weight", {D}, s.norm_jitter, 1.0);
    if (chat) {
      add(p + "self_attention.query_key_value.weight", {qd + 2 * kvd, D}, s.scale);
      add(p + "self_attention.query_key_value.bias", {qd + 2 * kvd}, s.scale);
      add(p + "self_attention.dense.weight", {D, qd}, s.scale);
      add(p + "mlp.dense_h_to_4h.weight", {2 * I, D}, s.scale);
      add(p + "mlp.dense_4h_to_h.weight", {D, I}, s.scale);
      continue;
    }
    if (s.fused_qkv) {
      add(p + "self_attn.qkv_proj.weight", {qd + 2 * kvd, D}, s.scale);
      add(p + "self_attn.qkv_proj.bias", {qd + 2 * kvd}, s.scale);
    } else {
      add(p + "self_attn.q_proj.weight", {qd, D}, s.scale);
      add(p + "self_attn.k_proj.weight", {kvd, D}, s.scale);
      add(p + "self_attn.v_proj.weight", {kvd, D}, s.scale);
      add(p + "self_attn.q_proj.bias", {qd}, s.scale);
      add(p + "self_attn.k_proj.bias", {kvd}, s.scale);
      add(p + "self_attn.v_proj.bias", {kvd}, s.scale);
    }
    add(p + "self_attn.o_proj.weight", {D, qd}, s.scale);
    add(p + "mlp.gate_up_proj.weight", {2 * I, D}, s.scale);
    add(p + "mlp.down_proj.weight", {D, I}, s.scale);
    if (s.family == "glm4") {  // far from 1 so that skipping them changes the logits clearly
      add(p + "post_self_attn_layernorm.weight", {D}, s.qk_norm_jitter, 1.0);
      add(p + "post_mlp_layernorm.weight", {D}, s.qk_norm_jitter, 1.0);
    }
  }
  if (chat) {
    add("transformer.encoder.final_layernorm.weight", {D}, s.norm_jitter, 1.0);
    add("transformer.output_layer.weight", {s.vocab, D}, s.scale);
    // ChatGLM stores an inv_freq buffer (computed without rope_ratio) that kvq must never read:
    // here a constant 0.5, which no RoPE of the tests has.
    add("transformer.rotary_pos_emb.inv_freq", {s.head_dim / 4}, 0.0, 0.5);
  } else {
    add("model.norm.weight", {D}, s.norm_jitter, 1.0);
    add("lm_head.weight", {s.vocab, D}, s.scale);
  }
}

// DeepSeek-V2's tensors: MLA (q_proj or the q-LoRA triple, kv_a_proj_with_mqa, kv_a_layernorm,
// kv_b_proj, o_proj), dense MLP before first_k_dense_replace, then router + experts + shared experts.
// GLM-4.5 (transformers' modeling_glm4_moe.py names): q/k/v with biases, per-head q/k norms, the
// dense first layers, then router + correction bias, routed and shared experts; with mtp, the MTP
// block at model.layers.{layers} with its extra projections and norms.
template <typename Add>
void make_glm4_moe_weights(const Spec& s, Add& add) {
  const int64_t D = s.hidden, qd = int64_t(s.heads) * s.head_dim, kvd = int64_t(s.kv_heads) * s.head_dim;
  add("model.embed_tokens.weight", {s.vocab, D}, s.embed_scale);
  for (int l = 0; l < s.layers + (s.mtp ? 1 : 0); ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    add(p + "input_layernorm.weight", {D}, s.norm_jitter, 1.0);
    add(p + "post_attention_layernorm.weight", {D}, s.norm_jitter, 1.0);
    add(p + "self_attn.q_proj.weight", {qd, D}, s.scale);
    add(p + "self_attn.k_proj.weight", {kvd, D}, s.scale);
    add(p + "self_attn.v_proj.weight", {kvd, D}, s.scale);
    add(p + "self_attn.q_proj.bias", {qd}, s.scale);
    add(p + "self_attn.k_proj.bias", {kvd}, s.scale);
    add(p + "self_attn.v_proj.bias", {kvd}, s.scale);
    add(p + "self_attn.o_proj.weight", {D, qd}, s.scale);
    add(p + "self_attn.q_norm.weight", {s.head_dim}, s.qk_norm_jitter, 1.0);
    add(p + "self_attn.k_norm.weight", {s.head_dim}, s.qk_norm_jitter, 1.0);
    if (l < s.layers && !s.is_moe_layer(l)) {
      add(p + "mlp.gate_proj.weight", {s.inter, D}, s.scale);
      add(p + "mlp.up_proj.weight", {s.inter, D}, s.scale);
      add(p + "mlp.down_proj.weight", {D, s.inter}, s.scale);
      continue;
    }
    add(p + "mlp.gate.weight", {s.experts, D}, s.router_scale);
    add(p + "mlp.gate.e_score_correction_bias", {s.experts}, s.router_scale);
    for (int e = 0; e < s.experts; ++e) {
      const std::string x = p + "mlp.experts." + std::to_string(e) + ".";
      add(x + "gate_proj.weight", {s.moe_inter, D}, s.scale);
      add(x + "up_proj.weight", {s.moe_inter, D}, s.scale);
      add(x + "down_proj.weight", {D, s.moe_inter}, s.scale);
    }
    const int64_t Is = int64_t(s.n_shared_experts) * s.moe_inter;
    add(p + "mlp.shared_experts.gate_proj.weight", {Is, D}, s.scale);
    add(p + "mlp.shared_experts.up_proj.weight", {Is, D}, s.scale);
    add(p + "mlp.shared_experts.down_proj.weight", {D, Is}, s.scale);
    if (l == s.layers) {
      add(p + "eh_proj.weight", {D, 2 * D}, s.scale);
      add(p + "enorm.weight", {D}, s.norm_jitter, 1.0);
      add(p + "hnorm.weight", {D}, s.norm_jitter, 1.0);
      add(p + "shared_head.norm.weight", {D}, s.norm_jitter, 1.0);
    }
  }
  add("model.norm.weight", {D}, s.norm_jitter, 1.0);
  if (!s.tied) add("lm_head.weight", {s.vocab, D}, s.scale);
}

template <typename Add>
void make_deepseek_weights(const Spec& s, Add& add) {
  const int64_t D = s.hidden, H = s.heads, R = s.kv_lora_rank, qk = s.qk_nope_head_dim + s.qk_rope_head_dim;
  add("model.embed_tokens.weight", {s.vocab, D}, s.embed_scale);
  for (int l = 0; l < s.layers; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    add(p + "input_layernorm.weight", {D}, s.norm_jitter, 1.0);
    add(p + "post_attention_layernorm.weight", {D}, s.norm_jitter, 1.0);
    if (s.q_lora_rank > 0) {
      add(p + "self_attn.q_a_proj.weight", {s.q_lora_rank, D}, s.scale);
      add(p + "self_attn.q_a_layernorm.weight", {s.q_lora_rank}, s.qk_norm_jitter, 1.0);
      add(p + "self_attn.q_b_proj.weight", {H * qk, s.q_lora_rank}, s.scale);
    } else {
      add(p + "self_attn.q_proj.weight", {H * qk, D}, s.scale);
    }
    add(p + "self_attn.kv_a_proj_with_mqa.weight", {R + s.qk_rope_head_dim, D}, s.scale);
    // Far from 1 so that skipping the latent norm changes the logits clearly.
    add(p + "self_attn.kv_a_layernorm.weight", {R}, s.qk_norm_jitter, 1.0);
    add(p + "self_attn.kv_b_proj.weight", {H * (s.qk_nope_head_dim + s.v_head_dim), R}, s.scale);
    add(p + "self_attn.o_proj.weight", {D, H * s.v_head_dim}, s.scale);
    if (s.is_moe_layer(l)) {
      add(p + "mlp.gate.weight", {s.experts, D}, s.router_scale);
      if (s.v3()) add(p + "mlp.gate.e_score_correction_bias", {s.experts}, s.router_scale * 0.3);
      for (int e = 0; e < s.experts; ++e) {
        const auto n = expert_tensor_names(s, l, e);
        add(n[0], {s.moe_inter, D}, s.scale);
        add(n[1], {s.moe_inter, D}, s.scale);
        add(n[2], {D, s.moe_inter}, s.scale);
      }
      if (s.n_shared_experts > 0) {
        const int64_t Is = int64_t(s.n_shared_experts) * s.moe_inter;
        add(p + "mlp.shared_experts.gate_proj.weight", {Is, D}, s.scale);
        add(p + "mlp.shared_experts.up_proj.weight", {Is, D}, s.scale);
        add(p + "mlp.shared_experts.down_proj.weight", {D, Is}, s.scale);
      }
    } else {
      add(p + "mlp.gate_proj.weight", {s.inter, D}, s.scale);
      add(p + "mlp.up_proj.weight", {s.inter, D}, s.scale);
      add(p + "mlp.down_proj.weight", {D, s.inter}, s.scale);
    }
  }
  add("model.norm.weight", {D}, s.norm_jitter, 1.0);
  if (!s.tied) add("lm_head.weight", {s.vocab, D}, s.scale);
  if (s.v3() && s.mtp) {  // the MTP module: its own projections and norms around one more block
    const std::string p = "model.layers." + std::to_string(s.layers) + ".";
    add(p + "eh_proj.weight", {D, 2 * D}, s.scale);
    add(p + "enorm.weight", {D}, s.norm_jitter, 1.0);
    add(p + "hnorm.weight", {D}, s.norm_jitter, 1.0);
    add(p + "input_layernorm.weight", {D}, s.norm_jitter, 1.0);
    add(p + "self_attn.kv_a_proj_with_mqa.weight", {R + s.qk_rope_head_dim, D}, s.scale);
    add(p + "mlp.gate.weight", {s.experts, D}, s.router_scale);
    add(p + "mlp.experts.0.gate_proj.weight", {s.moe_inter, D}, s.scale);
  }
}

// gpt-oss (HF root checkpoint names): q/k/v/o with biases (o too), per-head sinks, router with
// bias, and the experts as stacked [E, out, in] logical tensors mlp.experts.gate_up_proj (rows
// interleaved: 2i gate_i, 2i+1 up_i) and mlp.experts.down_proj with their _bias [E, out]; make_weights
// then ships those two in MXFP4 (quantize_mxfp4).
template <typename Add>
void make_gpt_oss_weights(const Spec& s, Add& add) {
  const int64_t D = s.hidden, I = s.inter, E = s.experts, qd = int64_t(s.heads) * s.head_dim,
                kvd = int64_t(s.kv_heads) * s.head_dim;
  add("model.embed_tokens.weight", {s.vocab, D}, s.embed_scale);
  for (int l = 0; l < s.layers; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    add(p + "input_layernorm.weight", {D}, s.norm_jitter, 1.0);
    add(p + "post_attention_layernorm.weight", {D}, s.norm_jitter, 1.0);
    add(p + "self_attn.q_proj.weight", {qd, D}, s.scale);
    add(p + "self_attn.k_proj.weight", {kvd, D}, s.scale);
    add(p + "self_attn.v_proj.weight", {kvd, D}, s.scale);
    add(p + "self_attn.o_proj.weight", {D, qd}, s.scale);
    add(p + "self_attn.q_proj.bias", {qd}, s.bias_scale);
    add(p + "self_attn.k_proj.bias", {kvd}, s.bias_scale);
    add(p + "self_attn.v_proj.bias", {kvd}, s.bias_scale);
    add(p + "self_attn.o_proj.bias", {D}, s.bias_scale);
    add(p + "self_attn.sinks", {s.heads}, s.sink_scale);
    add(p + "mlp.router.weight", {E, D}, s.router_scale);
    add(p + "mlp.router.bias", {E}, s.bias_scale);
    add(p + "mlp.experts.gate_up_proj", {E, 2 * I, D}, s.gate_up_scale);
    add(p + "mlp.experts.gate_up_proj_bias", {E, 2 * I}, s.bias_scale);
    add(p + "mlp.experts.down_proj", {E, D, I}, s.scale);
    add(p + "mlp.experts.down_proj_bias", {E, D}, s.bias_scale);
  }
  add("model.norm.weight", {D}, s.norm_jitter, 1.0);
  add("lm_head.weight", {s.vocab, D}, s.scale);
}

// Gemma 3 (modeling_gemma3.py names, under Spec::text_prefix()): four norms per layer (input,
// post_attention, pre_feedforward, post_feedforward), q/k/v/o without bias, per-head q_norm /
// k_norm [head_dim], the GeGLU MLP; every norm weight centred on 0 (the norm scales by 1 + w); no
// lm_head (tied). gemma3 adds vision_tower / multi_modal_projector tensors that are never read.
template <typename Add>
void make_gemma3_weights(const Spec& s, Add& add) {
  const int64_t D = s.hidden, qd = int64_t(s.heads) * s.head_dim, kvd = int64_t(s.kv_heads) * s.head_dim;
  const std::string pre = s.text_prefix();
  add(pre + "embed_tokens.weight", {s.vocab, D}, s.embed_scale);
  for (int l = 0; l < s.layers; ++l) {
    const std::string p = pre + "layers." + std::to_string(l) + ".";
    add(p + "input_layernorm.weight", {D}, s.norm_jitter);
    add(p + "post_attention_layernorm.weight", {D}, s.norm_jitter);
    add(p + "pre_feedforward_layernorm.weight", {D}, s.norm_jitter);
    add(p + "post_feedforward_layernorm.weight", {D}, s.norm_jitter);
    add(p + "self_attn.q_proj.weight", {qd, D}, s.scale);
    add(p + "self_attn.k_proj.weight", {kvd, D}, s.scale);
    add(p + "self_attn.v_proj.weight", {kvd, D}, s.scale);
    add(p + "self_attn.o_proj.weight", {D, qd}, s.scale);
    add(p + "self_attn.q_norm.weight", {s.head_dim}, s.qk_norm_jitter);
    add(p + "self_attn.k_norm.weight", {s.head_dim}, s.qk_norm_jitter);
    add(p + "mlp.gate_proj.weight", {s.inter, D}, s.scale);
    add(p + "mlp.up_proj.weight", {s.inter, D}, s.scale);
    add(p + "mlp.down_proj.weight", {D, s.inter}, s.scale);
  }
  add(pre + "norm.weight", {D}, s.norm_jitter);
  if (s.family == "gemma3") {
    const std::string mm = s.language_prefix == "model.language_model." ? "model." : "";
    add(mm + "vision_tower.vision_model.embeddings.patch_embedding.weight", {16, 3, 2, 2}, s.scale);
    add(mm + "vision_tower.vision_model.post_layernorm.weight", {16}, s.norm_jitter, 1.0);
    add(mm + "multi_modal_projector.mm_input_projection_weight", {16, D}, s.scale);
    add(mm + "multi_modal_projector.mm_soft_emb_norm.weight", {16}, s.norm_jitter);
  }
}

// Qwen3.5 (modeling_qwen3_5.py / modular_qwen3_5_moe.py names) under model.language_model.: per
// layer input_layernorm and post_attention_layernorm (offsets w: the norm scales by 1 + w), then
// either self_attn (q_proj [H·hd·2, D] with per-head [query | gate] rows, k/v_proj, o_proj, q_norm /
// k_norm [hd] as offsets; no biases) or linear_attn (in_proj_qkv [2·Hk·dk + Hv·dv, D] (rows q, k,
// v), in_proj_z [Hv·dv, D], in_proj_b / in_proj_a [Hv, D], conv1d.weight [conv_dim, 1, K], dt_bias
// [Hv], A_log [Hv], norm.weight [dv] (plain w, near 1), out_proj [D, Hv·dv]); the dense MLP or the
// MoE block (see Spec); the final norm (offset). Then the tensors a reader must ignore: a few
// model.visual.* and an MTP layer (mtp.*, its experts under per-expert keys as the hub ships them);
// lm_head (unless tied) last. Every tensor draws from the generator in the same order under every
// layout option, so one seed gives the same values under any of them.
template <typename Add, typename Split, typename Overlap>
void make_qwen3_5_weights(const Spec& s, Add& add, Split& split_experts, Overlap& overlap_qk) {
  const int64_t D = s.hidden, H = s.heads, hd = s.head_dim, qd = H * hd, kvd = int64_t(s.kv_heads) * hd;
  const int64_t Kd = int64_t(s.lin_k_heads) * s.lin_k_dim, Vd = int64_t(s.lin_v_heads) * s.lin_v_dim;
  const int64_t Hv = s.lin_v_heads;
  const int64_t E = s.experts, I = s.moe_inter, Is = s.shared_inter > 0 ? s.shared_inter : s.moe_inter;
  const bool moe = s.family == "qwen3_5_moe";
  const std::string pre = "model.language_model.";
  add(pre + "embed_tokens.weight", {s.vocab, D}, s.embed_scale);
  for (int l = 0; l < s.layers; ++l) {
    const std::string p = pre + "layers." + std::to_string(l) + ".";
    add(p + "input_layernorm.weight", {D}, s.norm_jitter);
    add(p + "post_attention_layernorm.weight", {D}, s.norm_jitter);
    if (s.layer_type(l) == "full_attention") {
      add(p + "self_attn.q_proj.weight", {2 * qd, D}, s.scale);
      add(p + "self_attn.k_proj.weight", {kvd, D}, s.scale);
      add(p + "self_attn.v_proj.weight", {kvd, D}, s.scale);
      add(p + "self_attn.o_proj.weight", {D, qd}, s.scale);
      add(p + "self_attn.q_norm.weight", {hd}, s.qk_norm_jitter);
      add(p + "self_attn.k_norm.weight", {hd}, s.qk_norm_jitter);
    } else {
      const std::string a = p + "linear_attn.";
      add(a + "in_proj_qkv.weight", {2 * Kd + Vd, D}, s.scale);
      add(a + "in_proj_z.weight", {Vd, D}, s.scale);
      add(a + "in_proj_b.weight", {Hv, D}, s.scale);
      add(a + "in_proj_a.weight", {Hv, D}, s.proj_a_scale);
      add(a + "conv1d.weight", {2 * Kd + Vd, 1, s.conv_kernel}, s.conv_scale);
      add(a + "dt_bias", {Hv}, s.dt_bias_scale);
      add(a + "A_log", {Hv}, s.a_log_jitter, s.a_log_center);
      add(a + "norm.weight", {s.lin_v_dim}, s.lin_norm_jitter, 1.0);
      add(a + "out_proj.weight", {D, Vd}, s.scale);
      if (s.lin_qk_overlap > 0) overlap_qk(a, Kd, D);
    }
    if (!moe) {
      add(p + "mlp.gate_proj.weight", {s.inter, D}, s.scale);
      add(p + "mlp.up_proj.weight", {s.inter, D}, s.scale);
      add(p + "mlp.down_proj.weight", {D, s.inter}, s.scale);
      continue;
    }
    add(p + "mlp.gate.weight", {E, D}, s.router_scale);
    add(p + "mlp.experts.gate_up_proj", {E, 2 * I, D}, s.scale);
    add(p + "mlp.experts.down_proj", {E, D, I}, s.scale);
    if (s.per_expert_keys) split_experts(p + "mlp.experts.", E, I, D);
    add(p + "mlp.shared_expert.gate_proj.weight", {Is, D}, s.scale);
    add(p + "mlp.shared_expert.up_proj.weight", {Is, D}, s.scale);
    add(p + "mlp.shared_expert.down_proj.weight", {D, Is}, s.scale);
    add(p + "mlp.shared_expert_gate.weight", {1, D}, s.scale);
  }
  add(pre + "norm.weight", {D}, s.norm_jitter);
  add("model.visual.patch_embed.proj.weight", {16, 3, 2, 2, 2}, s.scale);
  add("model.visual.blocks.0.attn.qkv.weight", {48, 16}, s.scale);
  add("model.visual.merger.linear_fc1.weight", {64, 64}, s.scale);
  add("model.visual.merger.linear_fc2.weight", {D, 64}, s.scale);
  add("mtp.fc.weight", {D, 2 * D}, s.scale);
  add("mtp.pre_fc_norm_embedding.weight", {D}, s.norm_jitter);
  add("mtp.pre_fc_norm_hidden.weight", {D}, s.norm_jitter);
  add("mtp.norm.weight", {D}, s.norm_jitter);
  add("mtp.layers.0.input_layernorm.weight", {D}, s.norm_jitter);
  add("mtp.layers.0.self_attn.q_proj.weight", {2 * qd, D}, s.scale);
  add("mtp.layers.0.self_attn.k_proj.weight", {kvd, D}, s.scale);
  if (moe) {
    add("mtp.layers.0.mlp.gate.weight", {E, D}, s.router_scale);
    add("mtp.layers.0.mlp.experts.0.gate_proj.weight", {I, D}, s.scale);
    add("mtp.layers.0.mlp.experts.0.down_proj.weight", {D, I}, s.scale);
  } else {
    add("mtp.layers.0.mlp.gate_proj.weight", {s.inter, D}, s.scale);
  }
  if (!s.tied) add("lm_head.weight", {s.vocab, D}, s.scale);  // last: tying changes no other value
}

inline void quantize_mxfp4(TensorMap& m, const std::string& name);
inline TensorMap make_qwen3_next_weights(const Spec& s);

inline TensorMap make_weights(const Spec& s) {
  if (s.qwen3_next()) return make_qwen3_next_weights(s);
  std::mt19937_64 rng(s.seed);
  std::normal_distribution<double> g(0.0, 1.0);
  TensorMap m;
  auto add = [&](const std::string& name, std::vector<int64_t> shape, double scale, double offset = 0.0) {
    int64_t n = 1;
    for (auto d : shape) n *= d;
    Tensor t;
    t.shape = std::move(shape);
    t.v.resize(static_cast<size_t>(n));
    for (auto& x : t.v) x = bf16_round(offset + scale * g(rng));
    m[name] = std::move(t);
  };
  const int64_t D = s.hidden, qd = int64_t(s.heads) * s.head_dim, kvd = int64_t(s.kv_heads) * s.head_dim;
  if (s.glm()) {
    make_glm_weights(s, add);
    return m;
  }
  if (s.deepseek()) {
    make_deepseek_weights(s, add);
    return m;
  }
  if (s.glm4_moe()) {
    make_glm4_moe_weights(s, add);
    return m;
  }
  if (s.gemma3()) {
    make_gemma3_weights(s, add);
    return m;
  }
  if (s.qwen3_5()) {
    // Per-expert keys: the fused [E, 2I, D] / [E, D, I] values re-filed as experts.{e}.gate_proj
    // (rows 0..I-1 of gate_up), up_proj (rows I..2I-1) and down_proj.
    auto split = [&](const std::string& x, int64_t E, int64_t I, int64_t Dm) {
      const Tensor gu = m.at(x + "gate_up_proj"), dn = m.at(x + "down_proj");
      m.erase(x + "gate_up_proj");
      m.erase(x + "down_proj");
      for (int64_t e = 0; e < E; ++e) {
        const std::string q = x + std::to_string(e) + ".";
        Tensor g, u, d;
        g.shape = u.shape = {I, Dm};
        d.shape = {Dm, I};
        const auto at = gu.v.begin() + ptrdiff_t(e * 2 * I * Dm);
        g.v.assign(at, at + ptrdiff_t(I * Dm));
        u.v.assign(at + ptrdiff_t(I * Dm), at + ptrdiff_t(2 * I * Dm));
        d.v.assign(dn.v.begin() + ptrdiff_t(e * Dm * I), dn.v.begin() + ptrdiff_t((e + 1) * Dm * I));
        m[q + "gate_proj.weight"] = std::move(g);
        m[q + "up_proj.weight"] = std::move(u);
        m[q + "down_proj.weight"] = std::move(d);
      }
    };
    auto overlap = [&](const std::string& a, int64_t Kd, int64_t Dm) {
      const double c = s.lin_qk_overlap, r = std::sqrt(1 - c * c);
      Tensor& qkv = m.at(a + "in_proj_qkv.weight");
      Tensor& conv = m.at(a + "conv1d.weight");
      const int64_t K = s.conv_kernel;
      for (int64_t i = 0; i < Kd; ++i) {
        for (int64_t d = 0; d < Dm; ++d) {
          double& q = qkv.v[size_t(i * Dm + d)];
          q = bf16_round(c * qkv.v[size_t((Kd + i) * Dm + d)] + r * q);
        }
        for (int64_t j = 0; j < K; ++j) {
          double& q = conv.v[size_t(i * K + j)];
          q = bf16_round(c * conv.v[size_t((Kd + i) * K + j)] + r * q);
        }
      }
    };
    make_qwen3_5_weights(s, add, split, overlap);
    return m;
  }
  if (s.gpt_oss()) {
    make_gpt_oss_weights(s, add);
    for (int l = 0; l < s.layers; ++l)
      for (const char* x : {"gate_up_proj", "down_proj"})
        quantize_mxfp4(m, "model.layers." + std::to_string(l) + ".mlp.experts." + x);
    return m;
  }
  add("model.embed_tokens.weight", {s.vocab, D}, s.embed_scale);
  for (int l = 0; l < s.layers; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    add(p + "input_layernorm.weight", {D}, s.norm_jitter, 1.0);
    add(p + "post_attention_layernorm.weight", {D}, s.norm_jitter, 1.0);
    add(p + "self_attn.q_proj.weight", {qd, D}, s.scale);
    add(p + "self_attn.k_proj.weight", {kvd, D}, s.scale);
    add(p + "self_attn.v_proj.weight", {kvd, D}, s.scale);
    add(p + "self_attn.o_proj.weight", {D, qd}, s.scale);
    if (s.family == "qwen2") {
      add(p + "self_attn.q_proj.bias", {qd}, s.scale);
      add(p + "self_attn.k_proj.bias", {kvd}, s.scale);
      add(p + "self_attn.v_proj.bias", {kvd}, s.scale);
    }
    if (s.qk_norm()) {
      // Far from 1 so that skipping the norm changes the logits clearly.
      add(p + "self_attn.q_norm.weight", {s.head_dim}, s.qk_norm_jitter, 1.0);
      add(p + "self_attn.k_norm.weight", {s.head_dim}, s.qk_norm_jitter, 1.0);
    }
    if (s.is_moe_layer(l)) {
      add(router_tensor_name(s, l), {s.experts, D}, s.router_scale);
      const int64_t Ie = s.family == "mixtral" ? s.inter : s.moe_inter;
      for (int e = 0; e < s.experts; ++e) {
        const auto n = expert_tensor_names(s, l, e);
        add(n[0], {Ie, D}, s.scale);
        add(n[1], {Ie, D}, s.scale);
        add(n[2], {D, Ie}, s.scale);
      }
    } else {
      add(p + "mlp.gate_proj.weight", {s.inter, D}, s.scale);
      add(p + "mlp.up_proj.weight", {s.inter, D}, s.scale);
      add(p + "mlp.down_proj.weight", {D, s.inter}, s.scale);
    }
  }
  add("model.norm.weight", {D}, s.norm_jitter, 1.0);
  if (!s.tied) add("lm_head.weight", {s.vocab, D}, s.scale);
  return m;
}

// Qwen3-Next's fused Gated DeltaNet projections (modeling_qwen3_next.py fix_query_key_value_ordering)
// from Qwen3.5's separate ones: in_proj_qkv [2·Hk·dk + Hv·dv, D] (rows: all q heads, all k heads, all
// v heads) and in_proj_z [Hv·dv, D] become in_proj_qkvz [Hk·(2·dk + 2·r·dv), D], r = Hv / Hk, whose
// rows per key head h are [q_h (dk) | k_h (dk) | v of value heads h·r .. h·r + r − 1 (r·dv) | z of
// the same heads (r·dv)]; in_proj_b / in_proj_a [Hv, D] become in_proj_ba [2·Hv, D], per key head h
// [b of heads h·r .. h·r + r − 1 | a of the same heads]. Whole rows move; the values are unchanged.
inline Tensor group_qkvz(const Tensor& qkv, const Tensor& z, int Hk, int Hv, int dk, int dv) {
  const int64_t D = qkv.shape.at(1), r = Hv / Hk, Kd = int64_t(Hk) * dk;
  if (Hv % Hk || qkv.shape[0] != 2 * Kd + int64_t(Hv) * dv || z.shape.at(0) != int64_t(Hv) * dv || z.shape[1] != D)
    throw std::invalid_argument("group_qkvz: shapes");
  Tensor out;
  out.shape = {qkv.shape[0] + z.shape[0], D};
  out.v.reserve(size_t(out.shape[0] * D));
  auto rows = [&](const Tensor& t, int64_t row0, int64_t n) {
    out.v.insert(out.v.end(), t.v.begin() + ptrdiff_t(row0 * D), t.v.begin() + ptrdiff_t((row0 + n) * D));
  };
  for (int64_t h = 0; h < Hk; ++h) {
    rows(qkv, h * dk, dk);                      // q_h
    rows(qkv, Kd + h * dk, dk);                 // k_h
    rows(qkv, 2 * Kd + h * r * dv, r * dv);     // v of heads h·r ...
    rows(z, h * r * dv, r * dv);                // z of heads h·r ...
  }
  return out;
}
inline Tensor group_ba(const Tensor& b, const Tensor& a, int Hk, int Hv) {
  const int64_t D = b.shape.at(1), r = Hv / Hk;
  if (Hv % Hk || b.shape[0] != Hv || a.shape.at(0) != Hv || a.shape[1] != D)
    throw std::invalid_argument("group_ba: shapes");
  Tensor out;
  out.shape = {2 * int64_t(Hv), D};
  for (int64_t h = 0; h < Hk; ++h)
    for (const Tensor* t : {&b, &a})
      out.v.insert(out.v.end(), t->v.begin() + ptrdiff_t(h * r * D), t->v.begin() + ptrdiff_t((h + 1) * r * D));
  return out;
}

// Qwen3-Next's tensors (see Spec): the qwen3_5_moe writer's checkpoint of the same spec with
// per-expert keys, model.language_model. renamed model., model.visual.* dropped (mtp.* kept, to be
// ignored), each DeltaNet layer's in_proj_qkv / in_proj_z / in_proj_b / in_proj_a regrouped into
// in_proj_qkvz / in_proj_ba, and on each dense layer (Spec::is_moe_layer false) the MoE tensors
// replaced by mlp.{gate,up,down}_proj.weight ([inter, D], [inter, D], [D, inter]; N(0, scale) from a
// generator of its own, drawn in layer order).
inline TensorMap make_qwen3_next_weights(const Spec& s) {
  Spec b = s;
  b.family = "qwen3_5_moe";
  b.per_expert_keys = true;
  const TensorMap src = make_weights(b);
  const std::string from = "model.language_model.";
  TensorMap m;
  for (const auto& [name, t] : src) {
    if (name.rfind("model.visual.", 0) == 0) continue;
    m[name.rfind(from, 0) == 0 ? "model." + name.substr(from.size()) : name] = t;
  }
  std::mt19937_64 rng(uint64_t(s.seed) * 0x9E3779B97F4A7C15ull + 0x3E7);
  std::normal_distribution<double> g(0.0, 1.0);
  const int64_t D = s.hidden;
  for (int l = 0; l < s.layers; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    if (s.layer_type(l) == "linear_attention") {
      const std::string a = p + "linear_attn.";
      m[a + "in_proj_qkvz.weight"] =
          group_qkvz(m.at(a + "in_proj_qkv.weight"), m.at(a + "in_proj_z.weight"), s.lin_k_heads, s.lin_v_heads,
                     s.lin_k_dim, s.lin_v_dim);
      m[a + "in_proj_ba.weight"] = group_ba(m.at(a + "in_proj_b.weight"), m.at(a + "in_proj_a.weight"), s.lin_k_heads,
                                            s.lin_v_heads);
      for (const char* n : {"in_proj_qkv.weight", "in_proj_z.weight", "in_proj_b.weight", "in_proj_a.weight"})
        m.erase(a + n);
    }
    if (s.is_moe_layer(l)) continue;
    for (auto it = m.begin(); it != m.end();)
      it = it->first.rfind(p + "mlp.", 0) == 0 ? m.erase(it) : std::next(it);
    for (const char* n : {"gate_proj", "up_proj", "down_proj"}) {
      Tensor t;
      t.shape = std::string(n) == "down_proj" ? std::vector<int64_t>{D, s.inter} : std::vector<int64_t>{s.inter, D};
      t.v.resize(size_t(D * s.inter));
      for (double& x : t.v) x = bf16_round(s.scale * g(rng));
      m[p + "mlp." + n + ".weight"] = std::move(t);
    }
  }
  return m;
}

// ---- quantized checkpoints as they ship (the test's own encoders; the values the reference reads
// are decoded here by the formats' definitions, never by kvq's decoders).

// FP8 E4M3 (e4m3fn): code = s eeee mmm; e = 0 subnormal m/8 · 2^-6, else (1 + m/8) · 2^(e - 7);
// e = 15 with m = 7 is NaN (no infinities).
inline double e4m3_value(uint8_t code) {
  const int sgn = code >> 7, e = (code >> 3) & 0xF, m = code & 7;
  if (e == 15 && m == 7) return std::nan("");
  const double mag = e == 0 ? std::ldexp(m / 8.0, -6) : std::ldexp(1.0 + m / 8.0, e - 7);
  return sgn ? -mag : mag;
}
// The nearest finite E4M3 code to x (|x| <= 448), by search over every code.
inline uint8_t e4m3_nearest(double x) {
  uint8_t best = 0;
  double err = std::numeric_limits<double>::infinity();
  for (int c = 0; c < 256; ++c) {
    const double v = e4m3_value(uint8_t(c));
    if (std::isnan(v)) continue;
    if (std::abs(v - x) < err) err = std::abs(v - x), best = uint8_t(c);
  }
  return best;
}

// DeepSeek-V3's FP8 blocks: every tensor `pick` selects ([out, in]) becomes F8_E4M3 codes with
// X_scale_inv F32 [ceil(out/bo), ceil(in/bi)], S = amax(block) / 448, W = e4m3(code) · S (partial
// blocks at the edges). The tensor's v becomes that dequantized value.
template <class Pick>
void quantize_fp8_blocks(TensorMap& m, int64_t bo, int64_t bi, const Pick& pick) {
  std::vector<std::string> names;
  for (const auto& [name, t] : m)
    if (t.shape.size() == 2 && pick(name)) names.push_back(name);
  for (const std::string& name : names) {
    Tensor& t = m[name];
    const int64_t out = t.shape[0], in = t.shape[1], ro = (out + bo - 1) / bo, ri = (in + bi - 1) / bi;
    Tensor sc;
    sc.shape = {ro, ri};
    sc.dtype = "F32";
    sc.v.assign(size_t(ro * ri), 0.0);
    t.raw.assign(size_t(out * in), 0);
    for (int64_t a = 0; a < ro; ++a)
      for (int64_t b = 0; b < ri; ++b) {
        double amax = 0;
        for (int64_t i = a * bo; i < std::min(out, (a + 1) * bo); ++i)
          for (int64_t j = b * bi; j < std::min(in, (b + 1) * bi); ++j) amax = std::max(amax, std::abs(t.v[size_t(i * in + j)]));
        const double S = double(float(amax > 0 ? amax / 448.0 : 1.0));  // stored as F32
        sc.v[size_t(a * ri + b)] = S;
        for (int64_t i = a * bo; i < std::min(out, (a + 1) * bo); ++i)
          for (int64_t j = b * bi; j < std::min(in, (b + 1) * bi); ++j) {
            const size_t k = size_t(i * in + j);
            t.raw[k] = e4m3_nearest(t.v[k] / S);
            t.v[k] = e4m3_value(t.raw[k]) * S;
          }
      }
    t.dtype = "F8_E4M3";
    m[name + "_scale_inv"] = std::move(sc);
  }
}

// compressed-tensors "pack-quantized" symmetric INT4 (Kimi-K2-Thinking's routed experts): every
// tensor `pick` selects ([out, in]) is stored as X_packed I32 [out, ceil(in/8)] (element j in nibble
// j % 8 of word j / 8, as q + 8), X_scale BF16 [out, ceil(in/group)] (amax / 7, rounded to BF16)
// and X_shape I32 [2]; W = q · scale with q = clamp(round(w / scale), -8, 7). The logical X keeps
// the dequantized v and is not written.
template <class Pick>
void quantize_int4_packed(TensorMap& m, int64_t group, const Pick& pick) {
  std::vector<std::string> names;
  for (const auto& [name, t] : m)
    if (t.shape.size() == 2 && t.write && pick(name)) names.push_back(name);
  auto i32 = [](std::vector<uint8_t>& raw, size_t at, int32_t v) {
    for (int b = 0; b < 4; ++b) raw[at * 4 + size_t(b)] = uint8_t((uint32_t(v) >> (8 * b)) & 0xFF);
  };
  for (const std::string& name : names) {
    Tensor& t = m[name];
    const int64_t out = t.shape[0], in = t.shape[1], words = (in + 7) / 8, ng = (in + group - 1) / group;
    Tensor packed, sc, shape;
    packed.shape = {out, words};
    packed.dtype = "I32";
    packed.raw.assign(size_t(out * words * 4), 0);
    sc.shape = {out, ng};
    sc.v.assign(size_t(out * ng), 0.0);
    shape.shape = {2};
    shape.dtype = "I32";
    shape.raw.assign(8, 0);
    i32(shape.raw, 0, int32_t(out));
    i32(shape.raw, 1, int32_t(in));
    for (int64_t i = 0; i < out; ++i)
      for (int64_t g = 0; g < ng; ++g) {
        double amax = 0;
        for (int64_t j = g * group; j < std::min(in, (g + 1) * group); ++j) amax = std::max(amax, std::abs(t.v[size_t(i * in + j)]));
        const double S = bf16_round(amax > 0 ? amax / 7.0 : 1.0);
        sc.v[size_t(i * ng + g)] = S;
        for (int64_t j = g * group; j < std::min(in, (g + 1) * group); ++j) {
          const size_t k = size_t(i * in + j);
          const int q = int(std::clamp(std::nearbyint(t.v[k] / S), -8.0, 7.0));
          const size_t byte = size_t((i * words + j / 8) * 4 + (j % 8) / 2);
          packed.raw[byte] |= uint8_t((q + 8) << (4 * (j % 2)));
          t.v[k] = q * S;
        }
      }
    t.write = false;
    m[name + "_packed"] = std::move(packed);
    m[name + "_scale"] = std::move(sc);
    m[name + "_shape"] = std::move(shape);
  }
}

// MXFP4 (gpt-oss; OCP microscaling FP4), from MODEL-FAMILIES-2026.md §3.4: groups of 32 along
// the input dim share one E8M0 scale byte u (2^(u - 127)); each element is an FP4 E2M1 code (sign
// bit 3), two per byte, the even element in the LOW nibble.
inline double fp4_value(int code) {
  static constexpr double kMag[8] = {0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0};
  return (code & 8) ? -kMag[code & 7] : kMag[code & 7];
}
// The nearest E2M1 code to x (|x| <= 6 after scaling); a tie goes to the smaller magnitude.
inline uint8_t fp4_nearest(double x) {
  int best = 0;
  for (int c = 1; c < 8; ++c)
    if (std::abs(std::abs(x) - fp4_value(c)) < std::abs(std::abs(x) - fp4_value(best))) best = c;
  return uint8_t(best | (x < 0 ? 8 : 0));
}
// Encodes w [rows, cols] (cols % 32 == 0) as blocks [rows, cols/32, 16] and scales [rows, cols/32]:
// the scale is the least power of two 2^e with amax / 2^e <= 6 (an all-zero group: e = 0), each
// element the nearest code of w / 2^e.
inline void mxfp4_encode(const double* w, int64_t rows, int64_t cols, uint8_t* blocks, uint8_t* scales) {
  if (cols % 32) throw std::invalid_argument("mxfp4: the input dim must be a multiple of 32");
  const int64_t ng = cols / 32;
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t g = 0; g < ng; ++g) {
      const double* x = w + r * cols + g * 32;
      double amax = 0;
      for (int t = 0; t < 32; ++t) amax = std::max(amax, std::abs(x[t]));
      int e = 0;
      if (amax > 0) {
        e = int(std::ceil(std::log2(amax / 6.0)));
        while (amax > std::ldexp(6.0, e)) ++e;  // log2 rounding
        while (amax <= std::ldexp(6.0, e - 1)) --e;
      }
      e = std::clamp(e, -127, 127);
      scales[r * ng + g] = uint8_t(e + 127);
      uint8_t* b = blocks + (r * ng + g) * 16;
      for (int t = 0; t < 16; ++t)
        b[t] = uint8_t(fp4_nearest(std::ldexp(x[2 * t], -e)) | (fp4_nearest(std::ldexp(x[2 * t + 1], -e)) << 4));
    }
}
// Decodes blocks/scales back to w [rows, cols]; high_first reads the HIGH nibble as the even
// element (the wrong order: a negative control).
inline void mxfp4_decode(const uint8_t* blocks, const uint8_t* scales, int64_t rows, int64_t cols, double* w,
                         bool high_first = false) {
  const int64_t ng = cols / 32;
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) {
      const int64_t g = c / 32, t = c % 32;
      const uint8_t byte = blocks[(r * ng + g) * 16 + t / 2];
      const bool low = (t % 2 == 0) != high_first;
      const int nib = low ? (byte & 0x0F) : (byte >> 4);
      w[r * cols + c] = std::ldexp(fp4_value(nib), int(scales[r * ng + g]) - 127);
    }
}
// Ships the logical tensor `name` [E, out, in] as name_blocks U8 [E, out, in/32, 16] and
// name_scales U8 [E, out, in/32]; the logical tensor keeps the decoded values (what the reference
// reads) and is not written.
inline void quantize_mxfp4(TensorMap& m, const std::string& name) {
  Tensor& t = m.at(name);
  const int64_t E = t.shape[0], out = t.shape[1], in = t.shape[2], ng = in / 32;
  Tensor blocks, scales;
  blocks.dtype = scales.dtype = "U8";
  blocks.shape = {E, out, ng, 16};
  scales.shape = {E, out, ng};
  blocks.raw.assign(size_t(E * out * ng * 16), 0);
  scales.raw.assign(size_t(E * out * ng), 0);
  mxfp4_encode(t.v.data(), E * out, in, blocks.raw.data(), scales.raw.data());
  mxfp4_decode(blocks.raw.data(), scales.raw.data(), E * out, in, t.v.data());
  t.write = false;
  m[name + "_blocks"] = std::move(blocks);
  m[name + "_scales"] = std::move(scales);
}

// The bytes a tensor is written as.
inline std::string tensor_bytes(const Tensor& t) {
  if (t.dtype == "BF16") {
    std::string bytes(t.v.size() * 2, '\0');
    for (size_t j = 0; j < t.v.size(); ++j) {
      const uint16_t h = f32_to_bf16(float(t.v[j]));
      bytes[2 * j] = char(h & 0xff);
      bytes[2 * j + 1] = char(h >> 8);
    }
    return bytes;
  }
  if (t.dtype == "F32") {
    std::string bytes(t.v.size() * 4, '\0');
    for (size_t j = 0; j < t.v.size(); ++j) {
      const float f = float(t.v[j]);
      std::memcpy(&bytes[4 * j], &f, 4);
    }
    return bytes;
  }
  return std::string(t.raw.begin(), t.raw.end());
}

inline void write_file(const std::string& path, const std::string& bytes) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f.write(bytes.data(), std::streamsize(bytes.size()));
  if (!f.good()) throw std::runtime_error("cannot write " + path);
}

// BF16 safetensors over n_shards files (round-robin in name order) plus the index; n_shards <= 1
// writes a single model.safetensors.
inline void write_weights(const std::string& dir, const TensorMap& tensors, int n_shards) {
  using nlohmann::json;
  const int n = std::max(1, n_shards);
  std::vector<json> headers(static_cast<size_t>(n), json::object());
  std::vector<std::string> data(static_cast<size_t>(n));
  std::vector<std::string> names(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) {
    char buf[64];
    std::snprintf(buf, sizeof buf, "model-%05d-of-%05d.safetensors", i + 1, n);
    names[size_t(i)] = n == 1 ? "model.safetensors" : buf;
  }
  json weight_map = json::object();
  int k = 0;
  uint64_t total = 0;
  for (const auto& [name, t] : tensors) {
    if (!t.write) continue;
    const size_t i = size_t(k++ % n);
    const std::string bytes = tensor_bytes(t);
    total += bytes.size();
    headers[i][name] = {{"dtype", t.dtype}, {"shape", t.shape}, {"data_offsets", {data[i].size(), data[i].size() + bytes.size()}}};
    data[i] += bytes;
    weight_map[name] = names[i];
  }
  for (size_t i = 0; i < size_t(n); ++i) {
    headers[i]["__metadata__"] = {{"format", "pt"}};
    const std::string h = headers[i].dump();
    std::string out(8, '\0');
    for (int b = 0; b < 8; ++b) out[size_t(b)] = char((uint64_t(h.size()) >> (8 * b)) & 0xff);
    write_file(dir + "/" + names[i], out + h + data[i]);
  }
  if (n > 1) {
    write_file(dir + "/model.safetensors.index.json",
               json{{"metadata", {{"total_size", total}}}, {"weight_map", weight_map}}.dump(2));
  }
}

inline void write_model(const std::string& dir, const nlohmann::json& config, const TensorMap& tensors,
                        int n_shards = 2) {
  std::filesystem::create_directories(dir);
  write_file(dir + "/config.json", config.dump(2));
  write_weights(dir, tensors, n_shards);
}

}  // namespace kvq::test::hf
