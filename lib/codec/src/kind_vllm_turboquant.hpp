#pragma once
// vllm-turboquant: one side of vLLM's TurboQuant slot in kvq's packed layout (layout in
// kvq/format/packed_layout.hpp, make_vllm_tq_layout), coded by the engine's own quantizers
// (kvq/codec/vllm_turboquant.hpp). CPU only: the kernels refuse it (vLLM serves it with its own).
#include "kind_codec.hpp"
#include "kvq/codec/vllm_turboquant.hpp"

namespace kvq::codec::detail {

class VllmTurboQuantCodec final : public HeadDomainCodec {
 public:
  VllmTurboQuantCodec(const HeadDecision& dec, int head_dim, const layout::PackedLayout& L);
  void encode(const float* x, int n_tokens, uint8_t* out) const override;
  void decode_latent(const uint8_t* packed, int n_tokens, float* latent) const override;
  // A kept side's 16-bit values are not codes of at most 8 bits: their high bytes.
  void unpack_codes(const uint8_t* packed, int n_tokens, uint8_t* codes) const override;

 private:
  bool lloyd_max_key() const { return dec_.side == Side::kK && dec_.bits <= 4; }
  vllm_tq::Codebook codebook_;   // Lloyd-Max keys only
  std::vector<float> rotation_;  // Lloyd-Max keys only
};

}  // namespace kvq::codec::detail
