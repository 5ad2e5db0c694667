#pragma once
// gpt-oss (GptOssForCausalLM, model_type gpt_oss).
#include "family.hpp"

namespace kvq::detail {
extern const Family kGptOssFamily;
}  // namespace kvq::detail
