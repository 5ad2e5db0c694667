// Llama: the common decoder layout with split-half RoPE; `attention_bias` puts biases on q, k, v
// and o. RoPE scaling (linear, dynamic, llama3, yarn) is read by the shared config reader.
#include "llama.hpp"

namespace kvq::detail {
namespace {

void parse_llama(const ConfigReader& r, ModelConfig* c) {
  read_decoder_config(r, RopePairing::kSplitHalf, 1.0, c);
  c->qkv_bias = c->o_bias = r.boolean("attention_bias", false);
}

}  // namespace

const Family kLlamaFamily = {"llama", {"LlamaForCausalLM"}, parse_llama, llama_globals, nullptr, llama_plan, decoder_layer};

}  // namespace kvq::detail
