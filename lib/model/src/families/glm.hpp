#pragma once
// GLM-4 (GLM-4-9B and -Chat in THUDM's own chatglm layout, GLM-4-9B-hf as glm, GLM-4-0414 as glm4).
#include "family.hpp"

namespace kvq::detail {
extern const Family kChatGlmFamily;
extern const Family kGlmFamily;
extern const Family kGlm4Family;
}  // namespace kvq::detail
