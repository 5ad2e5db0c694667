#pragma once
// Greedy generation and perplexity over the forward (optionally with a KV transform applied).
#include <cstdint>
#include <vector>

#include "kvq/model/model.hpp"

namespace kvq {

// Appends `steps` argmax tokens to `prompt` (which starts with BOS), recomputing the full causal
// window each step. Returns only the new ids.
std::vector<int64_t> greedy_generate(const Model& m, const std::vector<int64_t>& prompt, int steps,
                                     KvTransform* kv = nullptr);

// The k largest logits of the last position of one causal window over `ids`, largest first (ties:
// lower id first): what a reference implementation's logits[-1] can be compared against.
struct TopLogit {
  int64_t id = 0;
  float logit = 0.f;
};
std::vector<TopLogit> last_top_logits(const Model& m, const std::vector<int64_t>& ids, int k);

// Mean cross-entropy (nats) of predicting ids[1:] from ids[:-1] in one causal window.
double window_nll(const Model& m, const std::vector<int64_t>& ids, KvTransform* kv = nullptr);

}  // namespace kvq
