#include "kvq/eval/generate.hpp"

#include <c10/core/InferenceMode.h>

#include <algorithm>

#include "kvq/util/error.hpp"

namespace kvq {

static at::Tensor ids_tensor(const std::vector<int64_t>& ids) {
  return at::from_blob(const_cast<int64_t*>(ids.data()), {1, int64_t(ids.size())}, at::kLong).clone();
}

std::vector<int64_t> greedy_generate(const Model& m, const std::vector<int64_t>& prompt, int steps, KvTransform* kv) {
  c10::InferenceMode guard;
  std::vector<int64_t> ids = prompt, out;
  for (int s = 0; s < steps; ++s) {
    if (int(ids.size()) >= m.config().max_seq_len) break;
    Model::ForwardOptions fo;
    fo.kv_transform = kv;
    at::Tensor logits = m.forward(ids_tensor(ids), fo);
    int64_t next = logits[0][int64_t(ids.size()) - 1].argmax().item<int64_t>();
    ids.push_back(next);
    out.push_back(next);
  }
  return out;
}

std::vector<TopLogit> last_top_logits(const Model& m, const std::vector<int64_t>& ids, int k) {
  if (ids.empty()) throw Error("", "prompt", "is empty: nothing to score");
  c10::InferenceMode guard;
  at::Tensor last = m.forward(ids_tensor(ids))[0][int64_t(ids.size()) - 1].contiguous();  // [V]
  const float* p = last.data_ptr<float>();
  std::vector<int64_t> order(size_t(last.numel()));
  for (size_t i = 0; i < order.size(); ++i) order[i] = int64_t(i);
  const size_t n = std::min(order.size(), size_t(std::max(0, k)));
  std::partial_sort(order.begin(), order.begin() + long(n), order.end(),
                    [&](int64_t a, int64_t b) { return p[a] > p[b] || (p[a] == p[b] && a < b); });
  std::vector<TopLogit> out;
  for (size_t i = 0; i < n; ++i) out.push_back({order[i], p[order[i]]});
  return out;
}

double window_nll(const Model& m, const std::vector<int64_t>& ids, KvTransform* kv) {
  if (ids.size() < 2) throw Error("", "text", "need at least 2 tokens for a perplexity window");
  c10::InferenceMode guard;
  Model::ForwardOptions fo;
  fo.kv_transform = kv;
  at::Tensor logits = m.forward(ids_tensor(ids), fo)[0];  // [T][V]
  const int64_t T = int64_t(ids.size());
  at::Tensor logp = at::log_softmax(logits.slice(0, 0, T - 1).to(at::kDouble), 1);
  at::Tensor target = ids_tensor(ids)[0].slice(0, 1, T);
  return -logp.gather(1, target.unsqueeze(1)).mean().item<double>();
}

}  // namespace kvq
