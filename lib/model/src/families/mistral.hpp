#pragma once
// Mistral AI's decoders: Mistral (MistralForCausalLM: Mistral-7B, Mistral-Nemo) and Mixtral
// (MixtralForCausalLM: top-k mixture of experts).
#include "family.hpp"

namespace kvq::detail {
extern const Family kMistralFamily;
extern const Family kMixtralFamily;
}  // namespace kvq::detail
