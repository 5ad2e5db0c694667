#pragma once
// Host-side helpers shared by the kernels' .cu files: error checks, device buffers, the
// DeviceHead implementation.
#include <cuda_runtime.h>

#include <string>
#include <vector>

#include "kvq/cuda/cuda.hpp"
#include "kvq/cuda/device_codec.cuh"
#include "kvq/util/error.hpp"

#define KVQ_CUDA_CHECK(call)                                                               \
  do {                                                                                     \
    const cudaError_t kvq_err_ = (call);                                                   \
    if (kvq_err_ != cudaSuccess)                                                           \
      throw ::kvq::Error("", "cuda", std::string(#call) + ": " + cudaGetErrorString(kvq_err_)); \
  } while (0)

namespace kvq::cuda::detail {

void require_device();

// Owning device allocation (bytes).
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  explicit DeviceBuffer(size_t bytes) { reset(bytes); }
  ~DeviceBuffer() { release(); }
  DeviceBuffer(DeviceBuffer&& o) noexcept : ptr_(o.ptr_), bytes_(o.bytes_) { o.ptr_ = nullptr; o.bytes_ = 0; }
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept {
    if (this != &o) {
      release();
      ptr_ = o.ptr_;
      bytes_ = o.bytes_;
      o.ptr_ = nullptr;
      o.bytes_ = 0;
    }
    return *this;
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  void reset(size_t bytes) {
    release();
    if (bytes) KVQ_CUDA_CHECK(cudaMalloc(&ptr_, bytes));
    bytes_ = bytes;
  }
  void upload(const void* src, size_t bytes) {
    KVQ_ASSERT(bytes <= bytes_);
    if (bytes) KVQ_CUDA_CHECK(cudaMemcpy(ptr_, src, bytes, cudaMemcpyHostToDevice));
  }
  void download(void* dst, size_t bytes) const {
    KVQ_ASSERT(bytes <= bytes_);
    if (bytes) KVQ_CUDA_CHECK(cudaMemcpy(dst, ptr_, bytes, cudaMemcpyDeviceToHost));
  }
  template <class T>
  T* as() const { return static_cast<T*>(ptr_); }

 private:
  void release() {
    if (ptr_) cudaFree(ptr_);
    ptr_ = nullptr;
    bytes_ = 0;
  }
  void* ptr_ = nullptr;
  size_t bytes_ = 0;
};

template <class T>
DeviceBuffer upload_vector(const std::vector<T>& v) {
  DeviceBuffer b(v.size() * sizeof(T));
  b.upload(v.data(), v.size() * sizeof(T));
  return b;
}

}  // namespace kvq::cuda::detail

struct kvq::cuda::DeviceHead::Impl {
  codec::HeadCodec codec;
  detail::DevHead view{};            // host copy holding device pointers
  detail::DeviceBuffer d_view;       // the same struct in device memory
  std::vector<detail::DeviceBuffer> tables;
  explicit Impl(const codec::HeadCodec& c) : codec(c) {}
};
