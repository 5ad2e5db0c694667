#pragma once
// PackedKvCache's state (kv_cache.cu) and what kv_cache_append.cu needs of it.
#include <cuda_runtime.h>

#include <vector>

#include "cuda_common.cuh"
#include "kvq/cuda/attention_params.cuh"
#include "kvq/cuda/kv_cache.hpp"

namespace kvq::cuda::detail {

// One (KV head, side) as the append kernel sees it.
struct AppendHead {
  uint8_t* stream;         // sequence b's region starts at stream + b * seq_bytes
  unsigned long long seq_bytes;
  unsigned long long src_off;  // first byte of this head's batch of tokens in the step's bytes
  uint32_t block_bytes;
};

struct CacheLayer {
  std::vector<DeviceHead> kdev, vdev;
  DeviceBuffer d_kh, d_vh;               // DevHead [n_kv]
  std::vector<DeviceBuffer> streams;     // K heads, then V heads: batch * seq_bytes each
  std::vector<size_t> seq_bytes;         // per stream: packed_bytes(capacity)
  DeviceBuffer d_kptr, d_vptr;           // [batch * n_kv] sequence base pointers
  DeviceBuffer d_append;                 // AppendHead [2 * n_kv]: K heads, then V heads
  AttnPlan plan;
  DeviceBuffer d_freq;
  size_t step_bytes[2] = {0, 0};         // K, V: bytes of one step's tokens, all heads
  bool appendable = true;                // every head stores one token per block (append_packed)
  // KIVI K heads (several tokens per block): append re-encodes each sequence's open block from
  // its fp32 rows (kivi_k_append_kernel) instead of copying a coded token.
  std::vector<DeviceBuffer> kivi_rows;   // per KIVI K head: [batch][group_size][d] fp32
  DeviceBuffer d_kivi;                   // KiviKAppend [n_kivi]
  int n_kivi = 0;
  // Per sequence: a load left a partial KIVI K group whose fp32 rows the cache does not have, so
  // append cannot continue it (host-side, set by load).
  std::vector<char> kivi_open_unknown;
};

// [batch][n_kv][d] fp32 (K and V) -> x [side][n_kv][batch][d], so that each head's tokens are
// contiguous for encode_async.
// kivi_k_append_kernel over grid (batch, n_jobs) (kernels/encode.cu, where the encoder lives).
void launch_kivi_k_append(const KiviKAppend* jobs_dev, int n_jobs, int batch, const int32_t* lengths, int capacity,
                          cudaStream_t stream);

void launch_gather_tokens(const float* k, const float* v, float* x, int batch, int n_kv, int d, cudaStream_t s);

}  // namespace kvq::cuda::detail

struct kvq::cuda::PackedKvCache::Impl {
  KvCacheSpec spec;
  std::vector<detail::CacheLayer> layers;
  detail::DeviceBuffer lengths;   // int32 [n_layers][batch]
  detail::DeviceBuffer overflow;  // int32: set when an append found a sequence full
  detail::DeviceBuffer ws_qc, ws_m, ws_l, ws_acc;
  detail::DeviceBuffer x_scratch;     // append: [2][n_kv][batch][d] fp32
  detail::DeviceBuffer code_scratch;  // append: the largest K + V step bytes
  // append_host / attend_host: the step's inputs and output on the device (allocated once).
  detail::DeviceBuffer host_k, host_v, host_q, host_out;
  size_t bytes = 0;

  const detail::CacheLayer& layer(int l) const;
  // The step's coded tokens (append_packed's layout; KIVI K heads take none) into the streams,
  // the KIVI K heads' open blocks re-encoded from x_scratch, then the lengths advanced.
  void launch_append(int l, const uint8_t* k_dev, const uint8_t* v_dev, cudaStream_t st);
};
