#pragma once
// Gemma 3: text-only (Gemma3ForCausalLM, model_type gemma3_text) and the multimodal checkpoints'
// language model (Gemma3ForConditionalGeneration, model_type gemma3, its text under text_config).
#include "family.hpp"

namespace kvq::detail {
extern const Family kGemma3Family;
extern const Family kGemma3TextFamily;
}  // namespace kvq::detail
