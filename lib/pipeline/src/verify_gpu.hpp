#pragma once
// kvq-verify on the GPU path (issue 24, item 3), against the CPU reference:
//   check_side   every (layer, KV head, window, side): the window's rows through the GPU encoder
//                (bytes and codes equal to the CPU encoder's) and the GPU decoder (values within
//                GpuCheck::kDecodeTolerance of the CPU decoder's).
//   cache_layer  every layer as the serving path runs it: a GPU-resident packed cache
//                (kvq::cuda::PackedKvCache, one sequence per held-out window) filled one decode step
//                at a time through the GPU encoder (KIVI K re-encoding its open group), and at
//                selected steps the fused flash-decoding kernel on that step's query of every
//                window, against codec::reference_decode_attention over the CPU encoder's bytes of
//                the same tokens; after the last step the cache's bytes of every (window, KV head,
//                side) against the CPU encoder's.
// Built without CUDA, or run without a device, it records that nothing ran on a GPU.
// Private to lib/pipeline (verify.cpp).
#include <cstdint>
#include <string>
#include <vector>

#include "kvq/codec/attention.hpp"
#include "kvq/codec/codec.hpp"
#include "kvq/pipeline/verify.hpp"

namespace kvq::pipeline_detail {

// One layer's held-out windows as the cache sees them.
struct GpuLayer {
  int layer = 0;
  int n_q_heads = 0, n_kv_heads = 0, head_dim = 0;
  int windows = 0, tokens = 0;  // sequences, tokens per sequence
  int window = 0;               // sliding window of the layer (0: full attention)
  codec::RopeSpec rope;         // pre-RoPE keys are rotated at position = token index
  std::vector<const codec::HeadCodec*> k, v;  // per KV head
  const float* k_rows = nullptr;  // [windows][tokens][n_kv][d] as K is coded (post-RoPE or not)
  const float* v_rows = nullptr;  // [windows][tokens][n_kv][d]
  const float* q_rows = nullptr;  // [windows][tokens][n_q][d] post-RoPE at position t
};

// The decode steps (1-based token counts) after which cache_layer attends: 1, 2, 4, ... and the
// last, so short and long prefixes are both checked at O(T) CPU reference cost per window.
std::vector<int> attention_steps(int tokens);

// What the cache check needs of a packed cache of one layer (batch = windows, capacity = tokens):
// kvq::cuda::PackedKvCache on a GPU (verify_gpu.cpp); the CPU emulation of the same kernels in
// tests/cuda/test_verify_gpu_emulation.cpp, so CI runs this check without a GPU.
class CacheUnderTest {
 public:
  virtual ~CacheUnderTest() = default;
  virtual void append(const float* k, const float* v) = 0;  // host [batch][n_kv][d], one step
  virtual void attend(const float* q, float* out) = 0;      // host [batch][n_q][d]
  virtual std::vector<int32_t> lengths() = 0;
  virtual std::vector<uint8_t> packed(int seq, int kv_head, Side side) = 0;
};

// Empty when the fused kernel can take the layer, else why not (GQA group beyond 16, K heads
// mixing pre- and post-RoPE decisions).
std::string cache_unsupported(const GpuLayer& g, int max_gqa_group);

// The cache check of one layer (GpuVerifier::cache_layer's body): every token appended, the fused
// attention at attention_steps against codec::reference_decode_attention over the CPU encoder's
// bytes of the same tokens, the cache's bytes after the last step against the CPU encoder's. Adds
// its figures to `out` (cache_*, attention_*).
void check_cache_layer(const GpuLayer& g, CacheUnderTest& cache, GpuCheck& out);

class GpuVerifier {
 public:
  // Runs when `wanted` and a CUDA device is usable.
  explicit GpuVerifier(bool wanted);
  bool on() const { return on_; }
  // Turns the GPU path off, with a note in the report, when a head dim (K's d, V's dv) is above
  // what the GPU kernels take (cuda::kMaxHeadDim; MLA's served cache is 576 / 512): the CPU
  // reference alone measures, rather than the GPU refusing the run.
  void limit_dims(int d, int dv);
  // A line for the report's notes (what the GPU path left out, and why).
  void note(std::string text);

  // One (layer, KV head, window, side): rows [T][d] as the side is coded.
  void check_side(const codec::HeadCodec& c, const float* rows, int T);

  // One layer through PackedKvCache and the fused kernel (see above). A layer the kernels cannot
  // take (GQA group > 16, K heads mixing pre- and post-RoPE) is skipped with a note.
  void cache_layer(const GpuLayer& g);

  // The figures so far (ran = false and a note saying so without a GPU).
  GpuCheck finish() const;

 private:
  bool on_ = false;
  GpuCheck g_;
};

}  // namespace kvq::pipeline_detail
