#include "kind_minifloat.hpp"

#include <cstring>

#include "code_stream.hpp"
#include "kvq/codec/minifloat.hpp"

namespace kvq::codec::detail {

// FP8: the E4M3 codes are the code stream's bytes (8-bit codes, LSB-first = byte order).
// NVFP4: block scales into the records, E2M1 codes packed two per byte (low nibble first).
void MinifloatCodec::encode(const float* x, int n_tokens, uint8_t* out) const {
  const size_t d = static_cast<size_t>(d_);
  std::vector<uint8_t> codes(d);
  for (int t = 0; t < n_tokens; ++t) {
    const float* xt = x + static_cast<size_t>(t) * d;
    uint8_t* block = out + static_cast<size_t>(t) * layout_.block_bytes;
    if (dec_.minifloat == MinifloatFormat::kFp8E4M3) {
      encode_fp8(xt, d, dec_.scale, block);
    } else {
      encode_nvfp4(xt, d, codes.data(), block, dec_.scale);
      layout::pack_codes(codes.data(), static_cast<uint32_t>(d), 4, block + layout_.meta_bytes, 0);
    }
  }
}

void MinifloatCodec::decode_latent(const uint8_t* packed, int n_tokens, float* latent) const {
  const int cd = static_cast<int>(layout_.code_dim);
  const uint8_t* end = packed + layout::packed_bytes(layout_, static_cast<uint64_t>(n_tokens));
  const size_t d = static_cast<size_t>(d_);
  std::vector<uint8_t> codes(d);
  for (int t = 0; t < n_tokens; ++t) {
    const uint8_t* block = packed + static_cast<size_t>(t) * layout_.block_bytes;
    float* lt = latent + static_cast<size_t>(t) * cd;
    if (dec_.minifloat == MinifloatFormat::kFp8E4M3) {
      decode_fp8(block, d, dec_.scale, lt);
    } else {
      unpack_run(block + layout_.meta_bytes, 0, 4, static_cast<uint32_t>(d), end, codes.data());
      decode_nvfp4(codes.data(), block, d, lt, dec_.scale);
    }
  }
}

}  // namespace kvq::codec::detail
