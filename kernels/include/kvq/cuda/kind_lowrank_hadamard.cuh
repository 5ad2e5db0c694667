#pragma once
// lowrank-hadamard on the device (the CPU codec: lib/codec/src/kind_lowrank_hadamard.cpp): latent =
// the dequantized z, x = mu + M^T z (M = H P D U_r^T, the Hadamard folded into the basis by the
// CPU codec). Device functions are called through device_codec.cuh's dispatch; lrh_dev_tables is
// host code.
#include <stdint.h>

#include <vector>

#include "kvq/codec/codec.hpp"
#include "kvq/cuda/dev_head.cuh"

namespace kvq::cuda::detail {

__device__ inline float lrh_latent_value(const DevHead& h, const uint8_t* blk, uint32_t tb, uint32_t k) {
  const PackedLayout& L = h.L;
  const float step = layout::f16_to_f32(layout::load_u16le(blk)) * h.step_unit;
  const int half = 1 << (L.bits - 1);
  const int q = (int)layout::get_code(blk + L.meta_bytes, tb + k * L.bits, L.bits);
  return ((float)(q - half) + 0.5f) * step;
}

// x = mu + M^T z for nt rows. Cooperative, no synchronisation.
__device__ inline void lrh_latent_to_x_tile(const DevHead& h, const float* w, int ldw, int nt, float* x, int ldx) {
  const int d = (int)h.L.head_dim;
  const int r = (int)h.L.code_dim;
  for (int idx = threadIdx.x; idx < nt * d; idx += blockDim.x) {
    const int t = idx / d, i = idx - t * d;
    const float* wt = w + t * ldw;
    float s = h.mean[i];
    for (int p = 0; p < r; ++p) s += h.folded[p * d + i] * wt[p];
    x[t * ldx + i] = s;
  }
}

// qc = M q and *q_off = q . mu. Synchronises; red: kWarps floats of scratch.
__device__ inline void lrh_query_to_latent(const DevHead& h, const float* q, float* qc, float* q_off, float* red) {
  const int d = (int)h.L.head_dim;
  const int r = (int)h.L.code_dim;
  const int tid = threadIdx.x;
  for (int p = tid; p < r; p += blockDim.x) {  // M q
    const float* row = h.folded + p * d;
    float s = 0.f;
    for (int i = 0; i < d; ++i) s += row[i] * q[i];
    qc[p] = s;
  }
  float part = 0.f;
  for (int i = tid; i < d; i += blockDim.x) part += q[i] * h.mean[i];
  for (int o = 16; o > 0; o >>= 1) part += __shfl_xor_sync(0xffffffffu, part, o);
  if ((tid & 31) == 0) red[tid >> 5] = part;
  __syncthreads();
  if (tid == 0) {
    float s = 0.f;
    for (int wi = 0; wi < (int)(blockDim.x >> 5); ++wi) s += red[wi];
    *q_off = s;
  }
}

// Host: the DevHead fields of a low-rank codec.
template <class Upload>
void lrh_dev_tables(const codec::HeadCodec& c, DevHead& v, Upload&& upload) {
  v.folded = upload(c.folded_basis());
  const std::vector<float>& m = c.folded_basis();  // [r][d] -> M^T [d][r] for the encoder
  const size_t r = c.layout().code_dim, d = c.layout().head_dim;
  std::vector<float> mt(m.size());
  for (size_t p = 0; p < r; ++p)
    for (size_t i = 0; i < d; ++i) mt[i * r + p] = m[p * d + i];
  v.folded_t = upload(mt);
  v.mean = upload(c.mean());
  v.step_unit = c.step_unit();
}

}  // namespace kvq::cuda::detail
