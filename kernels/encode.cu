// The GPU encoder's launch (encode_kernels.cuh holds the device code, which the CPU emulation in
// tests/cuda runs as well).
#include <algorithm>
#include <cmath>
#include <string>

#include "cuda_common.cuh"
#include "kvq/cuda/encode.hpp"
#include "kvq/cuda/encode_batch.hpp"
#include "kvq/cuda/encode_kernels.cuh"
#include "kvq/format/coding_kinds.hpp"

namespace kvq::cuda {

static_assert(detail::kEncMaxDim == kMaxHeadDim, "the encoder's shared tiles are sized for kMaxHeadDim");

void encode_async(const DeviceHead& head, const float* x_dev, int n_tokens, uint8_t* out_dev, void* stream) {
  const codec::HeadCodec& c = head.codec();
  // Named only on an error: this is on the decode step's path.
  auto who = [&c] { return "cuda encode " + decision_name(c.decision()); };
  if (n_tokens < 0) throw Error("", who(), "n_tokens must be >= 0, got " + std::to_string(n_tokens));
  if (n_tokens == 0) return;
  if (!x_dev) throw Error("", who(), "input pointer is null");
  if (!out_dev) throw Error("", who(), "output pointer is null");
  const int n_blocks = detail::encode_units(c.layout(), n_tokens);
  detail::encode_kernel<<<n_blocks, detail::kThreads, 0, static_cast<cudaStream_t>(stream)>>>(
      head.impl().d_view.as<detail::DevHead>(), x_dev, n_tokens, out_dev);
  KVQ_CUDA_CHECK(cudaGetLastError());
}

static_assert(sizeof(EncodeJob) == sizeof(detail::EncJob) && alignof(EncodeJob) == alignof(detail::EncJob),
              "EncodeJob is the device's EncJob");

const void* device_view(const DeviceHead& head) { return head.impl().d_view.as<detail::DevHead>(); }

void encode_batch_async(const EncodeJob* jobs_dev, int n_jobs, int n_tokens, void* stream) {
  const char* who = "cuda encode batch";
  if (n_jobs < 0 || n_jobs > 65535)
    throw Error("", who, "n_jobs must be in 0..65535, got " + std::to_string(n_jobs));
  if (n_tokens < 0) throw Error("", who, "n_tokens must be >= 0, got " + std::to_string(n_tokens));
  if (n_jobs == 0 || n_tokens == 0) return;
  if (!jobs_dev) throw Error("", who, "job table pointer is null");
  // Enough thread blocks for the job with the most units of work (minifloat and KIVI V: one token
  // each); jobs with fewer (TQ and low-rank tiles, KIVI K blocks) leave the rest idle. Capped: the
  // kernel grid-strides.
  const unsigned bx = static_cast<unsigned>(std::min(n_tokens, 1 << 16));
  detail::encode_batch_kernel<<<dim3(bx, static_cast<unsigned>(n_jobs)), detail::kThreads, 0,
                                static_cast<cudaStream_t>(stream)>>>(
      reinterpret_cast<const detail::EncJob*>(jobs_dev), n_tokens);
  KVQ_CUDA_CHECK(cudaGetLastError());
}

namespace detail {
void launch_kivi_k_append(const KiviKAppend* jobs_dev, int n_jobs, int batch, const int32_t* lengths, int capacity,
                          cudaStream_t stream) {
  if (n_jobs == 0) return;
  kivi_k_append_kernel<<<dim3(static_cast<unsigned>(batch), static_cast<unsigned>(n_jobs)), kThreads, 0, stream>>>(
      jobs_dev, lengths, capacity);
  KVQ_CUDA_CHECK(cudaGetLastError());
}
}  // namespace detail

void DeviceHead::encode(const float* x, int n_tokens, uint8_t* out) const {
  KVQ_ASSERT(n_tokens >= 0);
  if (n_tokens == 0) return;
  const codec::HeadCodec& c = impl_->codec;
  const int d = c.head_dim();
  for (size_t i = 0; i < static_cast<size_t>(n_tokens) * d; ++i)
    if (!std::isfinite(x[i]))
      throw Error("", "encode " + decision_name(c.decision()),
                  "non-finite input at token " + std::to_string(i / d) + ", dim " + std::to_string(i % d));
  const size_t in_bytes = sizeof(float) * static_cast<size_t>(n_tokens) * c.head_dim();
  const size_t out_bytes = c.packed_bytes(n_tokens);
  detail::DeviceBuffer d_in(in_bytes), d_out(out_bytes);
  d_in.upload(x, in_bytes);
  encode_async(*this, d_in.as<float>(), n_tokens, d_out.as<uint8_t>(), nullptr);
  d_out.download(out, out_bytes);
}

}  // namespace kvq::cuda
