#pragma once
// The launch sequence of the fused decode attention (defined in attention.cu, the one .cu that
// compiles attention_kernels.cuh), shared by decode_attention() and PackedKvCache::attend.
// Asynchronous on `stream`: three kernel launches, no allocation, no copy, no synchronisation.
#include <cuda_runtime.h>

#include "kvq/cuda/attention_params.cuh"

namespace kvq::cuda::detail {

int sm_count();
// Raises the kernels' dynamic shared-memory limit where the plan needs more than 48 KiB (once per
// plan, before any launch or capture).
void prepare_attention(const AttnPlan& plan);
void launch_attention(const AttnPlan& plan, const AttnParams& P, float* out, cudaStream_t stream);

}  // namespace kvq::cuda::detail
