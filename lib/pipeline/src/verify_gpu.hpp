#pragma once
// kvq-verify on the GPU path (issue 24, item 3): every (layer, KV head, side) of an allocation over
// the held-out windows through the GPU encoder and decoder, and per (layer, window) the fused
// decode attention of the window's last query over the GPU-coded cache, each against the CPU
// reference. Built without CUDA, or run without a device, it records that nothing ran on a GPU.
// Private to lib/pipeline (verify.cpp).
#include <cstdint>
#include <vector>

#include "kvq/codec/attention.hpp"
#include "kvq/codec/codec.hpp"
#include "kvq/pipeline/verify.hpp"

namespace kvq::pipeline_detail {

class GpuVerifier {
 public:
  // Runs when `wanted` and a CUDA device is usable.
  explicit GpuVerifier(bool wanted);
  bool on() const { return on_; }
  // Turns the GPU path off, with a note in the report, when a head dim (K's d, V's dv) is above
  // what the GPU kernels take (cuda::kMaxHeadDim; MLA's served cache is 576 / 512): the CPU
  // reference alone measures, rather than the GPU refusing the run.
  void limit_dims(int d, int dv);

  // One (layer, KV head, window, side): rows [T][d] as the side is coded (K post-RoPE when the
  // decision says so, else pre-RoPE; V as is). CPU encode vs GPU encode (bytes and codes exactly),
  // CPU decode of the CPU bytes vs GPU decode of the GPU bytes. gpu_packed receives the GPU's
  // bytes (the cache attention() reads).
  void check_side(const codec::HeadCodec& c, const float* rows, int T, std::vector<uint8_t>& gpu_packed);

  // The fused decode-attention hook: p's packed caches are the GPU's bytes, p.q the window's last
  // query (post-RoPE). Runs the GPU attention (kvq::cuda::decode_attention, the host API the fused
  // kernel keeps) and the CPU reference codec::reference_decode_attention, and records the largest
  // difference. The integrator of issue 24 points this at the GPU-resident cache's attend once it
  // lands; the comparison and report stay as they are.
  void attention(const codec::AttentionProblem& p);

  // The figures so far (ran = false and a note saying so without a GPU).
  GpuCheck finish() const;

 private:
  bool on_ = false;
  GpuCheck g_;
};

}  // namespace kvq::pipeline_detail
