#pragma once
// Parameters, split plan and shared-memory plan of the fused decode attention
// (attention_kernels.cuh). Host code plans a call (plan_attention, checks against the device heads
// and the kernels' limits); the kernels read only AttnParams. Plain C++ outside nvcc so the CPU
// emulation (tests/cuda) runs the same planning.
#include <math.h>
#include <stdint.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "kvq/codec/attention.hpp"
#include "kvq/codec/codec.hpp"
#include "kvq/cuda/cuda.hpp"
#include "kvq/cuda/dev_head.cuh"
#include "kvq/format/rope.hpp"
#include "kvq/util/error.hpp"

// Loops over the GQA group are unrolled so their per-head arrays stay in registers.
#if defined(__CUDACC__)
#define KVQ_UNROLL _Pragma("unroll")
#else
#define KVQ_UNROLL
#endif

namespace kvq::cuda::detail {

// A warp scores and accumulates kTokTile tokens at a time: one token per lane while scoring, one
// latent coordinate per lane while accumulating values. No block-wide barrier inside the token
// loop: the warps of a block each keep their own (max, sum, acc) and merge once at the end.
constexpr int kTokTile = 32;
constexpr int kLanesMaxCoords = kMaxHeadDim / 32;  // latent coordinates one lane owns (d <= 256)

// Token splits of one (sequence, KV head): every split a multiple of kTokTile tokens, enough
// splits that batch x KV heads x splits fills the GPU kSplitOversubscribe times over, none empty.
constexpr int kSplitOversubscribe = 4;
struct SplitPlan {
  int tokens_per_split;
  int n_splits;  // splits of a sequence of `max_tokens` attended tokens (the grid's y extent)
};
inline SplitPlan plan_splits(int max_tokens, int n_kv_heads, int batch, int sm_count) {
  max_tokens = std::max(max_tokens, 1);
  const long long want = (long long)kSplitOversubscribe * std::max(sm_count, 1);
  const long long per_seq_head = (long long)std::max(n_kv_heads, 1) * std::max(batch, 1);
  const int by_gpu = (int)std::max<long long>(1, (want + per_seq_head - 1) / per_seq_head);
  const int by_tiles = (max_tokens + kTokTile - 1) / kTokTile;
  int n = std::max(1, std::min(by_gpu, by_tiles));
  int per = (max_tokens + n - 1) / n;
  per = (per + kTokTile - 1) / kTokTile * kTokTile;
  n = (max_tokens + per - 1) / per;
  return {per, n};
}

struct AttnParams {
  const DevHead* k_heads;        // [n_kv]
  const DevHead* v_heads;        // [n_kv]
  const uint8_t* const* k_buf;   // [batch * n_kv]: packed K of sequence b, KV head h at b*n_kv+h
  const uint8_t* const* v_buf;   // [batch * n_kv]
  const float* q;                // [batch][n_q][d], post-RoPE
  const int32_t* lengths;        // [batch] cached tokens per sequence (device); null: all T
  int T;                         // tokens of every sequence when lengths is null
  const int32_t* positions;      // [batch][pos_stride] RoPE positions; null: the token index
  long long pos_stride;
  const double* inv_freq;        // [rotary_dim / 2] (RoPE only)
  double rope_attention_factor;  // cos/sin multiplier (YaRN; 1 otherwise)
  int rotary_dim;
  RopePairing pairing;
  int rope_enabled;              // keys pre-RoPE: decoded to x and rotated at their positions
  int n_q, n_kv, group, d, batch;
  int window;                    // > 0: the last `window` tokens only
  int tokens_per_split, n_splits;
  float scale;
  // Largest per-head sizes over the KV heads (ranks, widths and groups may differ per head).
  int max_cdk, max_cdv, max_kbb, max_vbb, max_cbk, max_cbv, max_ngv;
  float* ws_qc;    // [batch][n_q][max_cdk] query in K's latent domain
  float* ws_qoff;  // [batch][n_q]
  float* ws_m;     // [batch][n_q][n_splits]
  float* ws_l;     // [batch][n_q][n_splits]
  float* ws_acc;   // [batch][n_q][n_splits][max_cdv]
};

// Dynamic shared memory of the partial kernel, in floats (offsets are multiples of 4 floats, so
// the byte staging areas stay 16-byte aligned). The host sizes the launch with the same function.
struct SmemPlan {
  int cbk, cbv, q, qoff, warp0, warp_stride;
  // inside one warp's area
  int w_acc, w_p, w_vs, w_m, w_l, w_lat, w_x, w_kbytes, w_vbytes;
  int total;
};
__host__ __device__ inline int round4(int n) { return (n + 3) / 4 * 4; }
__host__ __device__ inline int staging_floats(int block_bytes) {
  return round4((kTokTile * block_bytes + 32 + 3) / 4);  // + 16 bytes of alignment shift, rounded
}
__host__ __device__ inline SmemPlan smem_plan(const AttnParams& P) {
  SmemPlan s{};
  const int G = P.group;
  const bool rope = P.rope_enabled != 0;
  int o = 0;
  s.cbk = o;   o += round4(P.max_cbk);
  s.cbv = o;   o += round4(P.max_cbv);
  s.q = o;     o += round4(G * (rope ? P.d : P.max_cdk));
  s.qoff = o;  o += round4(G);
  s.warp0 = o;
  int w = 0;
  s.w_acc = w;    w += round4(G * P.max_cdv);
  s.w_p = w;      w += round4(G * kTokTile);
  s.w_vs = w;     w += round4(kTokTile * P.max_ngv);
  s.w_m = w;      w += round4(G);
  s.w_l = w;      w += round4(G);
  s.w_lat = w;    w += rope ? round4(P.max_cdk) : 0;
  s.w_x = w;      w += rope ? round4(P.d) : 0;
  s.w_kbytes = w; w += staging_floats(P.max_kbb);
  s.w_vbytes = w; w += staging_floats(P.max_vbb);
  s.warp_stride = w;
  s.total = o + kWarps * w;
  return s;
}

// Centroids of a TQ head's codebook table (every group's 2^bits, in order); 0 for other kinds.
__host__ __device__ inline int codebook_floats(const PackedLayout& L) {
  if (L.kind != layout::kKindTqGroups) return 0;
  int n = 0;
  for (uint32_t g = 0; g < L.n_groups; ++g) n += 1 << L.groups[g].bits;
  return n;
}

// Everything about a call that does not depend on where its buffers live: validated against the
// device heads and the kernels' limits (kvq::Error). max_tokens: the most tokens a sequence may
// hold (the cache's capacity; T for a single problem): the split count is fixed by it, so a
// captured graph stays valid as the lengths grow.
struct AttnPlan {
  AttnParams shape{};            // every field but the buffers
  std::vector<double> inv_freq;  // [rotary_dim / 2] when rope
  size_t smem_partial = 0, smem_query = 0, smem_combine = 0;  // dynamic shared memory, bytes
  size_t ws_qc = 0, ws_ml = 0, ws_acc = 0;                    // workspace sizes, floats
};

struct AttnShape {
  int n_q_heads = 0, n_kv_heads = 0, head_dim = 0, batch = 1, max_tokens = 0, window = 0;
  float softmax_scale = 0.f;  // 0: 1/sqrt(head_dim)
  codec::RopeSpec rope;
};

inline AttnPlan plan_attention(const AttnShape& sh, const std::vector<const codec::HeadCodec*>& kc,
                               const std::vector<DevHead>& kh, const std::vector<DevHead>& vh,
                               int sm_count) {
  const int n_kv = sh.n_kv_heads, d = sh.head_dim;
  if (n_kv < 1 || sh.n_q_heads < 1 || sh.n_q_heads % n_kv != 0)
    throw Error("", "cuda attention: n_q_heads / n_kv_heads",
                std::to_string(sh.n_q_heads) + " / " + std::to_string(n_kv));
  if (sh.batch < 1 || sh.max_tokens < 1)
    throw Error("", "cuda attention: batch / tokens", std::to_string(sh.batch) + " / " + std::to_string(sh.max_tokens));
  AttnPlan plan;
  AttnParams& P = plan.shape;
  P.group = sh.n_q_heads / n_kv;
  if (d < 1 || d > kMaxHeadDim)
    throw Error("", "cuda attention: head_dim", std::to_string(d) + " outside 1.." + std::to_string(kMaxHeadDim));
  if (P.group > kMaxGqaGroup)
    throw Error("", "cuda attention: n_q_heads / n_kv_heads",
                std::to_string(P.group) + " exceeds " + std::to_string(kMaxGqaGroup));
  if (kc.size() != static_cast<size_t>(n_kv) || kh.size() != static_cast<size_t>(n_kv) ||
      vh.size() != static_cast<size_t>(n_kv))
    throw Error("", "cuda attention: device heads", "need one K and one V head per KV head");
  // RoPE on keys is all-or-nothing per call: mixing pre- and post-RoPE K heads would need two
  // kernel variants for no known use.
  int pre_rope = 0;
  for (int h = 0; h < n_kv; ++h) pre_rope += !kc[static_cast<size_t>(h)]->decision().post_rope;
  const bool rope = sh.rope.enabled && pre_rope > 0;
  if (rope && pre_rope != n_kv) throw Error("", "cuda attention: rope", "K heads mix pre- and post-RoPE decisions");
  P.max_ngv = 1;
  for (int h = 0; h < n_kv; ++h) {
    const DevHead& k = kh[static_cast<size_t>(h)];
    const DevHead& v = vh[static_cast<size_t>(h)];
    if (k.L.head_dim != static_cast<uint32_t>(d) || v.L.head_dim != static_cast<uint32_t>(d))
      throw Error("", "cuda attention: kv head " + std::to_string(h), "device head_dim differs from head_dim");
    P.max_cdk = std::max(P.max_cdk, static_cast<int>(k.L.code_dim));
    P.max_cdv = std::max(P.max_cdv, static_cast<int>(v.L.code_dim));
    P.max_kbb = std::max(P.max_kbb, k.L.tokens_per_block == 1 ? static_cast<int>(k.L.block_bytes) : 0);
    P.max_vbb = std::max(P.max_vbb, v.L.tokens_per_block == 1 ? static_cast<int>(v.L.block_bytes) : 0);
    P.max_cbk = std::max(P.max_cbk, codebook_floats(k.L));
    P.max_cbv = std::max(P.max_cbv, codebook_floats(v.L));
    P.max_ngv = std::max(P.max_ngv, static_cast<int>(v.L.n_groups));
  }
  P.rotary_dim = sh.rope.rotary_dim > 0 ? sh.rope.rotary_dim : d;
  if (rope) {
    plan.inv_freq.resize(static_cast<size_t>(P.rotary_dim / 2));
    if (!sh.rope.inv_freq.empty() && sh.rope.inv_freq.size() != plan.inv_freq.size())
      throw Error("", "cuda attention: rope.inv_freq",
                  std::to_string(sh.rope.inv_freq.size()) + " entries for rotary dim " + std::to_string(P.rotary_dim));
    for (int i = 0; i < P.rotary_dim / 2; ++i)  // the CPU reference's frequencies, in double
      plan.inv_freq[static_cast<size_t>(i)] = sh.rope.inv_freq.empty()
                                                  ? rope_block_default_inv_freq(sh.rope.theta, i, P.rotary_dim)
                                                  : sh.rope.inv_freq[static_cast<size_t>(i)];
  }
  P.rope_attention_factor = sh.rope.attention_factor;
  P.pairing = sh.rope.pairing;
  P.rope_enabled = rope ? 1 : 0;
  P.n_q = sh.n_q_heads;
  P.n_kv = n_kv;
  P.d = d;
  P.batch = sh.batch;
  P.window = sh.window > 0 ? sh.window : 0;
  P.T = sh.max_tokens;
  const int attended = P.window > 0 ? std::min(P.window, sh.max_tokens) : sh.max_tokens;
  const SplitPlan sp = plan_splits(attended, n_kv, sh.batch, sm_count);
  P.tokens_per_split = sp.tokens_per_split;
  P.n_splits = sp.n_splits;
  P.scale = sh.softmax_scale > 0.f ? sh.softmax_scale : static_cast<float>(1.0 / std::sqrt(static_cast<double>(d)));
  plan.smem_partial = sizeof(float) * static_cast<size_t>(smem_plan(P).total);
  plan.smem_query = sizeof(float) * static_cast<size_t>(d + P.max_cdk + kWarps + 1);
  plan.smem_combine = sizeof(float) * static_cast<size_t>(P.max_cdv + d);
  const size_t rows = static_cast<size_t>(sh.batch) * static_cast<size_t>(sh.n_q_heads);
  plan.ws_qc = rows * static_cast<size_t>(P.max_cdk + 1);
  plan.ws_ml = rows * static_cast<size_t>(P.n_splits);
  plan.ws_acc = plan.ws_ml * static_cast<size_t>(P.max_cdv);
  return plan;
}

// Where the buffers live (device memory on the GPU, host memory in the emulation).
struct AttnBuffers {
  const DevHead* k_heads;
  const DevHead* v_heads;
  const uint8_t* const* k_buf;
  const uint8_t* const* v_buf;
  const float* q;
  const int32_t* lengths;    // null: every sequence holds max_tokens
  const int32_t* positions;  // null: the token index
  long long pos_stride;
  const double* inv_freq;    // may be null without rope
  float* ws_qc;              // plan.ws_qc floats
  float* ws_m;               // plan.ws_ml
  float* ws_l;               // plan.ws_ml
  float* ws_acc;             // plan.ws_acc
};

inline AttnParams make_attn_params(const AttnPlan& plan, const AttnBuffers& b) {
  AttnParams P = plan.shape;
  P.k_heads = b.k_heads;
  P.v_heads = b.v_heads;
  P.k_buf = b.k_buf;
  P.v_buf = b.v_buf;
  P.q = b.q;
  P.lengths = b.lengths;
  P.positions = b.positions;
  P.pos_stride = b.pos_stride;
  P.inv_freq = P.rope_enabled ? b.inv_freq : nullptr;
  const size_t rows = static_cast<size_t>(P.batch) * static_cast<size_t>(P.n_q);
  P.ws_qc = b.ws_qc;
  P.ws_qoff = b.ws_qc + rows * static_cast<size_t>(P.max_cdk);
  P.ws_m = b.ws_m;
  P.ws_l = b.ws_l;
  P.ws_acc = b.ws_acc;
  return P;
}

// Attended range [first, end) of sequence b (device and host).
__host__ __device__ inline void attended_range(const AttnParams& P, int b, int* first, int* end) {
  const int len = P.lengths ? P.lengths[b] : P.T;
  *end = len;
  *first = P.window > 0 && P.window < len ? len - P.window : 0;
}

}  // namespace kvq::cuda::detail
