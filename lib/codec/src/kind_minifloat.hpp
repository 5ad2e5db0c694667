#pragma once
// minifloat: a serving engine's FP8 E4M3 or NVFP4 with a static per-head scale (rounding in
// kvq/codec/minifloat.hpp). The coding is described in kvq/codec/codec.hpp (no CUDA decoder yet: the kernels refuse it).
#include "kind_codec.hpp"

namespace kvq::codec::detail {

class MinifloatCodec final : public HeadDomainCodec {
 public:
  using HeadDomainCodec::HeadDomainCodec;
  void encode(const float* x, int n_tokens, uint8_t* out) const override;
  void decode_latent(const uint8_t* packed, int n_tokens, float* latent) const override;
};

}  // namespace kvq::codec::detail
