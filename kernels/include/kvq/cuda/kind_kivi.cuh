#pragma once
// kivi on the device (the CPU codec: lib/codec/src/kind_kivi.cpp): the latent is x itself, decoded
// from the fp16 scale/zero record of its channel (K) or channel group (V). Called through
// device_codec.cuh's dispatch; KIVI has no tables.
#include <stdint.h>

#include "kvq/cuda/dev_head.cuh"

namespace kvq::cuda::detail {

__device__ inline float kivi_latent_value(const DevHead& h, const uint8_t* blk, uint32_t tb, uint32_t k) {
  const PackedLayout& L = h.L;
  const uint8_t* rec = blk + 4 * (L.side == layout::kSideK ? k : k / L.group_size);
  const float scale = layout::f16_to_f32(layout::load_u16le(rec));
  const float zero = layout::f16_to_f32(layout::load_u16le(rec + 2));
  const uint32_t q = layout::get_code(blk + L.meta_bytes, tb + k * L.bits, L.bits);
  return __fmul_rn((float)q, scale) + zero;  // no FMA contraction: same rounding as the CPU
}

}  // namespace kvq::cuda::detail
