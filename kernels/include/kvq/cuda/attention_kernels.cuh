#pragma once
// Fused decode attention kernels and their host-side planning. Free of CUDA runtime calls so
// tests/cuda/test_kernel_emulation.cpp runs this exact code on CPU threads; kernels/attention.cu
// adds allocation, copies and launches. Include from one .cu only (kernels are not inline).
//
// Fused decode attention (split-K "flash decoding"):
//   attention_partial_kernel  grid (KV head, split): for its token range, decode tiles of kTile
//                             keys and values, score them for all G query heads of the KV head
//                             (GQA: each key/value is decoded once), online softmax, accumulate
//                             the values in V's latent domain; writes (max, sum, acc) per query
//                             head and split.
//   attention_combine_kernel  grid (query head): merges the splits, divides by the sum and applies
//                             V's back-transform (mean included) once.
// Keys of pre-RoPE decisions with RoPE enabled are decoded to x, rotated at their positions and
// scored against q in x; otherwise q is moved into K's latent domain once and a key costs
// O(code_dim) (no per-key back-rotation).
#include <math.h>
#include <stdint.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "kvq/codec/attention.hpp"
#include "kvq/codec/codec.hpp"
#include "kvq/cuda/cuda.hpp"
#include "kvq/cuda/device_codec.cuh"
#include "kvq/format/rope.hpp"
#include "kvq/util/error.hpp"

#ifndef KVQ_DYNAMIC_SMEM
#define KVQ_DYNAMIC_SMEM(name) extern __shared__ float name[]
#endif

