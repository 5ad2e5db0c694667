#pragma once
// tq-groups on the device (the CPU codec: lib/codec/src/kind_tq_groups.cpp): latent = rho~ * c per
// group in rotated coordinates (rho~ / ||c|| * c with norm correction), x[dims] = Pi_g^T latent_g.
// Device functions are called through device_codec.cuh's dispatch; tq_dev_tables is host code.
#include <stdint.h>

#include <vector>

#include "kvq/codec/codec.hpp"
#include "kvq/cuda/dev_head.cuh"

namespace kvq::cuda::detail {

// rho~ of TQ group g of the token whose block is blk: the fp16 record or the compact one
// (layout::tq_group_norm, the same float operations as the CPU decoder).
__device__ inline float tq_rho(const DevHead& h, const uint8_t* blk, uint32_t g) {
  return layout::tq_group_norm(h.L, blk, g, h.norm_levels, h.ratios);
}

// Norm correction's scale of TQ group g of a token (its block blk, code bits from tb):
// rho~ / ||c||, ||c||^2 summed in float over the group's m centroids in order (the CPU sums in
// double: values agree to float rounding, not bit for bit). Not cooperative, O(m).
__device__ inline float tq_norm_scale(const DevHead& h, const uint8_t* blk, uint32_t tb, uint32_t g) {
  const layout::LayoutGroup& G = h.L.groups[g];
  const uint8_t* stream = blk + h.L.meta_bytes;
  const float* cb = h.codebook + h.cb_off[g];
  float n2 = 0.f;
  for (uint32_t j = 0; j < G.dim; ++j) {
    const float c = cb[layout::get_code(stream, tb + G.code_bit_offset + j * G.bits, G.bits)];
    n2 += c * c;
  }
  const float rho = tq_rho(h, blk, g);
  return n2 > 0.f ? rho / sqrtf(n2) : 0.f;
}

// Latent value k of the token whose block is blk (code bits from tb). With norm correction this
// costs O(m) (the group's norm); tq_decode_latent_tile_nc shares that work across a warp instead.
__device__ inline float tq_latent_value(const DevHead& h, const uint8_t* blk, uint32_t tb, uint32_t k) {
  const uint8_t* stream = blk + h.L.meta_bytes;
  const uint32_t g = h.group_of[k];
  const layout::LayoutGroup& G = h.L.groups[g];
  const float rho = h.norm_correction ? tq_norm_scale(h, blk, tb, g) : tq_rho(h, blk, g);
  const uint32_t code = layout::get_code(stream, tb + G.code_bit_offset + (k - h.latent_off[g]) * G.bits, G.bits);
  return rho * h.codebook[h.cb_off[g] + code];
}

__device__ inline uint32_t tq_code_value(const DevHead& h, const uint8_t* stream, uint32_t tb, uint32_t k) {
  const layout::LayoutGroup& G = h.L.groups[h.group_of[k]];
  return layout::get_code(stream, tb + G.code_bit_offset + (k - h.latent_off[h.group_of[k]]) * G.bits, G.bits);
}

// Latents of tokens t0 .. t0+nt-1 into w[t * ldw + k] with norm correction: each (token, group)
// to one warp, whose lanes sum ||c||^2 with shuffles (the same order on every warp size 32
// device) and then scale the group's latents. Cooperative (blockDim.x a multiple of 32), no
// synchronisation.
__device__ inline void tq_decode_latent_tile_nc(const DevHead& h, const uint8_t* base, uint32_t t0, int nt, float* w,
                                                int ldw) {
  const PackedLayout& L = h.L;
  const int lane = (int)(threadIdx.x & 31), warp = (int)(threadIdx.x >> 5);
  const int n_warps = (int)(blockDim.x >> 5);
  const int ng = (int)L.n_groups;
  for (int item = warp; item < nt * ng; item += n_warps) {  // warp-uniform trip count
    const int t = item / ng, g = item - t * ng;
    const uint32_t tok = t0 + (uint32_t)t;
    const uint8_t* blk = layout::block_ptr(L, base, tok);
    const uint8_t* stream = blk + L.meta_bytes;
    const uint32_t tb = layout::token_code_bit_offset(L, tok);
    const layout::LayoutGroup& G = L.groups[g];
    const float* cb = h.codebook + h.cb_off[g];
    float* wt = w + t * ldw + h.latent_off[g];
    float n2 = 0.f;
    for (int j = lane; j < (int)G.dim; j += 32) {
      const float c = cb[layout::get_code(stream, tb + G.code_bit_offset + (uint32_t)j * G.bits, G.bits)];
      wt[j] = c;
      n2 += c * c;
    }
    for (int o = 16; o > 0; o >>= 1) n2 += __shfl_xor_sync(0xffffffffu, n2, o);
    const float rho = tq_rho(h, blk, g);
    const float s = n2 > 0.f ? rho / sqrtf(n2) : 0.f;
    for (int j = lane; j < (int)G.dim; j += 32) wt[j] *= s;  // each lane rescales its own writes
  }
}

// x[t * ldx + dims[k]] = (Pi_g^T latent_g) for nt rows. Cooperative, no synchronisation.
__device__ inline void tq_latent_to_x_tile(const DevHead& h, const float* w, int ldw, int nt, float* x, int ldx) {
  const int d = (int)h.L.head_dim;
  for (int idx = threadIdx.x; idx < nt * d; idx += blockDim.x) {
    const int t = idx / d, kk = idx - t * d;
    const uint32_t g = h.group_of[kk];
    const int m = h.L.groups[g].dim;
    const int i = kk - (int)h.latent_off[g];
    const float* pi = h.rot + h.rot_off[g];
    const float* wt = w + t * ldw + h.latent_off[g];
    float s = 0.f;
    for (int j = 0; j < m; ++j) s += pi[j * m + i] * wt[j];
    x[t * ldx + h.dims[kk]] = s;
  }
}

// qc = Pi_g q_D per group: (Pi_g q_g)_j = sum_i Pi_g[j][i] q[dims[i]]. Cooperative, no
// synchronisation.
__device__ inline void tq_query_to_latent(const DevHead& h, const float* q, float* qc) {
  const int d = (int)h.L.head_dim;
  for (int kk = threadIdx.x; kk < d; kk += blockDim.x) {
    const uint32_t g = h.group_of[kk];
    const int m = h.L.groups[g].dim;
    const int j = kk - (int)h.latent_off[g];
    const float* row = h.rot + h.rot_off[g] + j * m;
    const int32_t* dg = h.dims + h.latent_off[g];
    float s = 0.f;
    for (int i = 0; i < m; ++i) s += row[i] * q[dg[i]];
    qc[kk] = s;
  }
}

// Host: the DevHead fields of a TQ codec. upload(const std::vector<T>&) returns the device address
// of a copy.
template <class Upload>
void tq_dev_tables(const codec::HeadCodec& c, DevHead& v, Upload&& upload) {
  std::vector<float> rot, rot_t, cb, th;
  const size_t d = static_cast<size_t>(c.head_dim());
  std::vector<int32_t> dims(d);
  std::vector<uint8_t> group_of(d);
  for (size_t g = 0; g < c.tq_groups().size(); ++g) {
    const auto& G = c.tq_groups()[g];
    v.latent_off[g] = G.latent_offset;
    v.rot_off[g] = static_cast<uint32_t>(rot.size());
    v.cb_off[g] = static_cast<uint32_t>(cb.size());
    rot.insert(rot.end(), G.rotation->matrix.begin(), G.rotation->matrix.end());
    rot_t.insert(rot_t.end(), G.rotation->transpose.begin(), G.rotation->transpose.end());
    cb.insert(cb.end(), G.centroids.begin(), G.centroids.end());
    // Thresholds share the centroids' offsets: 2^bits slots, the last one unused.
    th.insert(th.end(), G.thresholds.begin(), G.thresholds.end());
    th.push_back(INFINITY);
    for (size_t j = 0; j < G.dims.size(); ++j) {
      dims[G.latent_offset + j] = G.dims[j];
      group_of[G.latent_offset + j] = static_cast<uint8_t>(g);
    }
  }
  v.rot = upload(rot);
  v.codebook = upload(cb);
  v.rot_t = upload(rot_t);
  v.thresholds = upload(th);
  v.dims = upload(dims);
  v.group_of = upload(group_of);
  v.norm_correction = c.decision().norm_correction ? 1u : 0u;
  if (c.layout().ratio_bits > 0) {
    v.norm_levels = upload(c.norm_levels());
    v.ratios = upload(c.ratio_codebook());
  }
}

}  // namespace kvq::cuda::detail
