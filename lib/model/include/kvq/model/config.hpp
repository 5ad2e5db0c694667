#pragma once
// Model hyper-parameters as read from config.json or a llama2.c header. No LibTorch here: the
// statistics, allocation and codec libraries use this header without linking the forward.
#include <cstdint>
#include <string>
#include <vector>

#include "kvq/format/rope.hpp"

namespace kvq {

// RoPE scaling as config.json's `rope_scaling` (or transformers-5 `rope_parameters`) states it.
// Written to disk by name (calibration provenance `rope_type`): never rename.
enum class RopeType : uint32_t { kDefault = 0, kLinear = 1, kDynamic = 2, kLlama3 = 3, kYarn = 4 };
const char* to_string(RopeType t);
RopeType rope_type_from_string(const std::string& s);  // throws kvq::Error

struct RopeScaling {
  RopeType type = RopeType::kDefault;
  double factor = 1.0;
  // llama3
  double low_freq_factor = 1.0, high_freq_factor = 4.0;
  int original_max_position_embeddings = 0;  // llama3 (required), yarn (0: max_position_embeddings)
  // yarn
  double beta_fast = 32.0, beta_slow = 1.0;
  double mscale = 0.0, mscale_all_dim = 0.0;  // 0: not given
  double attention_factor = 0.0;              // 0: not given (derived from factor/mscale)
  bool truncate = true;
};

// The RoPE of one sequence: the per-block inverse frequencies (block i turns by pos * inv_freq[i])
// and the factor cos/sin are multiplied by (YaRN; 1 otherwise, so q.k logits scale by its square).
struct RopeParams {
  std::vector<double> inv_freq;  // [rotary_dim / 2]
  double attention_factor = 1.0;
};

struct ModelConfig {
  // HF model_type (llama, mistral, qwen2, qwen3, qwen3_moe, mixtral, chatglm, glm, glm4) or "llama2c".
  // The GLM-4 forms share one forward: partial interleaved RoPE, q/k/v bias, fused gate|up.
  std::string architecture;
  int hidden_size = 0;
  int n_layers = 0;
  int n_heads = 0;
  int n_kv_heads = 0;
  int head_dim = 0;      // query and key dim (MLA served form: 64 rotary + kv_lora_rank latent)
  int head_dim_v = 0;    // value dim when it differs from head_dim (MLA: kv_lora_rank); 0: head_dim
  double softmax_scale = 0.0;  // logit scale when it is not 1/sqrt(head_dim) (MLA); 0: 1/sqrt(head_dim)
  int intermediate_size = 0;
  int vocab_size = 0;
  int max_seq_len = 0;
  double rope_theta = 10000.0;
  RopeScaling rope_scaling;
  int rotary_dim = 0;  // d_r <= head_dim (partial rotary); dims >= d_r are not rotated
  RopePairing pairing = RopePairing::kSplitHalf;
  double rms_norm_eps = 1e-5;
  bool tie_word_embeddings = false;
  bool qkv_bias = false;  // Qwen2; Llama with attention_bias
  bool o_bias = false;    // Llama with attention_bias
  int sliding_window = 0;  // > 0: the checkpoint's attention window (per layer: layer_window)
  int bos_id = 1;
  int eos_id = 2;

  // --- Architecture features (Qwen3 q/k norm, MoE MLP, per-layer sliding window) ---
  // Qwen3 / Qwen3-MoE: RMSNorm over head_dim (one [head_dim] weight shared by the heads, eps
  // rms_norm_eps) on q and k after the projection and before RoPE; captured q/k are the normed ones.
  bool qk_norm = false;
  // GLM-4-0414 (glm4): RMSNorm (eps rms_norm_eps) on the attention and the MLP outputs before each
  // residual add ("sandwich" norms: post_self_attn_layernorm, post_mlp_layernorm).
  bool sandwich_norm = false;
  // [n_layers] or empty (full causal attention everywhere). W > 0: query i sees keys j with
  // i - W < j <= i (HF's `sliding_window`: the W most recent tokens, itself included); 0: full.
  std::vector<int> layer_window;
  // Mixture of experts (Qwen3-MoE, Mixtral). n_experts == 0: dense SwiGLU MLP everywhere.
  int n_experts = 0;              // num_experts / num_local_experts
  int n_experts_per_tok = 0;      // top-k
  int moe_intermediate_size = 0;  // each expert's SwiGLU width (Mixtral: intermediate_size)
  bool norm_topk_prob = false;    // renormalise the kept top-k probabilities (Mixtral: always)
  std::vector<uint8_t> layer_moe;  // [decoder_layers()] or empty: 1 = MoE MLP, 0 = dense (intermediate_size)

