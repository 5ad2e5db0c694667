#pragma once
// Device-side decoding shared by the decoder and attention kernels (included by kernels/*.cu, and
// by tests/cuda/test_kernel_emulation.cpp, which runs the same code on CPU threads). Functions
// marked cooperative are called by all threads of the block with the same arguments; functions
// that synchronise say so.
//
// Two domains per token:
//   latent  what the codes mean before the linear back-transform (code_dim values): TQ rho~*c in
//           rotated coordinates (rho~/||c|| * c per group with norm correction), low-rank the dequantized z, KIVI the decoded x itself;
//   x       the head vector: TQ x[dims] = Pi^T latent_g per group; low-rank x = mu + M^T z
//           (M = H P D U_r^T, the Hadamard folded into the basis by the CPU codec); KIVI x = latent.
// The attention kernel scores keys and accumulates values in the latent domain (q is moved into
// it once), so a key costs O(code_dim) instead of a d x d back-rotation.
#include <math.h>
#include <stdint.h>
#if defined(__CUDACC__)
#include <cuda_runtime.h>
#endif

#include "kvq/format/packed_layout.hpp"

namespace kvq::cuda::detail {

using layout::PackedLayout;

constexpr int kThreads = 128;  // threads per block in every kernel
constexpr int kWarps = kThreads / 32;
constexpr int kTile = 8;       // tokens per tile in the attention kernel
constexpr int kDecodeTile = 16;  // tokens per block in the decode kernels

struct DevHead {
  PackedLayout L;
  uint32_t latent_off[layout::kMaxGroups];  // TQ: first latent index of group g
  uint32_t rot_off[layout::kMaxGroups];     // TQ: offset of Pi_g (m x m, row-major) in rot
  uint32_t cb_off[layout::kMaxGroups];      // TQ: offset of group g's centroids in codebook
  const float* rot;                         // TQ
  const float* codebook;                    // TQ: centroids for N(0, 1/m)
  const int32_t* dims;                      // TQ: latent index -> head coordinate
  const uint8_t* group_of;                  // TQ: latent index -> group
  const float* folded;                      // low-rank: M = H P D U_r^T, [r][d]
  const float* mean;                        // low-rank: [d]
  float step_unit;                          // low-rank: step*(b) / sqrt(r)
  uint32_t norm_correction;                 // TQ: 1 = latent rho~ / ||c|| * c (HeadDecision)
  const float* norm_levels;                 // TQ compact group norms (L.ratio_bits > 0): levels
  const float* ratios;                      // TQ compact group norms: [2^k][n_groups]
};

// rho~ of TQ group g of the token whose block is blk: the fp16 record or the compact one
// (layout::tq_group_norm, the same float operations as the CPU decoder).
__device__ inline float tq_rho(const DevHead& h, const uint8_t* blk, uint32_t g) {
  return layout::tq_group_norm(h.L, blk, g, h.norm_levels, h.ratios);
}

// Copies a DevHead from global memory into shared memory (word by word), then synchronises.
__device__ inline void load_head(const DevHead* g, DevHead* s) {
  static_assert(sizeof(DevHead) % 4 == 0, "DevHead copied as 32-bit words");
  const uint32_t* src = reinterpret_cast<const uint32_t*>(g);
  uint32_t* dst = reinterpret_cast<uint32_t*>(s);
  for (int i = threadIdx.x; i < (int)(sizeof(DevHead) / 4); i += blockDim.x) dst[i] = src[i];
  __syncthreads();
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

// Latent value k of token tok (not cooperative; any thread). With norm correction this costs
// O(m) (the group's norm); decode_latent_tile shares that work across a warp instead.
__device__ inline float latent_value(const DevHead& h, const uint8_t* base, uint32_t tok,
                                     uint32_t k) {
  const PackedLayout& L = h.L;
  const uint8_t* blk = layout::block_ptr(L, base, tok);
  const uint8_t* stream = blk + L.meta_bytes;
  const uint32_t tb = layout::token_code_bit_offset(L, tok);
  if (L.kind == layout::kKindTqGroups) {
    const uint32_t g = h.group_of[k];
    const layout::LayoutGroup& G = L.groups[g];
    const float rho = h.norm_correction ? tq_norm_scale(h, blk, tb, g) : tq_rho(h, blk, g);
    const uint32_t code =
        layout::get_code(stream, tb + G.code_bit_offset + (k - h.latent_off[g]) * G.bits, G.bits);
    return rho * h.codebook[h.cb_off[g] + code];
  }
  if (L.kind == layout::kKindLowRankHadamard) {
    const float step = layout::f16_to_f32(layout::load_u16le(blk)) * h.step_unit;
    const int half = 1 << (L.bits - 1);
    const int q = (int)layout::get_code(stream, tb + k * L.bits, L.bits);
    return ((float)(q - half) + 0.5f) * step;
  }
  // KIVI
  const uint8_t* rec = blk + 4 * (L.side == layout::kSideK ? k : k / L.group_size);
  const float scale = layout::f16_to_f32(layout::load_u16le(rec));
  const float zero = layout::f16_to_f32(layout::load_u16le(rec + 2));
  const uint32_t q = layout::get_code(stream, tb + k * L.bits, L.bits);
  return __fmul_rn((float)q, scale) + zero;  // no FMA contraction: same rounding as the CPU
}

__device__ inline uint32_t code_value(const DevHead& h, const uint8_t* base, uint32_t tok,
                                      uint32_t k) {
  const PackedLayout& L = h.L;
  const uint8_t* stream = layout::block_ptr(L, base, tok) + L.meta_bytes;
  const uint32_t tb = layout::token_code_bit_offset(L, tok);
  if (L.kind == layout::kKindTqGroups) {
    const layout::LayoutGroup& G = L.groups[h.group_of[k]];
    return layout::get_code(stream, tb + G.code_bit_offset + (k - h.latent_off[h.group_of[k]]) * G.bits,
                            G.bits);
  }
  return layout::get_code(stream, tb + k * L.bits, L.bits);
}

// Latents of tokens t0 .. t0+nt-1 into w[t * ldw + k]. Cooperative, no synchronisation.
// blockDim.x must be a multiple of 32 (kThreads): TQ with norm correction gives each (token,
// group) to one warp, whose lanes sum ||c||^2 with shuffles (the same order on every warp size
// 32 device) and then scale the group's latents.
__device__ inline void decode_latent_tile(const DevHead& h, const uint8_t* base, uint32_t t0,
                                          int nt, float* w, int ldw) {
  const int cd = (int)h.L.code_dim;
  if (h.L.kind == layout::kKindTqGroups && h.norm_correction) {
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
    return;
  }
  for (int idx = threadIdx.x; idx < nt * cd; idx += blockDim.x) {
    const int t = idx / cd, k = idx - t * cd;
    w[t * ldw + k] = latent_value(h, base, t0 + (uint32_t)t, (uint32_t)k);
  }
}

// x[t * ldx + i] = back-transform of latent row t, for nt rows. x may be shared or global
// memory. No synchronisation: callers sync before reading x.
__device__ inline void latent_to_x_tile(const DevHead& h, const float* w, int ldw, int nt,
                                        float* x, int ldx) {
  const PackedLayout& L = h.L;
  const int d = (int)L.head_dim;
  if (L.kind == layout::kKindTqGroups) {
    for (int idx = threadIdx.x; idx < nt * d; idx += blockDim.x) {
      const int t = idx / d, kk = idx - t * d;
      const uint32_t g = h.group_of[kk];
      const int m = L.groups[g].dim;
      const int i = kk - (int)h.latent_off[g];
      const float* pi = h.rot + h.rot_off[g];
      const float* wt = w + t * ldw + h.latent_off[g];
      float s = 0.f;
      for (int j = 0; j < m; ++j) s += pi[j * m + i] * wt[j];
      x[t * ldx + h.dims[kk]] = s;
    }
  } else if (L.kind == layout::kKindLowRankHadamard) {
    const int r = (int)L.code_dim;
    for (int idx = threadIdx.x; idx < nt * d; idx += blockDim.x) {
      const int t = idx / d, i = idx - t * d;
      const float* wt = w + t * ldw;
      float s = h.mean[i];
      for (int p = 0; p < r; ++p) s += h.folded[p * d + i] * wt[p];
      x[t * ldx + i] = s;
    }
  } else {
    for (int idx = threadIdx.x; idx < nt * d; idx += blockDim.x) {
      const int t = idx / d, i = idx - t * d;
      x[t * ldx + i] = w[t * ldw + i];
    }
  }
}

// Moves a query (d values, shared memory) into the latent domain: qc[k] such that
// q . x = qc . latent + q_off for every token of this head. (q_off = q . mu is the same for every
// key, so softmax ignores it; it is kept so that scores are the true logits.) Synchronises;
// *q_off and qc are valid for all threads on return. red: kWarps floats of scratch.
__device__ inline void query_to_latent(const DevHead& h, const float* q, float* qc, float* q_off,
                                       float* red) {
  const PackedLayout& L = h.L;
  const int d = (int)L.head_dim;
  const int tid = threadIdx.x;
  if (L.kind == layout::kKindTqGroups) {
    // (Pi_g q_g)_j = sum_i Pi_g[j][i] q[dims[i]]
    for (int kk = tid; kk < d; kk += blockDim.x) {
      const uint32_t g = h.group_of[kk];
      const int m = L.groups[g].dim;
      const int j = kk - (int)h.latent_off[g];
      const float* row = h.rot + h.rot_off[g] + j * m;
      const int32_t* dg = h.dims + h.latent_off[g];
      float s = 0.f;
      for (int i = 0; i < m; ++i) s += row[i] * q[dg[i]];
      qc[kk] = s;
    }
    if (tid == 0) *q_off = 0.f;
    __syncthreads();
  } else if (L.kind == layout::kKindLowRankHadamard) {
    const int r = (int)L.code_dim;
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
    __syncthreads();
  } else {
    for (int i = tid; i < d; i += blockDim.x) qc[i] = q[i];
    if (tid == 0) *q_off = 0.f;
    __syncthreads();
  }
}

}  // namespace kvq::cuda::detail
