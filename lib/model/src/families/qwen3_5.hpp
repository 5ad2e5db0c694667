#pragma once
// Qwen3.5 / Qwen3.6: dense (Qwen3_5ForConditionalGeneration, model_type qwen3_5) and MoE
// (Qwen3_5MoeForConditionalGeneration, qwen3_5_moe). Hybrid: Gated DeltaNet on three layers of four,
// gated attention (the only KV cache) on the fourth; and Qwen3-Next (Qwen3NextForCausalLM, qwen3_next),
// the same layers with per-key-head fused DeltaNet projections.
#include "family.hpp"

namespace kvq::detail {
extern const Family kQwen3_5Family;
extern const Family kQwen3_5MoeFamily;
extern const Family kQwen3_5TextFamily;
extern const Family kQwen3_5MoeTextFamily;
extern const Family kQwen3NextFamily;
}  // namespace kvq::detail