namespace kvq::cuda::detail {

// Token splits: enough blocks to fill the GPU twice over, at least 64 tokens each, none empty.
struct SplitPlan {
  int tokens_per_split;
  int n_splits;
};
inline SplitPlan plan_splits(int n_tokens, int n_kv_heads, int sm_count) {
  const int want_blocks = 2 * sm_count;
  int n = std::max(1, std::min((n_tokens + 63) / 64, (want_blocks + n_kv_heads - 1) / n_kv_heads));
  const int per = (n_tokens + n - 1) / n;
  n = (n_tokens + per - 1) / per;
  return {per, n};
}

struct AttnParams {
  const DevHead* k_heads;       // [n_kv]
  const DevHead* v_heads;       // [n_kv]
  const uint8_t* const* k_buf;  // [n_kv] packed K per KV head
  const uint8_t* const* v_buf;  // [n_kv]
  const float* q;               // [n_q][d]
  const int32_t* positions;     // [T] (RoPE only)
  const double* inv_freq;       // [rotary_dim / 2] (RoPE only)
  double rope_attention_factor; // cos/sin multiplier (YaRN; 1 otherwise)
  int rotary_dim;
  RopePairing pairing;
  int rope_enabled;
  int n_q, n_kv, group, d, T;
  int t_first;  // first attended token (sliding window); splits cover [t_first, T)
  int tokens_per_split, n_splits;
  float scale;
  float* ws_m;     // [n_q][n_splits]
  float* ws_l;     // [n_q][n_splits]
  float* ws_acc;   // [n_q][n_splits][acc_stride]
  int acc_stride;  // largest V code_dim over the KV heads (ranks may differ per head)
};

// Shared-memory plan of the partial kernel, in floats; the same function sizes the launch.
struct SmemPlan {
  int q_x, q_c, q_off, wk, xk, wv, acc, p, m, l, corr, red, total;
};
__host__ __device__ inline SmemPlan smem_plan(int G, int d, int cdk, int cdv, bool rope) {
  SmemPlan s{};
  int o = 0;
  s.q_x = o;   o += G * d;
  s.q_c = o;   o += rope ? 0 : G * cdk;
  s.q_off = o; o += G;
  s.wk = o;    o += kTile * cdk;
  s.xk = o;    o += rope ? kTile * d : 0;
  s.wv = o;    o += kTile * cdv;
  s.acc = o;   o += G * cdv;
  s.p = o;     o += G * kTile;
  s.m = o;     o += G;
  s.l = o;     o += G;
  s.corr = o;  o += G;
  s.red = o;   o += kWarps;
  s.total = o;
  return s;
}

// Everything about a call that does not depend on where its buffers live. Validates the problem
// against the device heads and the kernels' limits (kvq::Error).
struct AttnPlan {
  int group = 0;
  int rotary_dim = 0;
  int max_cdk = 0, max_cdv = 0;
  bool rope = false;
  SplitPlan split{};
  std::vector<double> inv_freq;  // [rotary_dim / 2] when rope
  float scale = 0.f;
  size_t smem_partial = 0, smem_combine = 0;  // dynamic shared memory, bytes
};

inline AttnPlan plan_attention(const codec::AttentionProblem& p, const std::vector<DevHead>& kh,
                               const std::vector<DevHead>& vh, int sm_count) {
  codec::validate(p);
  const int n_kv = p.n_kv_heads, d = p.head_dim;
  AttnPlan plan;
  plan.group = p.n_q_heads / n_kv;
  if (d > kMaxHeadDim)
    throw Error("", "cuda attention: head_dim", std::to_string(d) + " exceeds " + std::to_string(kMaxHeadDim));
  if (plan.group > kMaxGqaGroup)
    throw Error("", "cuda attention: n_q_heads / n_kv_heads",
                std::to_string(plan.group) + " exceeds " + std::to_string(kMaxGqaGroup));
  if (kh.size() != static_cast<size_t>(n_kv) || vh.size() != static_cast<size_t>(n_kv))
    throw Error("", "cuda attention: device heads", "need one K and one V head per KV head");
  // RoPE on keys is all-or-nothing per call: mixing pre- and post-RoPE K heads would need two
  // kernel variants for no known use.
  int pre_rope = 0;
  for (int h = 0; h < n_kv; ++h) pre_rope += !p.k_codecs[static_cast<size_t>(h)]->decision().post_rope;
  plan.rope = p.rope.enabled && pre_rope > 0;
  if (plan.rope && pre_rope != n_kv)
    throw Error("", "cuda attention: rope", "K heads mix pre- and post-RoPE decisions");
  for (int h = 0; h < n_kv; ++h) {
    const DevHead& k = kh[static_cast<size_t>(h)];
    const DevHead& v = vh[static_cast<size_t>(h)];
    if (k.L.head_dim != static_cast<uint32_t>(d) || v.L.head_dim != static_cast<uint32_t>(d))
      throw Error("", "cuda attention: kv head " + std::to_string(h), "device head_dim differs from head_dim");
    plan.max_cdk = std::max(plan.max_cdk, static_cast<int>(k.L.code_dim));
    plan.max_cdv = std::max(plan.max_cdv, static_cast<int>(v.L.code_dim));
  }
  plan.rotary_dim = p.rope.rotary_dim > 0 ? p.rope.rotary_dim : d;
  if (plan.rope) {
    plan.inv_freq.resize(static_cast<size_t>(plan.rotary_dim / 2));
    if (!p.rope.inv_freq.empty() && p.rope.inv_freq.size() != plan.inv_freq.size())
      throw Error("", "cuda attention: rope.inv_freq",
                  std::to_string(p.rope.inv_freq.size()) + " entries for rotary dim " + std::to_string(plan.rotary_dim));
    for (int i = 0; i < plan.rotary_dim / 2; ++i)  // the CPU reference's frequencies, in double
      plan.inv_freq[static_cast<size_t>(i)] = p.rope.inv_freq.empty()
                                                   ? rope_block_default_inv_freq(p.rope.theta, i, plan.rotary_dim)
                                                   : p.rope.inv_freq[static_cast<size_t>(i)];
  }
  plan.split = plan_splits(p.n_tokens - codec::first_attended(p), n_kv, sm_count);
  plan.scale = p.softmax_scale > 0.f ? p.softmax_scale
                                     : static_cast<float>(1.0 / std::sqrt(static_cast<double>(d)));
  plan.smem_partial =
      sizeof(float) * static_cast<size_t>(smem_plan(plan.group, d, plan.max_cdk, plan.max_cdv, plan.rope).total);
  plan.smem_combine = sizeof(float) * static_cast<size_t>(plan.max_cdv + d);
  return plan;
}

// Where the buffers live (device memory on the GPU, host memory in the emulation).
struct AttnBuffers {
  const DevHead* k_heads;
  const DevHead* v_heads;
  const uint8_t* const* k_buf;
  const uint8_t* const* v_buf;
  const float* q;
  const int32_t* positions;  // may be null without rope
  const double* inv_freq;    // may be null without rope
  float* ws_m;               // n_q * n_splits
  float* ws_l;               // n_q * n_splits
  float* ws_acc;             // n_q * n_splits * max_cdv
};

inline AttnParams make_attn_params(const codec::AttentionProblem& p, const AttnPlan& plan,
                                   const AttnBuffers& b) {
  AttnParams P{};
  P.k_heads = b.k_heads;
  P.v_heads = b.v_heads;
  P.k_buf = b.k_buf;
  P.v_buf = b.v_buf;
  P.q = b.q;
  P.positions = plan.rope ? b.positions : nullptr;
  P.inv_freq = plan.rope ? b.inv_freq : nullptr;
  P.rotary_dim = plan.rotary_dim;
  P.rope_attention_factor = p.rope.attention_factor;
  P.pairing = p.rope.pairing;
  P.rope_enabled = plan.rope ? 1 : 0;
  P.n_q = p.n_q_heads;
  P.n_kv = p.n_kv_heads;
  P.group = plan.group;
  P.d = p.head_dim;
  P.T = p.n_tokens;
  P.t_first = codec::first_attended(p);
  P.tokens_per_split = plan.split.tokens_per_split;
  P.n_splits = plan.split.n_splits;
  P.scale = plan.scale;
  P.ws_m = b.ws_m;
  P.ws_l = b.ws_l;
  P.ws_acc = b.ws_acc;
  P.acc_stride = plan.max_cdv;
  return P;
}

// ---- kernels ----------------------------------------------------------------------------------

__device__ inline float warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

__global__ void __launch_bounds__(kThreads) attention_partial_kernel(AttnParams P) {
  __shared__ DevHead K, V;
  KVQ_DYNAMIC_SMEM(sm);
  const int kv = blockIdx.x, split = blockIdx.y;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  load_head(&P.k_heads[kv], &K);
  load_head(&P.v_heads[kv], &V);
  const int G = P.group, d = P.d;
  const int cdk = (int)K.L.code_dim, cdv = (int)V.L.code_dim;
  const bool rope = P.rope_enabled != 0;
  const SmemPlan S = smem_plan(G, d, cdk, cdv, rope);
  float* q_x = sm + S.q_x;
  float* q_c = sm + S.q_c;
  float* q_off = sm + S.q_off;
  float* wk = sm + S.wk;
  float* xk = sm + S.xk;
  float* wv = sm + S.wv;
  float* acc = sm + S.acc;
  float* p = sm + S.p;
  float* m_run = sm + S.m;
  float* l_run = sm + S.l;
  float* corr = sm + S.corr;
  float* red = sm + S.red;

  const int qh0 = kv * G;
  for (int i = tid; i < G * d; i += blockDim.x) q_x[i] = P.q[(size_t)qh0 * d + i];
  for (int i = tid; i < G * cdv; i += blockDim.x) acc[i] = 0.f;
  for (int g = tid; g < G; g += blockDim.x) {
    m_run[g] = -INFINITY;
    l_run[g] = 0.f;
    q_off[g] = 0.f;
  }
  __syncthreads();
  if (!rope)
    for (int g = 0; g < G; ++g) query_to_latent(K, q_x + g * d, q_c + g * cdk, q_off + g, red);

  const int t_begin = P.t_first + split * P.tokens_per_split;
  const int t_end = min(P.T, t_begin + P.tokens_per_split);
  const uint8_t* kb = P.k_buf[kv];
  const uint8_t* vb = P.v_buf[kv];
  for (int t0 = t_begin; t0 < t_end; t0 += kTile) {
    const int nt = min(kTile, t_end - t0);
    decode_latent_tile(K, kb, (uint32_t)t0, nt, wk, cdk);
    decode_latent_tile(V, vb, (uint32_t)t0, nt, wv, cdv);
    __syncthreads();
    if (rope) {
      latent_to_x_tile(K, wk, cdk, nt, xk, d);
      __syncthreads();
      const int nb = P.rotary_dim / 2;
      for (int idx = tid; idx < nt * nb; idx += blockDim.x) {
        const int t = idx / nb, i = idx - t * nb;
        const double ang = (double)P.positions[t0 + t] * P.inv_freq[i];
        double s, c;
        sincos(ang, &s, &c);
        s *= P.rope_attention_factor;
        c *= P.rope_attention_factor;
        int a, b;
        rope_block_coords(P.pairing, d, P.rotary_dim, i, &a, &b);
        float* row = xk + t * d;
        double ya, yb;
        rope_rotate_pair<double>(row[a], row[b], c, s, &ya, &yb);
        row[a] = (float)ya;
        row[b] = (float)yb;
      }
      __syncthreads();
    }
    // Scores: one warp per (query head, token).
    for (int pair = warp; pair < G * nt; pair += kWarps) {
      const int g = pair / nt, t = pair - g * nt;
      float s = 0.f;
      if (rope) {
        const float* a = q_x + g * d;
        const float* b = xk + t * d;
        for (int i = lane; i < d; i += 32) s += a[i] * b[i];
      } else {
        const float* a = q_c + g * cdk;
        const float* b = wk + t * cdk;
        for (int i = lane; i < cdk; i += 32) s += a[i] * b[i];
      }
      s = warp_sum(s);
      if (lane == 0) p[g * kTile + t] = (s + (rope ? 0.f : q_off[g])) * P.scale;
    }
    __syncthreads();
    // Online softmax update, one thread per query head.
    for (int g = tid; g < G; g += blockDim.x) {
      float mx = m_run[g];
      for (int t = 0; t < nt; ++t) mx = fmaxf(mx, p[g * kTile + t]);
      const float c = m_run[g] == -INFINITY ? 0.f : expf(m_run[g] - mx);
      float l = l_run[g] * c;
      for (int t = 0; t < nt; ++t) {
        const float e = expf(p[g * kTile + t] - mx);
        p[g * kTile + t] = e;
        l += e;
      }
      corr[g] = c;
      m_run[g] = mx;
      l_run[g] = l;
    }
    __syncthreads();
    for (int idx = tid; idx < G * cdv; idx += blockDim.x) {
      const int g = idx / cdv, k = idx - g * cdv;
      float a = acc[idx] * corr[g];
      for (int t = 0; t < nt; ++t) a += p[g * kTile + t] * wv[t * cdv + k];
      acc[idx] = a;
    }
    __syncthreads();
  }
  for (int idx = tid; idx < G * cdv; idx += blockDim.x) {
    const int g = idx / cdv, k = idx - g * cdv;
    P.ws_acc[((size_t)(qh0 + g) * P.n_splits + split) * P.acc_stride + k] = acc[idx];
  }
  for (int g = tid; g < G; g += blockDim.x) {
    P.ws_m[(size_t)(qh0 + g) * P.n_splits + split] = m_run[g];
    P.ws_l[(size_t)(qh0 + g) * P.n_splits + split] = l_run[g];
  }
}

// Dynamic shared memory: (acc_stride + d) floats.
__global__ void __launch_bounds__(kThreads) attention_combine_kernel(AttnParams P, float* out) {
  __shared__ DevHead V;
  KVQ_DYNAMIC_SMEM(sm);  // w[cdv], x[d]
  const int qh = blockIdx.x, kv = qh / P.group;
  load_head(&P.v_heads[kv], &V);
  const int cdv = (int)V.L.code_dim, d = P.d, S = P.n_splits;
  float* w = sm;
  float* x = sm + cdv;
  const float* ms = P.ws_m + (size_t)qh * S;
  const float* ls = P.ws_l + (size_t)qh * S;
  float mx = -INFINITY;
  for (int s = 0; s < S; ++s) mx = fmaxf(mx, ms[s]);
  float l = 0.f;
  for (int s = 0; s < S; ++s) l += ms[s] == -INFINITY ? 0.f : ls[s] * expf(ms[s] - mx);
  for (int k = threadIdx.x; k < cdv; k += blockDim.x) {
    float a = 0.f;
    for (int s = 0; s < S; ++s)
      if (ms[s] != -INFINITY) a += P.ws_acc[((size_t)qh * S + s) * P.acc_stride + k] * expf(ms[s] - mx);
    w[k] = a / l;
  }
  __syncthreads();
  latent_to_x_tile(V, w, cdv, 1, x, d);
  __syncthreads();
  for (int i = threadIdx.x; i < d; i += blockDim.x) out[(size_t)qh * d + i] = x[i];
}

}  // namespace kvq::cuda::detail
