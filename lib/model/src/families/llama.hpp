#pragma once
// Llama (LlamaForCausalLM): Llama-2, Llama-3.x, DeepSeek-R1-Distill-Llama.
#include "family.hpp"

namespace kvq::detail {
extern const Family kLlamaFamily;
}  // namespace kvq::detail
