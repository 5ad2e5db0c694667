#pragma once
// The mixture-of-experts MLP the MoE families share: the softmax router (greedy or DeepSeek-V2's
// group-limited top-k, renormalised or scaled), DeepSeek-V3's sigmoid noaux_tc router, and
// DeepSeekMoE's shared experts. Internal to kvq_model.
#include <ATen/ATen.h>

#include "forward_kernels.hpp"
#include "kvq/model/config.hpp"
#include "weights.hpp"

namespace kvq::detail {

// x += Σ_kept p_e · SwiGLU_e(ws.h) for the top-k experts of each token; + shared(ws.h) last
// (DeepSeekMoE). The router is the softmax one (Qwen3-MoE, Mixtral, DeepSeek-V2: greedy or
// group-limited, renormalised or x routed_scaling_factor), or, when the layer has an
// e_score_correction_bias (L.router_bias), DeepSeek-V3's sigmoid noaux_tc router.
// Only chosen experts run: the tokens routed to expert e are gathered, one GEMM chain per expert,
// scaled by their weights and added back in expert order. Top-k ties go to the lower expert index
// (torch.topk leaves tie order unspecified; exact ties of fp32 router probabilities are rare).
void moe_mlp(Workspace& ws, const LayerWeights& L, const ModelConfig& c, at::Tensor& x);

}  // namespace kvq::detail
