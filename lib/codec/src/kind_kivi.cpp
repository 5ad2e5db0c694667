#include "kind_kivi.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "code_stream.hpp"

namespace kvq::codec::detail {

using layout::f16_to_f32;
using layout::put_code;

void KiviCodec::encode(const float* x, int n_tokens, uint8_t* out) const {
  const int b = dec_.bits;
  const int g = dec_.group_size;
  const float qmax = static_cast<float>((1 << b) - 1);
  auto quant = [&](float v, float scale, float zero) -> uint32_t {
    if (!(scale > 0.f)) return 0;
    const float q = std::floor((v - zero) / scale + 0.5f);
    return static_cast<uint32_t>(std::clamp(q, 0.f, qmax));
  };
  auto record = [&](uint8_t* rec, float mn, float mx, float& scale, float& zero) {
    const uint16_t s_h = to_f16_sat((mx - mn) / qmax);
    const uint16_t z_h = to_f16_sat(mn);
    layout::store_u16le(rec, s_h);
    layout::store_u16le(rec + 2, z_h);
    scale = f16_to_f32(s_h);
    zero = f16_to_f32(z_h);
  };
  if (dec_.side == Side::kK) {
    const int n_blocks = (n_tokens + g - 1) / g;
    for (int blk = 0; blk < n_blocks; ++blk) {
      uint8_t* block = out + static_cast<size_t>(blk) * layout_.block_bytes;
      uint8_t* codes = block + layout_.meta_bytes;
      const int t0 = blk * g;
      const int nt = std::min(g, n_tokens - t0);
      for (int c = 0; c < d_; ++c) {
        float mn = INFINITY, mx = -INFINITY;
        for (int t = 0; t < nt; ++t) {
          const float v = x[static_cast<size_t>(t0 + t) * d_ + c];
          mn = std::min(mn, v);
          mx = std::max(mx, v);
        }
        float scale, zero;
        record(block + 4 * c, mn, mx, scale, zero);
        for (int t = 0; t < nt; ++t) {
          const float v = x[static_cast<size_t>(t0 + t) * d_ + c];
          put_code(codes, (static_cast<uint64_t>(t) * d_ + c) * b, static_cast<uint32_t>(b),
                   quant(v, scale, zero));
        }
      }
    }
  } else {
    const int n_groups = (d_ + g - 1) / g;
    for (int t = 0; t < n_tokens; ++t) {
      const float* xt = x + static_cast<size_t>(t) * d_;
      uint8_t* block = out + static_cast<size_t>(t) * layout_.block_bytes;
      uint8_t* codes = block + layout_.meta_bytes;
      for (int gi = 0; gi < n_groups; ++gi) {
        const int c0 = gi * g, c1 = std::min(d_, c0 + g);
        float mn = INFINITY, mx = -INFINITY;
        for (int c = c0; c < c1; ++c) {
          mn = std::min(mn, xt[c]);
          mx = std::max(mx, xt[c]);
        }
        float scale, zero;
        record(block + 4 * gi, mn, mx, scale, zero);
        for (int c = c0; c < c1; ++c)
          put_code(codes, static_cast<uint64_t>(c) * b, static_cast<uint32_t>(b),
                   quant(xt[c], scale, zero));
      }
    }
  }
}

void KiviCodec::decode_latent(const uint8_t* packed, int n_tokens, float* latent) const {
  const int cd = static_cast<int>(layout_.code_dim);
  const uint8_t* end = packed + layout::packed_bytes(layout_, static_cast<uint64_t>(n_tokens));
  const uint32_t b = layout_.bits;
  const bool per_channel = dec_.side == Side::kK;
  std::vector<float> scale(layout_.n_records), zero(layout_.n_records);
  std::vector<uint16_t> rec_of(static_cast<size_t>(d_));
  for (int c = 0; c < d_; ++c) rec_of[static_cast<size_t>(c)] = static_cast<uint16_t>(per_channel ? c : c / dec_.group_size);
  const int tpb = static_cast<int>(layout_.tokens_per_block);
  for (int t0 = 0; t0 < n_tokens; t0 += tpb) {
    const uint8_t* block = layout::block_ptr(layout_, packed, static_cast<uint64_t>(t0));
    for (uint32_t r = 0; r < layout_.n_records; ++r) {
      scale[r] = f16_to_f32(layout::load_u16le(block + 4 * r));
      zero[r] = f16_to_f32(layout::load_u16le(block + 4 * r + 2));
    }
    const int nt = std::min(tpb, n_tokens - t0);
    for (int tt = 0; tt < nt; ++tt) {
      float* lt = latent + static_cast<size_t>(t0 + tt) * cd;
      for_each_code(block + layout_.meta_bytes, static_cast<uint64_t>(tt) * layout_.code_bits_per_token, b,
                    static_cast<uint32_t>(d_), end, [&](uint32_t c, uint32_t q) {
                      const uint16_t r = rec_of[c];
                      lt[c] = static_cast<float>(q) * scale[r] + zero[r];
                    });
    }
  }
}

}  // namespace kvq::codec::detail
