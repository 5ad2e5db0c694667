#pragma once
// Internal: the fp32 weights of a Llama-family decoder and the per-format loaders that fill them.
#include <ATen/ATen.h>

#include <atomic>
#include <memory>
#include <string>
#include <vector>

#include "kvq/model/config.hpp"

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
  // MoE layers (w_gate_up / w_down undefined): router [E, D]; expert e's [2 I_e, D] and [D, I_e].
  at::Tensor router;
  std::vector<at::Tensor> expert_gate_up, expert_down;
};

struct ModelWeights {
  at::Tensor embed;       // [V, D]
  std::vector<LayerWeights> layers;
  at::Tensor final_norm;  // [D]
  at::Tensor lm_head;     // [V, D]; the same storage as embed when tied

  // The last forward's scratch buffers (model.cpp's Workspace), kept so that repeated forwards of
  // one shape do not page-fault fresh memory each call; a concurrent forward uses its own.
  std::atomic<bool> scratch_busy{false};  // not a mutex: an observer may call forward re-entrantly
  std::shared_ptr<void> scratch;
};

namespace detail {

// HF directory: config.json + model.safetensors or model.safetensors.index.json.
void load_hf(const std::string& dir, ModelConfig* cfg, ModelWeights* w, std::string* config_sha256);
// Parses and validates config.json alone (no weights); used by load_hf.
ModelConfig parse_hf_config(const std::string& config_path);
// llama2.c legacy (v0) checkpoint.
void load_llama2c(const std::string& path, ModelConfig* cfg, ModelWeights* w,
                  std::string* config_sha256);

}  // namespace detail
}  // namespace kvq
