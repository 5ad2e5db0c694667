#pragma once
// The device view of one HeadCodec (DevHead) and the constants every kernel shares. Included by the
// per-kind device code (kind_*.cuh), device_codec.cuh and the kernels; plain C++ outside nvcc so
// the CPU emulation (tests/cuda) compiles it.
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
  // The encoder's tables (encode_kernels.cuh), laid out for coalesced reads across threads.
  const float* rot_t;                       // TQ: Pi_g^T (m x m, row-major) at rot_off[g]
  const float* thresholds;                  // TQ: group g's 2^bits - 1 thresholds at cb_off[g]
  const float* folded_t;                    // low-rank: M^T, [d][r]
  float mf_scale;                           // minifloat: FP8 per-head scale / NVFP4 global scale
  uint32_t reserved_;                       // keeps the struct a whole number of 8-byte words
};

// One KIVI K head of a cache layer for kivi_k_append_kernel (encode_kernels.cuh).
struct KiviKAppend {
  const DevHead* head;
  const float* x;   // [batch][d] the step's new K rows of this head
  float* rows;      // [batch][group_size][d] each sequence's open group, fp32
  uint8_t* stream;  // sequence b's region at stream + b * seq_bytes
  unsigned long long seq_bytes;
};

// Copies a DevHead from global memory into shared memory (word by word), then synchronises.
__device__ inline void load_head(const DevHead* g, DevHead* s) {
  static_assert(sizeof(DevHead) % 4 == 0, "DevHead copied as 32-bit words");
  const uint32_t* src = reinterpret_cast<const uint32_t*>(g);
  uint32_t* dst = reinterpret_cast<uint32_t*>(s);
  for (int i = threadIdx.x; i < (int)(sizeof(DevHead) / 4); i += blockDim.x) dst[i] = src[i];
  __syncthreads();
}

}  // namespace kvq::cuda::detail
