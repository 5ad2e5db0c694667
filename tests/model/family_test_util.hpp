#pragma once
// What the model-family tests share around a tiny checkpoint's forward: seeded prompts, kvq's logits
// of one prompt as doubles (hf_reference.hpp's layout, [T][V]) and the greedy ids of each row.
#include <ATen/ATen.h>

#include <algorithm>
#include <cstdint>
#include <random>
#include <vector>

#include "hf_reference.hpp"
#include "kvq/model/model.hpp"

namespace kvq::test {

// T ids uniform over the vocabulary from `seed`.
inline std::vector<int> seeded_ids(int T, int vocab, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<int> ids(static_cast<size_t>(T));
  for (int& x : ids) x = int(rng() % uint32_t(vocab));
  return ids;
}

// kvq's logits of one prompt, [T][V] row-major in double.
inline ref::Vec kvq_logits(const Model& m, const std::vector<int>& ids,
                           const Model::ForwardOptions& opts = Model::ForwardOptions{}) {
  std::vector<int64_t> v(ids.begin(), ids.end());
  const at::Tensor l =
      m.forward(at::tensor(v, at::kLong).view({1, int64_t(v.size())}), opts)[0].to(at::kDouble).contiguous();
  return ref::Vec(l.data_ptr<double>(), l.data_ptr<double>() + l.numel());
}

// The argmax of each row of [T][V] logits.
inline std::vector<int64_t> argmax_rows(const ref::Vec& logits, int V) {
  std::vector<int64_t> out;
  for (size_t t = 0; t * size_t(V) < logits.size(); ++t) {
    auto b = logits.begin() + ptrdiff_t(t * size_t(V));
    out.push_back(std::max_element(b, b + V) - b);
  }
  return out;
}

}  // namespace kvq::test
