#pragma once
// Streaming, mergeable first and second moments per (layer, KV head), accumulated in fp64.
// These sums are the calibration file's statistics: everything the allocators need derives from
// them (see derived.hpp), so two files over disjoint windows merge exactly by adding.
#include <cstddef>
#include <cstdint>
#include <vector>

#include "kvq/model/capture.hpp"
#include "kvq/model/config.hpp"

namespace kvq {

struct MomentShape {
  int n_layers = 0, n_kv_heads = 0, n_heads = 0, head_dim = 0;
  int head_dim_v = 0;  // V rows' dim when it differs from head_dim (MLA's served cache); 0: head_dim
  int v_dim() const { return head_dim_v > 0 ? head_dim_v : head_dim; }
  int group_size() const { return n_heads / n_kv_heads; }
  size_t heads() const { return size_t(n_layers) * size_t(n_kv_heads); }
  bool operator==(const MomentShape& o) const {
    return n_layers == o.n_layers && n_kv_heads == o.n_kv_heads && n_heads == o.n_heads && head_dim == o.head_dim &&
           v_dim() == o.v_dim();
  }
};

// Sums for one side (K, V, or the group's queries), over all (layer, KV head), flat row-major:
// count [L][H], sum [L][H][d], gram [L][H][d][d] (full symmetric matrix). d is the side's own dim:
// head_dim for K and Q, the shape's v_dim() for V.
struct SideMoments {
  std::vector<int64_t> count;
  std::vector<double> sum;
  std::vector<double> gram;
  int dim = 0;  // this side's row dim; 0: the shape's head_dim

  void resize(const MomentShape& s, int d = 0);
  void add(const SideMoments& o);
  int dim_of(const MomentShape& s) const { return dim > 0 ? dim : s.head_dim; }
  const double* sum_of(const MomentShape& s, int layer, int head) const {
    return sum.data() + (size_t(layer) * s.n_kv_heads + head) * size_t(dim_of(s));
  }
  const double* gram_of(const MomentShape& s, int layer, int head) const {
    const size_t d = size_t(dim_of(s));
    return gram.data() + (size_t(layer) * s.n_kv_heads + head) * d * d;
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

  // Largest |x| per (layer, head) over every calibration token, the serving engines' FP8/NVFP4
  // scales' input: post-RoPE K (as the cache stores it) and V per KV head [L][n_kv_heads],
  // post-RoPE Q per query head [L][n_heads]. Merged by max (exact). Empty when the statistics
  // predate it (calibration files before version 3) or no RoPE was given (set_amax_rope).
  std::vector<float> k_amax, v_amax, q_amax;
  bool has_amax() const { return !k_amax.empty(); }
  // Turns amax tracking on: `inv_freq` [rotary_dim / 2] and `attention_factor` as the forward's
  // RoPE (rope_params), applied to the captured pre-RoPE q and k before taking |x|.
  void set_amax_rope(RopePairing pairing, int rotary_dim, std::vector<double> inv_freq, double attention_factor);
  // Gemma 3: the listed layers rotate with their own frequencies (call after set_amax_rope).
  void set_amax_rope_local(std::vector<double> inv_freq, double attention_factor, const std::vector<int>& layers);

  // Adds one layer's capture (pre-RoPE q, k, v of a batch). Blocked GEMM (symmetric rank-k
  // update) in fp64; the batch is reduced in a fixed order so results do not depend on timing.
  void accumulate(const LayerCapture& c);
  void add(const Moments& o);  // exact merge

 private:
  MomentShape shape_;
  RopePairing amax_pairing_ = RopePairing::kSplitHalf;
  int amax_rotary_dim_ = 0;
  std::vector<double> amax_inv_freq_;
  double amax_factor_ = 1.0;
  std::vector<double> amax_local_inv_freq_;
  double amax_local_factor_ = 1.0;
  std::vector<uint8_t> amax_local_layer_;  // [n_layers] 1: the layer uses the local RoPE
};

}  // namespace kvq
