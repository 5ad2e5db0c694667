#pragma once
// A packed KV cache resident on the GPU, for B sequences decoding one token per step:
// per layer and KV head, the K and V code streams in the frozen packed layout
// (kvq/format/packed_layout.hpp; no new format), each sequence its own region of `capacity`
// tokens, the lengths on the device. The step functions (append, append_packed, attend) only
// enqueue kernels on the given stream: no allocation, no host copy, no synchronisation (the
// workspace is allocated by the constructor), so a whole decode step can be captured in a CUDA
// graph and replayed. Callers need no CUDA headers; `stream` is a cudaStream_t (nullptr: the
// default stream). Every function throws kvq::Error on bad arguments or a failed CUDA call.
#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "kvq/codec/attention.hpp"
#include "kvq/codec/codec.hpp"
#include "kvq/cuda/cuda.hpp"

namespace kvq::cuda {

struct KvCacheLayer {
  std::vector<codec::HeadCodec> k, v;  // one per KV head
  int window = 0;                      // sliding-window layer: the last `window` tokens; 0: all
};

struct KvCacheSpec {
  int n_q_heads = 0, n_kv_heads = 0, head_dim = 0;
  int batch = 1;      // sequences
  int capacity = 0;   // tokens per sequence
  // Keys of pre-RoPE decisions are rotated at attend time; token t of a sequence is at position t.
  codec::RopeSpec rope;
  float softmax_scale = 0.f;  // 0: 1/sqrt(head_dim)
  std::vector<KvCacheLayer> layers;
};

class PackedKvCache {
 public:
  // Validates the spec (the attention kernels' limits: head_dim <= kMaxHeadDim, GQA <= 16, one
  // RoPE mode per layer), uploads the codecs' tables and allocates the streams, lengths (all 0)
  // and workspace.
  explicit PackedKvCache(const KvCacheSpec& spec);
  ~PackedKvCache();
  PackedKvCache(PackedKvCache&&) noexcept;
  PackedKvCache& operator=(PackedKvCache&&) noexcept;
  PackedKvCache(const PackedKvCache&) = delete;
  PackedKvCache& operator=(const PackedKvCache&) = delete;

  const KvCacheSpec& spec() const;
  // Bytes of the device memory the cache holds (streams, tables, workspace).
  size_t device_bytes() const;

  // ---- setup and inspection (synchronous, host memory) ----
  // Sequence `seq` of `layer` holds the first n_tokens tokens given as packed bytes per KV head
  // (codec.packed_bytes(n_tokens) each, host memory); its length becomes n_tokens.
  void load(int layer, int seq, const std::vector<const uint8_t*>& k_packed,
            const std::vector<const uint8_t*>& v_packed, int n_tokens);
  std::vector<int32_t> lengths(int layer) const;
  // The packed bytes of sequence seq's current tokens of one (KV head, side) (its length's
  // codec.packed_bytes), downloaded.
  std::vector<uint8_t> packed(int layer, int seq, int kv_head, Side side) const;
  // True when an append found a sequence full (its token was dropped, its length kept).
  bool overflowed() const;
  // Device address of layer's lengths [batch] (int32), for callers that chain their own kernels.
  const int32_t* lengths_device(int layer) const;

  // ---- one decode step (asynchronous on `stream`) ----
  // Codes one new token per sequence on the GPU (encode_async) and appends it: k_dev, v_dev
  // [batch][n_kv_heads][head_dim] fp32, device memory. Lengths advance by one. A KIVI K head
  // (per-channel scales over group_size tokens) keeps each sequence's open group in fp32 and
  // re-encodes that block every step, so its bytes always equal the CPU encoder's of the tokens so
  // far; a sequence loaded with a partial KIVI K group cannot be appended to (kvq::Error).
  void append(int layer, const float* k_dev, const float* v_dev, void* stream = nullptr);
  // The same with the tokens already coded: per KV head h in order, packed_bytes(batch) bytes of
  // that head's codec (token b = sequence b's new token), i.e. exactly what encode_async writes
  // for the batch's tokens of that head; packed_step_bytes(layer, side) bytes in all. Not for a
  // layer with KIVI K heads (their coded token depends on the group: use append).
  void append_packed(int layer, const uint8_t* k_dev, const uint8_t* v_dev, void* stream = nullptr);
  size_t packed_step_bytes(int layer, Side side) const;
  // One query token per sequence: q_dev [batch][n_q_heads][head_dim] (post-RoPE), out_dev the
  // same shape; device memory. Attends each sequence's current tokens (its window on a
  // sliding-window layer); a sequence of length 0 gives zeros. Calls sharing one cache must not
  // run concurrently on different streams (they share the workspace).
  void attend(int layer, const float* q_dev, float* out_dev, void* stream = nullptr) const;

  // ---- the same steps on host buffers, synchronous (checks such as kvq-verify; not for graphs:
  // they copy and wait; the device buffers are the cache's own) ----
  void append_host(int layer, const float* k_host, const float* v_host);
  void attend_host(int layer, const float* q_host, float* out_host) const;

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace kvq::cuda
