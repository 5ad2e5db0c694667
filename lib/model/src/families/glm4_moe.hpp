#pragma once
// GLM-4.5 / 4.6 / 4.7 (Glm4MoeForCausalLM, model_type glm4_moe).
#include "family.hpp"

namespace kvq::detail {
extern const Family kGlm4MoeFamily;
}  // namespace kvq::detail
