#pragma once
// GPU encoder: codes identical to codec::HeadCodec::encode, bit for bit, for every coding kind.
#include <cstdint>
#include "kvq/cuda/cuda.hpp"
namespace kvq::cuda {
// x: [n_tokens][head_dim] fp32 in device memory; out: head.codec().packed_bytes(n_tokens) bytes in
// device memory, the frozen packed layout. Asynchronous on `stream` (a cudaStream_t; nullptr = the
// default stream): no allocation, no host copy, no synchronisation, so it can be captured in a
// CUDA graph. Throws kvq::Error only for invalid arguments (checked on the host).
void encode_async(const DeviceHead& head, const float* x_dev, int n_tokens, uint8_t* out_dev,
                  void* stream = nullptr);
}  // namespace kvq::cuda
