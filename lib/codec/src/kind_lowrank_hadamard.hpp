#pragma once
// lowrank-hadamard: y = U_r^T (x - mu), seeded-sign WHT, uniform scalar at `bits` (KV-COBRA). The
// coding is described in kvq/codec/codec.hpp; kernels: kernels/include/kvq/cuda/kind_lowrank_hadamard.cuh.
#include "kind_codec.hpp"

namespace kvq::codec::detail {

class LowRankHadamardCodec final : public KindCodec {
 public:
  LowRankHadamardCodec(const HeadDecision& dec, int head_dim, const layout::PackedLayout& L);
  void encode(const float* x, int n_tokens, uint8_t* out) const override;
  void decode_latent(const uint8_t* packed, int n_tokens, float* latent) const override;
  void latent_to_head(const float* latent, int n_tokens, float* out) const override;
  void query_to_latent(const float* q, float* qc, float* q_off) const override;
  const std::vector<float>& folded_basis() const override { return folded_; }
  const std::vector<float>& mean() const override { return mean_; }
  float step_unit() const override { return step_unit_; }

 private:
  std::vector<float> folded_, folded_t_, mean_;  // M [r][d], M^T [d][r], mu [d]
  float step_unit_ = 0.f;
};

}  // namespace kvq::codec::detail
