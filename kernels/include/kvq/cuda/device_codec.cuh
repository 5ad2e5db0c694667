#pragma once
// Device-side decoding shared by the decoder and attention kernels (included by kernels/*.cu, and
// by tests/cuda/test_kernel_emulation.cpp, which runs the same code on CPU threads): the one
// dispatch on the kind, over each kind's device code in kind_<name>.cuh (named after its CPU
// codec, lib/codec/src/kind_<name>.cpp). Functions marked cooperative are called by all threads of
// the block with the same arguments; functions that synchronise say so.
//
// Two domains per token:
//   latent  what the codes mean before the linear back-transform (code_dim values): TQ rho~*c in
//           rotated coordinates (rho~/||c|| * c per group with norm correction), low-rank the dequantized z, KIVI and minifloat the decoded x itself;
//   x       the head vector: TQ x[dims] = Pi^T latent_g per group; low-rank x = mu + M^T z
//           (M = H P D U_r^T, the Hadamard folded into the basis by the CPU codec); KIVI x = latent.
// The attention kernel scores keys and accumulates values in the latent domain (q is moved into
// it once), so a key costs O(code_dim) instead of a d x d back-rotation.
#include <math.h>
#include <stdint.h>
#if defined(__CUDACC__)
#include <cuda_runtime.h>
#endif

#include "kvq/cuda/dev_head.cuh"
#include "kvq/cuda/kind_kivi.cuh"
#include "kvq/cuda/kind_lowrank_hadamard.cuh"
#include "kvq/cuda/kind_minifloat.cuh"
#include "kvq/cuda/kind_tq_groups.cuh"
#include "kvq/format/packed_layout.hpp"

namespace kvq::cuda::detail {

// Latent value k of token tok (not cooperative; any thread). TQ with norm correction costs O(m)
// (the group's norm); decode_latent_tile shares that work across a warp instead.
__device__ inline float latent_value(const DevHead& h, const uint8_t* base, uint32_t tok,
                                     uint32_t k) {
  const PackedLayout& L = h.L;
  const uint8_t* blk = layout::block_ptr(L, base, tok);
  const uint32_t tb = layout::token_code_bit_offset(L, tok);
  if (L.kind == layout::kKindTqGroups) return tq_latent_value(h, blk, tb, k);
  if (L.kind == layout::kKindLowRankHadamard) return lrh_latent_value(h, blk, tb, k);
  if (L.kind == layout::kKindMinifloat) return mf_latent_value(h, blk, tb, k);
  return kivi_latent_value(h, blk, tb, k);
}

__device__ inline uint32_t code_value(const DevHead& h, const uint8_t* base, uint32_t tok,
                                      uint32_t k) {
  const PackedLayout& L = h.L;
  const uint8_t* stream = layout::block_ptr(L, base, tok) + L.meta_bytes;
  const uint32_t tb = layout::token_code_bit_offset(L, tok);
  if (L.kind == layout::kKindTqGroups) return tq_code_value(h, stream, tb, k);
  return layout::get_code(stream, tb + k * L.bits, L.bits);
}

// Latents of tokens t0 .. t0+nt-1 into w[t * ldw + k]. Cooperative, no synchronisation.
// blockDim.x must be a multiple of 32 (kThreads): TQ with norm correction gives each (token,
// group) to one warp (tq_decode_latent_tile_nc).
__device__ inline void decode_latent_tile(const DevHead& h, const uint8_t* base, uint32_t t0,
                                          int nt, float* w, int ldw) {
  if (h.L.kind == layout::kKindTqGroups && h.norm_correction) {
    tq_decode_latent_tile_nc(h, base, t0, nt, w, ldw);
    return;
  }
  const int cd = (int)h.L.code_dim;
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
  if (L.kind == layout::kKindTqGroups) {
    tq_latent_to_x_tile(h, w, ldw, nt, x, ldx);
  } else if (L.kind == layout::kKindLowRankHadamard) {
    lrh_latent_to_x_tile(h, w, ldw, nt, x, ldx);
  } else {
    const int d = (int)L.head_dim;
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
  const int tid = threadIdx.x;
  if (L.kind == layout::kKindLowRankHadamard) {
    lrh_query_to_latent(h, q, qc, q_off, red);
    __syncthreads();
    return;
  }
  if (L.kind == layout::kKindTqGroups) {
    tq_query_to_latent(h, q, qc);
  } else {
    for (int i = tid; i < (int)L.head_dim; i += blockDim.x) qc[i] = q[i];
  }
  if (tid == 0) *q_off = 0.f;
  __syncthreads();
}

}  // namespace kvq::cuda::detail
