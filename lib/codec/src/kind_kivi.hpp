#pragma once
// kivi: asymmetric min/max scalar codes, K per channel over group_size tokens, V per token
// over group_size channels. The coding is described in kvq/codec/codec.hpp; kernels:
// kernels/include/kvq/cuda/kind_kivi.cuh.
#include "kind_codec.hpp"

namespace kvq::codec::detail {

class KiviCodec final : public HeadDomainCodec {
 public:
  using HeadDomainCodec::HeadDomainCodec;
  void encode(const float* x, int n_tokens, uint8_t* out) const override;
  void decode_latent(const uint8_t* packed, int n_tokens, float* latent) const override;
};

}  // namespace kvq::codec::detail
