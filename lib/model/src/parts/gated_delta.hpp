#pragma once
// Gated DeltaNet (Qwen3.5's linear_attention layers; transformers' Qwen3_5GatedDeltaNet and its
// torch_recurrent_gated_delta_rule): a layer with a fixed-size state instead of a KV cache, run
// exactly by its per-token recurrence. Internal to kvq_model.
#include "decoder_layer.hpp"

namespace kvq::detail {

// x += out_proj(GatedRMSNorm(DeltaRule(conv(in_proj x)), z)) for one batch, ws.h holding norm(x):
//  1. [m | z | b | a] = W x with W = [in_proj_qkv; in_proj_z; in_proj_b; in_proj_a] (L.wqkv);
//  2. m'_t = silu(Σ_j conv[c][j] · m_{t-K+1+j}) per channel, zero before the window's first token;
//  3. m' = [q (Hk × dk) | k (Hk × dk) | v (Hv × dv)]; q, k scaled to unit L2 norm per head
//     (x · rsqrt(Σ x² + 1e-6)), q by dk^-½ besides; value head j reads q/k head j / (Hv / Hk);
//  4. β = sigmoid(b), g = -exp(A_log) · softplus(a + dt_bias) per value head and token;
//  5. per value head, S (dk × dv) from 0: S ← S·exp(g_t); δ = (v_t − Sᵀk_t)·β_t; S ← S + k_t δᵀ;
//     o_t = Sᵀ q_t (the decay before the update, as the reference recurrence has it);
//  6. o ← o / rms(o) · w · silu(z) per value head (plain w, eps rms_norm_eps);
//  7. x += out_proj(o) (L.wo).
// The conv and the recurrence run in fp32 (the checkpoint's mamba_ssm_dtype) in both precisions.
void gated_delta_block(const ModelConfig& c, const LayerWeights& L, Workspace& ws, Pass& p);

// The layer of a hybrid decoder (Qwen3.5): decoder layer l is an attention layer
// (attention_block, with its output gate) when it has a KV cache, else a Gated DeltaNet one; both
// are followed by the MLP (mlp_block).
void hybrid_layer(const ModelConfig& c, const LayerWeights& L, int l, Workspace& ws, Pass& p,
                  const Model::ForwardOptions& opts);

}  // namespace kvq::detail
