#pragma once
// Host API of the CUDA kernels (kernels/*.cu). Callers need no CUDA headers. The kernels read the
// packed layout of kvq/format/packed_layout.hpp and use the tables of a codec::HeadCodec, so their
// oracle is the CPU reference decoder (codec.hpp) and codec::reference_decode_attention.
// Every function throws kvq::Error when no device is usable or a CUDA call fails.
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "kvq/codec/attention.hpp"
#include "kvq/codec/codec.hpp"

// True when a CUDA device is usable; false without a GPU or driver (never throws).
bool kvq_cuda_available();

namespace kvq::cuda {

constexpr int kMaxHeadDim = 256;    // per-block shared-memory tiles are sized for this
constexpr int kMaxGqaGroup = 16;    // query heads per KV head in the fused attention kernel

// One (layer, KV head, side) on the device: a copy of the codec plus its tables in device memory
// (TQ rotations and codebooks; low-rank folded basis and mean).
class DeviceHead {
 public:
  explicit DeviceHead(const codec::HeadCodec& codec);  // throws if head_dim > kMaxHeadDim
  ~DeviceHead();
  DeviceHead(DeviceHead&&) noexcept;
  DeviceHead& operator=(DeviceHead&&) noexcept;
  DeviceHead(const DeviceHead&) = delete;
  DeviceHead& operator=(const DeviceHead&) = delete;

  const codec::HeadCodec& codec() const;

  // Host buffers in and out (upload, run, download); same outputs as the HeadCodec methods.
  void decode(const uint8_t* packed, int n_tokens, float* out) const;          // [T][d]
  void decode_latent(const uint8_t* packed, int n_tokens, float* latent) const;  // [T][code_dim]
  void unpack_codes(const uint8_t* packed, int n_tokens, uint8_t* codes) const;  // [T][code_dim]
  // The GPU encoder on host buffers: x [T][d] -> codec().packed_bytes(T) bytes, the same bytes as
  // codec().encode (a non-finite input is rejected the same way). Device buffers, streams and
  // graphs: encode_async in kvq/cuda/encode.hpp (kernels/encode.cu).
  void encode(const float* x, int n_tokens, uint8_t* out) const;

  struct Impl;
  const Impl& impl() const { return *impl_; }

 private:
  std::unique_ptr<Impl> impl_;
};

// Fused decode attention (split over tokens, online softmax, GQA: each KV head's keys and values
// are decoded once for all its query heads). Same problem and result as
// codec::reference_decode_attention; k_dev / v_dev hold one DeviceHead per KV head, built from
// p.k_codecs / p.v_codecs. Buffers in p are host memory. out: [n_q_heads][head_dim], host.
void decode_attention(const codec::AttentionProblem& p, const std::vector<const DeviceHead*>& k_dev,
                      const std::vector<const DeviceHead*>& v_dev, float* out);
// Convenience: builds the DeviceHeads from p's codecs first.
void decode_attention(const codec::AttentionProblem& p, float* out);

// Bandwidth measurement (scripts/gpu-check, bench/cuda): packed codes resident on the device,
// the decode kernel launched `reps` times between CUDA events. bytes = packed bytes read + fp32
// bytes written per launch.
struct DecodeTiming {
  double ms_per_launch = 0;
  double bytes_per_launch = 0;
  double gbytes_per_s() const { return bytes_per_launch / (ms_per_launch * 1e6); }
};
DecodeTiming time_decode(const DeviceHead& head, const uint8_t* packed, int n_tokens, int reps);

// Peak DRAM bandwidth of device 0 from its attributes (memory clock x bus width x 2, DDR), GB/s.
double device_peak_bandwidth_gbps();
std::string device_name();

}  // namespace kvq::cuda
