#pragma once
// Decoder kernels (packed -> fp32, codes, latents) and the device view of a HeadCodec's tables.
// Free of CUDA runtime calls so tests/cuda/test_kernel_emulation.cpp runs this exact code on CPU
// threads; kernels/decode.cu adds allocation, copies and launches. Include from one .cu only
// (kernels are not inline).
#include <math.h>
#include <stdint.h>

#include <algorithm>
#include <vector>

#include "kvq/codec/codec.hpp"
#include "kvq/cuda/device_codec.cuh"
#include "kvq/format/decision_layout.hpp"
#include "kvq/util/error.hpp"

#ifndef KVQ_DYNAMIC_SMEM
#define KVQ_DYNAMIC_SMEM(name) extern __shared__ float name[]
#endif

namespace kvq::cuda::detail {

// Kinds the kernels do not decode yet: a one-line kvq::Error naming the head, never a wrong decode.
// Every kind the allocator writes is supported today (minifloat since the GPU encoder); kept as the
// one place a new kind is turned away.
inline void reject_unsupported_kind(const codec::HeadCodec& c) {
  if (static_cast<uint32_t>(c.decision().kind) >= layout::kNumGpuKinds)
    throw Error("", "cuda: " + decision_name(c.decision()), "coding kind not supported on GPU");
}

// Device view of a HeadCodec's tables. upload(const std::vector<T>&) returns the device address
// of a copy (the .cu uploads with cudaMemcpy; the emulation returns host pointers).
template <class Upload>
DevHead make_dev_head(const codec::HeadCodec& c, Upload&& upload) {
  DevHead v;
  std::fill(reinterpret_cast<char*>(&v), reinterpret_cast<char*>(&v) + sizeof(v), 0);
  v.L = c.layout();
  switch (c.decision().kind) {
    case CodingKind::kTqGroups: tq_dev_tables(c, v, upload); break;
    case CodingKind::kLowRankHadamard: lrh_dev_tables(c, v, upload); break;
    case CodingKind::kKivi: break;
    case CodingKind::kMinifloat: v.mf_scale = c.decision().scale; break;
    case CodingKind::kVllmTurboQuant: reject_unsupported_kind(c); break;  // CPU-only (vLLM runs its own kernels)
  }
  return v;
}

// One block per kDecodeTile tokens: latents into shared memory, then the back-transform straight
// to global memory. Dynamic shared memory: kDecodeTile * code_dim floats.
__global__ void __launch_bounds__(kThreads)
decode_kernel(const DevHead* gh, const uint8_t* packed, int n_tokens, float* out) {
  __shared__ DevHead h;
  KVQ_DYNAMIC_SMEM(w);
  load_head(gh, &h);
  const int t0 = blockIdx.x * kDecodeTile;
  const int nt = min(kDecodeTile, n_tokens - t0);
  const int cd = (int)h.L.code_dim;
  decode_latent_tile(h, packed, (uint32_t)t0, nt, w, cd);
  __syncthreads();
  latent_to_x_tile(h, w, cd, nt, out + (size_t)t0 * h.L.head_dim, (int)h.L.head_dim);
}

// Latents and/or integer codes of every (token, code), grid-stride.
__global__ void __launch_bounds__(kThreads)
latent_kernel(const DevHead* gh, const uint8_t* packed, int n_tokens, float* latent,
              uint8_t* codes) {
  __shared__ DevHead h;
  load_head(gh, &h);
  const size_t cd = h.L.code_dim;
  const size_t total = (size_t)n_tokens * cd;
  for (size_t idx = blockIdx.x * (size_t)blockDim.x + threadIdx.x; idx < total;
       idx += (size_t)gridDim.x * blockDim.x) {
    const uint32_t t = (uint32_t)(idx / cd), k = (uint32_t)(idx % cd);
    if (latent) latent[idx] = latent_value(h, packed, t, k);
    if (codes) codes[idx] = (uint8_t)code_value(h, packed, t, k);
  }
}

}  // namespace kvq::cuda::detail
