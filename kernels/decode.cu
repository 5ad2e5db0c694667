// Packed -> fp32 decoder kernels (all coding kinds), device tables of a HeadCodec, availability.
#include <cstring>

#include "cuda_common.cuh"
#include "kvq/cuda/decode_kernels.cuh"
#include "kvq/codec/layout.hpp"

bool kvq_cuda_available() {
  static const bool ok = [] {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
      cudaGetLastError();  // clear the sticky "no device / no driver" error
      return false;
    }
    return n > 0;
  }();
  return ok;
}

namespace kvq::cuda {
namespace detail {

void require_device() {
  if (!kvq_cuda_available()) throw Error("", "cuda", "no usable CUDA device");
}

}  // namespace detail

using detail::DeviceBuffer;

DeviceHead::DeviceHead(const codec::HeadCodec& c) {
  detail::reject_unsupported_kind(c);  // before the device check: the same answer on every machine
  detail::require_device();
  const int d = c.head_dim();
  if (d > kMaxHeadDim)
    throw Error("", "cuda: " + codec::decision_name(c.decision()),
                "head_dim " + std::to_string(d) + " exceeds the kernels' limit " +
                    std::to_string(kMaxHeadDim));
  impl_ = std::make_unique<Impl>(c);
  auto& tables = impl_->tables;
  impl_->view = detail::make_dev_head(c, [&tables](const auto& vec) {
    tables.push_back(detail::upload_vector(vec));
    using T = typename std::decay_t<decltype(vec)>::value_type;
    return static_cast<const T*>(tables.back().template as<T>());
  });
  const detail::DevHead& v = impl_->view;
  impl_->d_view.reset(sizeof(detail::DevHead));
  impl_->d_view.upload(&v, sizeof(v));
}

DeviceHead::~DeviceHead() = default;
DeviceHead::DeviceHead(DeviceHead&&) noexcept = default;
DeviceHead& DeviceHead::operator=(DeviceHead&&) noexcept = default;

const codec::HeadCodec& DeviceHead::codec() const { return impl_->codec; }

void DeviceHead::decode(const uint8_t* packed, int n_tokens, float* out) const {
  KVQ_ASSERT(n_tokens >= 0);
  if (n_tokens == 0) return;
  const codec::HeadCodec& c = impl_->codec;
  const size_t in_bytes = c.packed_bytes(n_tokens);
  const size_t out_bytes = sizeof(float) * static_cast<size_t>(n_tokens) * c.head_dim();
  DeviceBuffer d_in(in_bytes), d_out(out_bytes);
  d_in.upload(packed, in_bytes);
  const int blocks = (n_tokens + detail::kDecodeTile - 1) / detail::kDecodeTile;
  const size_t smem = sizeof(float) * detail::kDecodeTile * c.code_dim();
  detail::decode_kernel<<<blocks, detail::kThreads, smem>>>(
      impl_->d_view.as<detail::DevHead>(), d_in.as<uint8_t>(), n_tokens, d_out.as<float>());
  KVQ_CUDA_CHECK(cudaGetLastError());
  d_out.download(out, out_bytes);
}

namespace {
void run_latent(const DeviceHead::Impl& impl, const uint8_t* packed, int n_tokens, float* latent,
                uint8_t* codes) {
  KVQ_ASSERT(n_tokens >= 0);
  if (n_tokens == 0) return;
  const codec::HeadCodec& c = impl.codec;
  const size_t in_bytes = c.packed_bytes(n_tokens);
  const size_t n = static_cast<size_t>(n_tokens) * c.code_dim();
  DeviceBuffer d_in(in_bytes), d_out(latent ? n * sizeof(float) : n);
  d_in.upload(packed, in_bytes);
  const int blocks = static_cast<int>(std::min<size_t>((n + detail::kThreads - 1) / detail::kThreads, 4096));
  detail::latent_kernel<<<blocks, detail::kThreads>>>(impl.d_view.as<detail::DevHead>(),
                                                      d_in.as<uint8_t>(), n_tokens,
                                                      latent ? d_out.as<float>() : nullptr,
                                                      latent ? nullptr : d_out.as<uint8_t>());
  KVQ_CUDA_CHECK(cudaGetLastError());
  if (latent) d_out.download(latent, n * sizeof(float));
  else d_out.download(codes, n);
}
}  // namespace

void DeviceHead::decode_latent(const uint8_t* packed, int n_tokens, float* latent) const {
  run_latent(*impl_, packed, n_tokens, latent, nullptr);
}

void DeviceHead::unpack_codes(const uint8_t* packed, int n_tokens, uint8_t* codes) const {
  run_latent(*impl_, packed, n_tokens, nullptr, codes);
}

}  // namespace kvq::cuda

// Device-resident decode timing and the device peak bandwidth (bench/cuda, scripts/gpu-check).
namespace kvq::cuda {

DecodeTiming time_decode(const DeviceHead& head, const uint8_t* packed, int n_tokens, int reps) {
  detail::require_device();
  KVQ_ASSERT(n_tokens > 0 && reps > 0);
  const auto& impl = head.impl();
  const codec::HeadCodec& c = impl.codec;
  const size_t in_bytes = c.packed_bytes(n_tokens);
  const size_t out_bytes = sizeof(float) * size_t(n_tokens) * size_t(c.head_dim());
  detail::DeviceBuffer d_in(in_bytes), d_out(out_bytes);
  d_in.upload(packed, in_bytes);
  const int blocks = (n_tokens + detail::kDecodeTile - 1) / detail::kDecodeTile;
  const size_t smem = sizeof(float) * detail::kDecodeTile * c.code_dim();
  auto launch = [&] {
    detail::decode_kernel<<<blocks, detail::kThreads, smem>>>(impl.d_view.as<detail::DevHead>(),
                                                              d_in.as<uint8_t>(), n_tokens, d_out.as<float>());
  };
  launch();  // warm-up (module load, caches)
  KVQ_CUDA_CHECK(cudaDeviceSynchronize());
  cudaEvent_t a, b;
  KVQ_CUDA_CHECK(cudaEventCreate(&a));
  KVQ_CUDA_CHECK(cudaEventCreate(&b));
  KVQ_CUDA_CHECK(cudaEventRecord(a));
  for (int i = 0; i < reps; ++i) launch();
  KVQ_CUDA_CHECK(cudaEventRecord(b));
  KVQ_CUDA_CHECK(cudaEventSynchronize(b));
  float ms = 0;
  KVQ_CUDA_CHECK(cudaEventElapsedTime(&ms, a, b));
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  KVQ_CUDA_CHECK(cudaGetLastError());
  DecodeTiming t;
  t.ms_per_launch = double(ms) / reps;
  t.bytes_per_launch = double(in_bytes + out_bytes);
  return t;
}

double device_peak_bandwidth_gbps() {
  detail::require_device();
  int khz = 0, bus_bits = 0;
  KVQ_CUDA_CHECK(cudaDeviceGetAttribute(&khz, cudaDevAttrMemoryClockRate, 0));
  KVQ_CUDA_CHECK(cudaDeviceGetAttribute(&bus_bits, cudaDevAttrGlobalMemoryBusWidth, 0));
  return 2.0 * double(khz) * 1e3 * double(bus_bits) / 8.0 / 1e9;
}

std::string device_name() {
  detail::require_device();
  cudaDeviceProp p{};
  KVQ_CUDA_CHECK(cudaGetDeviceProperties(&p, 0));
  return p.name;
}

}  // namespace kvq::cuda
