#pragma once
// tq-groups: TQ-MSE per coordinate group (uniform, Block-GTQ). The coding is described in
// kvq/codec/codec.hpp; kernels: kernels/include/kvq/cuda/kind_tq_groups.cuh.
#include "kind_codec.hpp"

namespace kvq::codec::detail {

class TqGroupsCodec final : public KindCodec {
 public:
  TqGroupsCodec(const HeadDecision& dec, int head_dim, const layout::PackedLayout& L);
  void encode(const float* x, int n_tokens, uint8_t* out) const override;
  void decode_latent(const uint8_t* packed, int n_tokens, float* latent) const override;
  void unpack_codes(const uint8_t* packed, int n_tokens, uint8_t* codes) const override;
  void latent_to_head(const float* latent, int n_tokens, float* out) const override;
  void query_to_latent(const float* q, float* qc, float* q_off) const override;
  const std::vector<TqGroupTables>& tq_groups() const override { return groups_; }
  const std::vector<float>& norm_levels() const override { return norm_levels_; }

 private:
  std::vector<TqGroupTables> groups_;
  bool tq_identity_dims_ = false;   // a single group with dims 0..d-1: no scatter
  std::vector<float> norm_levels_;  // compact group norms only
};

}  // namespace kvq::codec::detail
