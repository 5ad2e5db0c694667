#pragma once
// Streaming, mergeable first and second moments per (layer, KV head), accumulated in fp64.
// These sums are the calibration file's statistics: everything the allocators need derives from
// them (see derived.hpp), so two files over disjoint windows merge exactly by adding.
#include <cstddef>
#include <cstdint>
#include <vector>

#include "kvq/model/capture.hpp"

namespace kvq {

struct MomentShape {
  int n_layers = 0, n_kv_heads = 0, n_heads = 0, head_dim = 0;
  int group_size() const { return n_heads / n_kv_heads; }
  size_t heads() const { return size_t(n_layers) * size_t(n_kv_heads); }
  bool operator==(const MomentShape& o) const {
    return n_layers == o.n_layers && n_kv_heads == o.n_kv_heads && n_heads == o.n_heads && head_dim == o.head_dim;
  }
};

// Sums for one side (K, V, or the group's queries), over all (layer, KV head), flat row-major:
// count [L][H], sum [L][H][d], gram [L][H][d][d] (full symmetric matrix).
struct SideMoments {
  std::vector<int64_t> count;
  std::vector<double> sum;
  std::vector<double> gram;

  void resize(const MomentShape& s);
  void add(const SideMoments& o);
  const double* sum_of(const MomentShape& s, int layer, int head) const {
    return sum.data() + (size_t(layer) * s.n_kv_heads + head) * s.head_dim;
  }
  const double* gram_of(const MomentShape& s, int layer, int head) const {
    return gram.data() + (size_t(layer) * s.n_kv_heads + head) * s.head_dim * s.head_dim;
  }
  int64_t count_of(const MomentShape& s, int layer, int head) const {
    return count[size_t(layer) * s.n_kv_heads + head];
  }
};

class Moments {
 public:
  Moments() = default;
  explicit Moments(const MomentShape& s);

  const MomentShape& shape() const { return shape_; }
  SideMoments k, v, q;  // q: every query head of the group counted as its own sample

  // Adds one layer's capture (pre-RoPE q, k, v of a batch). Blocked GEMM (symmetric rank-k
  // update) in fp64; the batch is reduced in a fixed order so results do not depend on timing.
  void accumulate(const LayerCapture& c);
  void add(const Moments& o);  // exact merge

 private:
  MomentShape shape_;
};

}  // namespace kvq
