#pragma once
// Qwen's decoders: Qwen2 / Qwen2.5 (Qwen2ForCausalLM), Qwen3 (Qwen3ForCausalLM) and Qwen3-MoE
// (Qwen3MoeForCausalLM).
#include "family.hpp"

namespace kvq::detail {
extern const Family kQwen2Family;
extern const Family kQwen3Family;
extern const Family kQwen3MoeFamily;
}  // namespace kvq::detail
