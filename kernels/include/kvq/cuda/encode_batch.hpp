#pragma once
// Many heads' GPU encodes in one kernel launch: the decode step's append (one new token for every
// (KV head, side) of a layer) costs one launch instead of one per head. Same bytes as encode_async
// (kvq/cuda/encode.hpp) per job.
#include <cstdint>

#include "kvq/cuda/cuda.hpp"

namespace kvq::cuda {

// One job of a batch, in device memory: `head` (device_view(h) of a DeviceHead that outlives the
// launch) codes n_tokens rows [n_tokens][d] at x into codec().packed_bytes(n_tokens) bytes at out
// (device pointers). The table lives on the device so that its owner (e.g. a GPU-resident cache)
// can fill or advance it with its own kernels or copies, outside a captured graph or inside one.
struct EncodeJob {
  const void* head = nullptr;
  const float* x = nullptr;
  uint8_t* out = nullptr;
};

// The device address of a DeviceHead's view, for EncodeJob::head.
const void* device_view(const DeviceHead& head);

// Runs jobs_dev[0 .. n_jobs) (a device array) in one launch, asynchronously on `stream` (a
// cudaStream_t; nullptr = the default stream): no allocation, no host copy, no synchronisation, so it
// can be captured in a CUDA graph. Throws kvq::Error only for invalid arguments (checked on the
// host: counts, null table); the jobs themselves are not read on the host.
void encode_batch_async(const EncodeJob* jobs_dev, int n_jobs, int n_tokens, void* stream = nullptr);

}  // namespace kvq::cuda