  // --- DeepSeek-V2 (deepseek_v2): multi-head latent attention and DeepSeekMoE ---
  // MLA (kv_lora_rank > 0) is computed in its served (absorbed) form: one KV head whose key row is
  // [k_pe (qk_rope_head_dim, pre-RoPE), RMS(c) (kv_lora_rank)] and whose value row is RMS(c); query
  // head h is [q_pe_h, W_UK,h^T q_nope_h]. So head_dim = qk_rope + kv_lora_rank, head_dim_v =
  // kv_lora_rank, rotary_dim = qk_rope (the rotary dims come first), n_kv_heads = 1, and the
  // attention output per head (kv_lora_rank) goes through W_UV,h (v_head_dim) before o_proj.
  int q_lora_rank = 0;  // 0: q_proj; else q_a_proj -> q_a_layernorm -> q_b_proj
  int kv_lora_rank = 0;
  int qk_nope_head_dim = 0, qk_rope_head_dim = 0, v_head_dim = 0;
  // DeepSeekMoE: a shared SwiGLU of width n_shared_experts * moe_intermediate_size beside the routed
  // experts; routed weights x routed_scaling_factor when not renormalised; group_limited_greedy
  // keeps the topk_group best of n_group contiguous expert groups (by their best probability).
  int n_shared_experts = 0;
  double routed_scaling_factor = 1.0;
  int n_group = 0, topk_group = 0;  // 0: plain greedy top-k

  // --- gpt-oss (gpt_oss): attention sinks and its experts ---
  // One learned logit per query head (LayerWeights::sinks) joins each softmax's denominator; it has
  // no value, so a row's probabilities sum to < 1.
  bool attn_sinks = false;
  // > 0: gpt-oss's router and experts. Router logits W x + b, the top-k logits softmaxed among
  // themselves; expert e: h = W_gu x + b_gu with gate = h[0::2], up = h[1::2] (interleaved rows),
  // gate = min(gate, limit), up = clamp(up, -limit, limit), act = gate * sigmoid(1.702 gate) * (up + 1),
  // y = W_d act + b_d (the bias inside the weighted sum).
  double swiglu_limit = 0.0;

  // --- Gemma 3 (gemma3, gemma3_text) ---
  // > 0: the sliding-window layers rotate with the default RoPE at this base (rope_local_base_freq),
  // unscaled; the full layers with rope_theta and rope_scaling.
  double rope_local_theta = 0.0;
  // The dense MLP is GeGLU with the tanh GELU (hidden_activation gelu_pytorch_tanh), not SwiGLU.
  bool gelu_tanh_mlp = false;
  // > 0: the embedding rows are multiplied by it (Gemma: sqrt(hidden_size) rounded to BF16).
  double embed_multiplier = 0.0;
  bool local_rope(int layer) const { return rope_local_theta > 0 && window_of(layer) > 0; }

