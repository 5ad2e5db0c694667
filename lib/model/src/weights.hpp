#pragma once
// Internal: the weights of a Llama-family decoder and the per-format loaders that fill them. In
// Precision::kBf16 the GEMM weights (the 2-D projections: wqkv, wo, w_gate_up, w_down, experts,
// shared experts, wq_b, embed and lm_head) are BF16; everything else is fp32 in both precisions.
#include <ATen/ATen.h>

#include <atomic>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "kvq/model/config.hpp"
#include "kvq/model/model.hpp"

namespace kvq {

struct LayerWeights {
  at::Tensor attn_norm;  // [D]
  at::Tensor wqkv;       // [(H + 2 Hkv) d, D]: q, k, v projections stacked so one GEMM serves all
  at::Tensor bqkv;       // [(H + 2 Hkv) d] or undefined (no q/k/v bias)
  at::Tensor wo;         // [D, H d]
  at::Tensor bo;         // [D] or undefined
  at::Tensor ffn_norm;   // [D]
  at::Tensor w_gate_up;  // [2 I, D]: gate rows then up rows
  at::Tensor w_down;     // [D, I]
  at::Tensor q_norm, k_norm;  // [head_dim] (Qwen3 q/k RMSNorm) or undefined
  at::Tensor post_attn_norm, post_mlp_norm;  // [D] (GLM-4-0414 sandwich norms) or undefined
  // MoE layers (w_gate_up / w_down undefined): router [E, D]; expert e's [2 I_e, D] and [D, I_e].
  // router_bias [E]: DeepSeek-V3's e_score_correction_bias (its presence selects the noaux_tc
  // router, parts/moe.hpp); undefined for the softmax routers.
  at::Tensor router, router_bias;
  std::vector<at::Tensor> expert_gate_up, expert_down;
  // A streamed MoE layer leaves expert_gate_up / expert_down empty and converts routed expert e
  // from the checkpoint when tokens are routed to it (its stored pages dropped after): one expert
  // in fp32 at a time, not the layer's E (DeepSeek-V3: 256 experts, 45 GB of fp32 a layer).
  std::function<void(int expert, at::Tensor* gate_up, at::Tensor* down)> expert_source;
  // DeepSeek-V2 MLA: wqkv is [q rows; kv_a_proj_with_mqa] (q rows: q_proj's H (nope + rope), or
  // q_a_proj's q_lora_rank followed by q_a_norm [q_lora_rank] and wq_b [H (nope + rope), q_lora_rank]);
  // kv_a_norm [kv_lora_rank]; w_kv_b [H (nope + v), kv_lora_rank] as stored (W_UK,h then W_UV,h per head).
  at::Tensor q_a_norm, wq_b, kv_a_norm, w_kv_b;
  // DeepSeekMoE's shared experts as one SwiGLU: [2 Is, D] and [D, Is] (Is = n_shared * moe_intermediate).
  at::Tensor shared_gate_up, shared_down;
  // gpt-oss: sinks [H] (one logit per query head, in every softmax's denominator); the router's
  // linear bias [E]; the experts' biases [E, 2 I] (interleaved like their rows) and [E, D].
  at::Tensor sinks, router_b, expert_gate_up_b, expert_down_b;
  // Qwen-MoE's shared-expert gate [1, D] (fp32 like the router): the shared SwiGLU's output x sigmoid(g . x).
  at::Tensor shared_gate;
  // Gated DeltaNet (Qwen3.5's linear_attention layers): wqkv is [in_proj_qkv; in_proj_z; in_proj_b;
  // in_proj_a], wo is out_proj; the causal conv's taps [conv_dim, 1, K], dt_bias and A_log [Hv],
  // and the gated output norm's weight [dv] (plain w).
  at::Tensor conv_w, dt_bias, a_log, gdn_norm;
};

// A streamed model's checkpoint: weights stay in the mapped files in their stored dtype and are
// converted to fp32 one layer at a time (the same conversion the whole-model load does, so both
// give the same fp32 values bit for bit).
class LayerSource {
 public:
  virtual ~LayerSource() = default;
  virtual void build(int layer, LayerWeights* out) const = 0;  // fresh tensors of the layer (in its precision)
  virtual void release(int layer) const = 0;                   // drops the layer's stored pages
  virtual int64_t stored_bytes(int layer) const = 0;           // stored bytes mapped at once converting it
  // ids [N] int64 -> [N, D] fp32 (BF16-rounded values in kBf16, as the whole load's table rows)
  virtual at::Tensor embed_rows(const at::Tensor& ids) const = 0;
  virtual at::Tensor lm_head() const = 0;  // [V, D] fresh, fp32 or BF16 by the precision
};

// fp32 bytes of layer l's weights as LayerWeights holds them (one_expert: a streamed MoE layer,
// its routed experts converted one at a time).
int64_t layer_fp32_bytes(const ModelConfig& c, int l, bool one_expert = false);
// The same in precision p (BF16: 2 bytes per GEMM weight element).
int64_t layer_bytes(const ModelConfig& c, int l, Precision p, bool one_expert = false);

// Converts a loaded layer's GEMM weights to BF16 (round to nearest even) when p is kBf16 (the
// llama2.c loader's fp32 arrays; HF checkpoints convert each tensor as it is read).
void to_precision(LayerWeights& L, Precision p);

struct ModelWeights {
  // Set for a streamed model: then embed, lm_head and layers are empty (final_norm is kept).
  std::shared_ptr<const LayerSource> source;
  at::Tensor embed;       // [V, D]
  std::vector<LayerWeights> layers;
  at::Tensor final_norm;  // [D]
  at::Tensor lm_head;     // [V, D]; the same storage as embed when tied
  std::vector<std::vector<float>> sinks;  // [L][H] attention sinks (ModelConfig::attn_sinks), else empty

  // The last forward's scratch buffers (model.cpp's Workspace), kept so that repeated forwards of
  // one shape do not page-fault fresh memory each call; a concurrent forward uses its own.
  std::atomic<bool> scratch_busy{false};  // not a mutex: an observer may call forward re-entrantly
  std::shared_ptr<void> scratch;
};

namespace detail {

// HF directory: config.json + model.safetensors or model.safetensors.index.json.
// stream: keep the checkpoint mapped and set w->source instead of converting every layer.
void load_hf(const std::string& dir, ModelConfig* cfg, ModelWeights* w, std::string* config_sha256,
             bool stream = false, Precision precision = Precision::kFp32);
// Parses and validates config.json alone (no weights); used by load_hf.
ModelConfig parse_hf_config(const std::string& config_path);
// llama2.c legacy (v0) checkpoint.
void load_llama2c(const std::string& path, ModelConfig* cfg, ModelWeights* w,
                  std::string* config_sha256);

}  // namespace detail
}  // namespace kvq
