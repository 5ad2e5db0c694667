#pragma once
// DeepSeek-V2 (DeepseekV2ForCausalLM: DeepSeek-V2, V2-Lite) and DeepSeek-V3 (DeepseekV3ForCausalLM:
// DeepSeek-V3, R1, V3.1; Kimi-K2 as kimi_k2).
#include "family.hpp"

namespace kvq::detail {
extern const Family kDeepseekV2Family;
extern const Family kDeepseekV3Family;
extern const Family kKimiK2Family;
}  // namespace kvq::detail