  // --- Qwen3.5 / Qwen3.6 (qwen3_5, qwen3_5_moe): Gated DeltaNet beside gated attention ---
  // kvq's layers are the layers with a KV cache: n_layers counts them, and every per-layer field of
  // the attention (layer_window, sinks, local RoPE, what a capture, an allocation or a K/V hook
  // names "layer l") is indexed by them. A hybrid decoder has more layers, n_decoder_layers, of which
  // attn_layer_index[l] is KV layer l; the others run Gated DeltaNet (a fixed-size state, no K/V per
  // token): the forward runs them exactly, nothing captures, allocates or codes them. The decoder's
  // own per-layer fields (layer_moe, LayerWeights, Model::layer_bytes, forward_from's first layer,
  // ChunkHooks) are indexed by decoder layer. Empty / 0: every decoder layer has a cache (identity).
  int n_decoder_layers = 0;
  std::vector<int> attn_layer_index;
  // q_proj's rows are per head [query (head_dim) | gate (head_dim)]; the attention output is
  // multiplied by sigmoid(gate) before o_proj.
  bool attn_output_gate = false;
  // Gated DeltaNet: Hk q/k heads of dk, Hv value heads of dv (each q/k head serves Hv/Hk consecutive
  // value heads), a causal depthwise conv of conv_kernel taps over [q; k; v].
  int linear_key_heads = 0, linear_value_heads = 0, linear_key_dim = 0, linear_value_dim = 0;
  int linear_conv_kernel = 0;
  // Qwen-MoE's shared expert: a SwiGLU of this width on every token, scaled by sigmoid(g . x) (one
  // gate row, LayerWeights::shared_gate) before it is added. 0: none (DeepSeekMoE's ungated shared
  // experts use n_shared_experts).
  int shared_expert_intermediate_size = 0;

  // Width of the shared experts' SwiGLU (0: none).
  int shared_width() const {
    return shared_expert_intermediate_size > 0 ? shared_expert_intermediate_size : n_shared_experts * moe_intermediate_size;
  }
  int decoder_layers() const { return n_decoder_layers > 0 ? n_decoder_layers : n_layers; }
  // Decoder layer of KV layer l.
  int decoder_index(int l) const { return attn_layer_index.empty() ? l : attn_layer_index[size_t(l)]; }
  // KV layer of decoder layer d, or -1 (a layer without a KV cache).
  int kv_index(int d) const;
  bool hybrid() const { return !attn_layer_index.empty(); }
  int linear_qk_dim() const { return linear_key_heads * linear_key_dim; }   // Kd
  int linear_v_dim() const { return linear_value_heads * linear_value_dim; }  // Vd
  int linear_conv_dim() const { return 2 * linear_qk_dim() + linear_v_dim(); }

  bool is_mla() const { return kv_lora_rank > 0; }

  int window_of(int layer) const { return layer_window.empty() ? 0 : layer_window[size_t(layer)]; }
  bool is_moe_layer(int decoder_layer) const { return !layer_moe.empty() && layer_moe[size_t(decoder_layer)] != 0; }

  int v_dim() const { return head_dim_v > 0 ? head_dim_v : head_dim; }
  double attn_scale() const;  // softmax_scale, else 1/sqrt(head_dim)
  int group_size() const { return n_heads / n_kv_heads; }
  int kv_head_of(int query_head) const { return query_head / group_size(); }
  int n_rope_blocks() const { return head_dim / 2; }  // includes theta=0 pairs past d_r
};

// theta^(-2i/d_r) for i < d_r/2, in double (HF computes it in fp32; kvq keeps double throughout).
std::vector<double> rope_default_inv_freq(double theta, int rotary_dim);
// The RoPE a forward over positions [0, seq_len) uses: the scaled inverse frequencies and attention
// factor of cfg.rope_scaling. Only `dynamic` depends on seq_len (NTK base growth past
// max_seq_len); seq_len <= 0 means max_seq_len.
RopeParams rope_params(const ModelConfig& cfg, int64_t seq_len);
// The RoPE of layer `layer`: rope_params(cfg, seq_len), or on a Gemma 3 local layer
// (cfg.local_rope(layer)) the unscaled default RoPE at cfg.rope_local_theta. layer < 0: the global one.
RopeParams rope_params(const ModelConfig& cfg, int64_t seq_len, int layer);
// Gemma 3's local-layer RoPE: theta^(-2i/d_r) at cfg.rope_local_theta, attention factor 1.
RopeParams local_rope_params(const ModelConfig& cfg);

}  // namespace kvq
