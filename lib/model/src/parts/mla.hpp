#pragma once
// DeepSeek's multi-head latent attention (MLA) in its served, absorbed form: the projection into
// the one cached latent head, the per-head output through W_UV, the checkpoint tensors it reads and
// the check of kv_lora_rank against them. Shared by the families that use MLA. Internal to kvq_model.
#include <ATen/ATen.h>

#include <string>

#include "forward_kernels.hpp"
#include "kvq/model/config.hpp"
#include "layout.hpp"
#include "weights.hpp"

namespace kvq::detail {

// ws.h into ws.q [N][H][rope + R], ws.k [N][rope + R] and ws.v [N][R], all pre-RoPE.
void mla_project(const ModelConfig& c, const LayerWeights& L, Workspace& ws);
// out_h = W_UV,h (ws.attn_h), [N][H][v] in ws.mla_o (o_proj's input).
const at::Tensor& mla_output(const ModelConfig& c, const LayerWeights& L, Workspace& ws);

// Layer l's MLA tensors (o_proj included) as the slots they fill: the q projection (q_proj, or
// q_a_proj) and kv_a_proj_with_mqa stacked as the rows of one GEMM, then q-LoRA's norm and q_b_proj,
// kv_a_layernorm, kv_b_proj, o_proj. `prefix`: the layer's attention module, e.g.
// "model.layers.3.self_attn.".
LayerPlan mla_plan(const ModelConfig& c, const std::string& prefix);

// The latent width the tensors hold must be config.json's kv_lora_rank; a mismatch is named as
// such (not as three unrelated shape errors).
void check_kv_lora_rank(const ModelConfig& c, const TensorIndex& t, const std::string& config_path);

}  // namespace kvq::detail
