#pragma once
// CPU reference for decode attention over a packed cache: the oracle of the fused CUDA kernel.
// One query per query head (the newest token) against T cached tokens of its KV head; GQA maps
// query head h to KV head h / (n_q_heads / n_kv_heads) (HF repeat_kv order).
#include <cstdint>
#include <vector>

#include "kvq/codec/codec.hpp"
#include "kvq/format/rope.hpp"

namespace kvq::codec {

// RoPE applied to decoded keys whose decision says post_rope == false (keys cached pre-RoPE).
// Block i < rotary_dim/2 rotates by pos * theta^(-2i/rotary_dim) the pair of coordinates that
// rope_block_coords (kvq/format/rope.hpp) gives for `pairing`. A model with scaled RoPE (llama3,
// yarn, ...) gives its own inverse frequencies and attention factor (cos/sin are multiplied by
// it), as the calibration file records them.
struct RopeSpec {
  bool enabled = false;
  double theta = 10000.0;
  int rotary_dim = 0;  // 0 means head_dim
  RopePairing pairing = RopePairing::kSplitHalf;
  std::vector<double> inv_freq;   // [rotary_dim / 2]; empty: theta^(-2i/rotary_dim)
  double attention_factor = 1.0;
};

// The double-precision reference RoPE of one head vector: rotates x[0..head_dim) in place for
// position pos (angles, sin/cos and the rotation in double; a negative pos rotates back). The
// oracle of the CUDA kernels' RoPE. Not the forward's kernel: kvq::apply_rope (kvq/model/model.hpp)
// rotates batches in fp32 from a float cos/sin table, so the two differ in the last bits.
void reference_apply_rope(float* x, int head_dim, int64_t pos, const RopeSpec& rope);

struct AttentionProblem {
  int n_q_heads = 0;
  int n_kv_heads = 0;
  int head_dim = 0;
  int n_tokens = 0;                          // T >= 1
  const float* q = nullptr;                  // [n_q_heads][head_dim], already post-RoPE
  std::vector<const HeadCodec*> k_codecs;    // [n_kv_heads]
  std::vector<const HeadCodec*> v_codecs;    // [n_kv_heads]
  std::vector<const uint8_t*> k_packed;      // [n_kv_heads], T tokens each
  std::vector<const uint8_t*> v_packed;      // [n_kv_heads]
  const int32_t* positions = nullptr;        // [T]; required when RoPE is applied to keys
  RopeSpec rope;
  float softmax_scale = 0.f;                 // 0 means 1/sqrt(head_dim)
  // Sliding-window layer (> 0): the query, the newest token T-1, attends only keys j > T-1-window,
  // i.e. the last `window` cached tokens. 0: all T.
  int window = 0;
};

// The first cached token the query attends.
inline int first_attended(const AttentionProblem& p) {
  return p.window > 0 && p.window < p.n_tokens ? p.n_tokens - p.window : 0;
}

// Throws kvq::Error on inconsistent shapes. out: [n_q_heads][head_dim].
void validate(const AttentionProblem& p);
void reference_decode_attention(const AttentionProblem& p, float* out);

}  // namespace kvq::codec
