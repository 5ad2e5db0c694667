#pragma once
// Capture points of the forward. The forward calls the observer once per layer per batch with
// pre-RoPE q (every query head), pre-RoPE k, v and the positions, as plain fp32 row-major arrays
// so that consumers need no LibTorch. A forward without an observer pays nothing. The arrays are
// valid only during the call (the forward reuses them): copy what you keep.
#include <cstdint>

namespace kvq {

struct LayerCapture {
  int layer = 0;
  int batch = 0;       // B windows
  int seq = 0;         // T tokens per window
  int n_heads = 0;     // query heads
  int n_kv_heads = 0;
  int head_dim = 0;
  int head_dim_v = 0;  // value rows' dim when it differs from head_dim (MLA); 0: head_dim
  const float* q = nullptr;  // [B][T][n_heads][head_dim], pre-RoPE
  const float* k = nullptr;  // [B][T][n_kv_heads][head_dim], pre-RoPE
  const float* v = nullptr;  // [B][T][n_kv_heads][v_dim()]
  int v_dim() const { return head_dim_v > 0 ? head_dim_v : head_dim; }
  const int64_t* positions = nullptr;  // [T], shared by all windows of the batch
};

class CaptureObserver {
 public:
  virtual ~CaptureObserver() = default;
  virtual void on_layer(const LayerCapture& c) = 0;
};

// Mutating hook for quantized evaluation: called after q/k/v projection and before RoPE; it may
// rewrite k and v in place (e.g. quantize -> dequantize). Post-RoPE codecs apply RoPE themselves
// (it is orthogonal per block, so they can rotate, code and rotate back).
struct LayerKv {
  int layer = 0, batch = 0, seq = 0, n_kv_heads = 0, head_dim = 0;
  int head_dim_v = 0;  // value rows' dim when it differs from head_dim (MLA); 0: head_dim
  float* k = nullptr;  // [B][T][n_kv_heads][head_dim], pre-RoPE
  float* v = nullptr;  // [B][T][n_kv_heads][v_dim()]
  int v_dim() const { return head_dim_v > 0 ? head_dim_v : head_dim; }
  const int64_t* positions = nullptr;  // [T]
};

class KvTransform {
 public:
  virtual ~KvTransform() = default;
  virtual void apply(LayerKv& kv) = 0;
};

}  // namespace kvq
