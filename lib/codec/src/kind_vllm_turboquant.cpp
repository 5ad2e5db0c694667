#include "kind_vllm_turboquant.hpp"

#include <cstring>

#include "kvq/codec/minifloat.hpp"

namespace kvq::codec::detail {

namespace {
// BF16 of a float: round to nearest even (a NaN stays a quiet NaN), as torch's .to(bfloat16).
uint16_t to_bf16(float f) {
  const uint32_t u = layout::f32_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return uint16_t((u >> 16) | 0x40u);
  return uint16_t((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}
float from_bf16(uint16_t h) { return layout::f32_from_bits(uint32_t(h) << 16); }
}  // namespace

VllmTurboQuantCodec::VllmTurboQuantCodec(const HeadDecision& dec, int head_dim, const layout::PackedLayout& L)
    : HeadDomainCodec(dec, head_dim, L) {
  if (lloyd_max_key()) {
    codebook_ = vllm_tq::lloyd_max(head_dim, dec.bits);
    rotation_ = vllm_tq::hadamard(head_dim);
  }
}

void VllmTurboQuantCodec::encode(const float* x, int n_tokens, uint8_t* out) const {
  const size_t d = static_cast<size_t>(d_);
  const uint32_t bits = layout_.bits;
  uint8_t codes[256];
  for (int t = 0; t < n_tokens; ++t) {
    const float* xt = x + static_cast<size_t>(t) * d;
    uint8_t* block = out + static_cast<size_t>(t) * layout_.block_bytes;
    uint8_t* stream = block + layout_.meta_bytes;
    if (bits == layout::kVllmTqKeptBits) {
      for (size_t j = 0; j < d; ++j) layout::store_u16le(stream + 2 * j, to_bf16(xt[j]));
    } else if (dec_.side == Side::kK && bits == 8) {
      for (size_t j = 0; j < d; ++j) stream[j] = e4m3_encode(double(xt[j]), E4M3Overflow::kSaturate);
    } else if (dec_.side == Side::kK) {
      uint16_t norm = 0;
      vllm_tq::encode_key(codebook_, rotation_, d_, xt, codes, &norm);
      layout::store_u16le(block, norm);
      layout::pack_codes(codes, static_cast<uint32_t>(d), bits, stream, 0);
    } else {
      uint16_t scale = 0, zero = 0;
      vllm_tq::encode_value(xt, d_, static_cast<int>(bits), codes, &scale, &zero);
      layout::store_u16le(block, scale);
      layout::store_u16le(block + 2, zero);
      layout::pack_codes(codes, static_cast<uint32_t>(d), bits, stream, 0);
    }
  }
}

void VllmTurboQuantCodec::decode_latent(const uint8_t* packed, int n_tokens, float* out) const {
  const size_t d = static_cast<size_t>(d_);
  const uint32_t bits = layout_.bits;
  uint8_t codes[256];
  for (int t = 0; t < n_tokens; ++t) {
    const uint8_t* block = packed + static_cast<size_t>(t) * layout_.block_bytes;
    const uint8_t* stream = block + layout_.meta_bytes;
    float* ot = out + static_cast<size_t>(t) * d;
    if (bits == layout::kVllmTqKeptBits) {
      for (size_t j = 0; j < d; ++j) ot[j] = from_bf16(layout::load_u16le(stream + 2 * j));
    } else if (dec_.side == Side::kK && bits == 8) {
      for (size_t j = 0; j < d; ++j) ot[j] = e4m3_decode(stream[j]);
    } else {
      layout::unpack_codes(stream, 0, bits, static_cast<uint32_t>(d), codes);
      if (dec_.side == Side::kK)
        vllm_tq::decode_key(codebook_, rotation_, d_, /*norm_correction=*/true, codes, layout::load_u16le(block), ot);
      else
        vllm_tq::decode_value(codes, d_, layout::load_u16le(block), layout::load_u16le(block + 2), ot);
    }
  }
}

void VllmTurboQuantCodec::unpack_codes(const uint8_t* packed, int n_tokens, uint8_t* codes) const {
  if (layout_.bits != layout::kVllmTqKeptBits) return KindCodec::unpack_codes(packed, n_tokens, codes);
  const size_t d = static_cast<size_t>(d_);
  for (int t = 0; t < n_tokens; ++t) {
    const uint8_t* stream = packed + static_cast<size_t>(t) * layout_.block_bytes;
    for (size_t j = 0; j < d; ++j) codes[size_t(t) * d + j] = stream[2 * j + 1];
  }
}

}  // namespace kvq::codec::detail
