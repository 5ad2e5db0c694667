#pragma once
// Fused decode attention (flash decoding) over packed K/V: one query token per sequence, B
// sequences with their own lengths, GQA 1..16. Free of CUDA runtime calls so
// tests/cuda/test_attention_emulation.cpp runs this exact code on CPU threads; kernels/attention.cu
// and kernels/kv_cache.cu add allocation and launches. Include from one .cu per binary (kernels
// are not inline).
//
//   attention_query_kernel    grid (query head, sequence): the query moved into its KV head's K
//                             latent domain once per step (q . x = qc . latent + q_off).
//   attention_partial_kernel  grid (split, KV head, sequence): each of the block's warps takes
//                             tiles of kTokTile tokens of the split (tile w, w + kWarps, ...),
//                             stages their packed bytes with 16-byte loads, scores them for all G
//                             query heads (one token per lane, centroid lookups against qc: keys
//                             are never back-rotated; pre-RoPE keys are decoded to x and rotated by
//                             the warp, one token at a time), keeps its own online softmax
//                             (max, sum) and accumulates the values in V's latent domain (one
//                             coordinate per lane). The warps merge once, at the end, and write
//                             (max, sum, acc) per query head and split.
//   attention_combine_kernel  grid (query head, sequence): merges the splits, divides by the sum
//                             and maps the latent back to x once (V's mean included).
// Splits are planned for the largest length (the cache's capacity) and a block whose split lies
// past its sequence's attended range returns at once: the launch shape never depends on the
// lengths, which live on the device, so a step can be captured in a CUDA graph.
#include <math.h>
#include <stdint.h>

#include "kvq/cuda/attention_params.cuh"
#include "kvq/cuda/attention_warp.cuh"
#include "kvq/cuda/device_codec.cuh"

// Dynamic shared memory, 16-byte aligned: the partial kernel stages packed bytes there with
// 16-byte stores.
#if defined(__CUDACC__)
#define KVQ_ATTN_SMEM(name) extern __shared__ __align__(16) float name[]
#else
#define KVQ_ATTN_SMEM(name) KVQ_DYNAMIC_SMEM(name)
#endif

namespace kvq::cuda::detail {

// Dynamic shared memory: plan.smem_query (q[d], qc[max_cdk], red[kWarps], q_off).
__global__ void __launch_bounds__(kThreads) attention_query_kernel(AttnParams P) {
  __shared__ DevHead K;
  KVQ_ATTN_SMEM(sm);
  const int qh = blockIdx.x, b = blockIdx.y, kv = qh / P.group, d = P.d;
  load_head(&P.k_heads[kv], &K);
  float* q = sm;
  float* qc = sm + d;
  float* red = qc + P.max_cdk;
  float* q_off = red + kWarps;
  const size_t row = (size_t)b * P.n_q + qh;
  for (int i = threadIdx.x; i < d; i += blockDim.x) q[i] = P.q[row * d + i];
  __syncthreads();
  query_to_latent(K, q, qc, q_off, red);
  for (int k = threadIdx.x; k < (int)K.L.code_dim; k += blockDim.x) P.ws_qc[row * P.max_cdk + k] = qc[k];
  if (threadIdx.x == 0) P.ws_qoff[row] = *q_off;
}

__global__ void __launch_bounds__(kThreads) attention_partial_kernel(AttnParams P) {
  __shared__ DevHead K, V;
  KVQ_ATTN_SMEM(sm);
  const int split = blockIdx.x, kv = blockIdx.y, b = blockIdx.z;
  int first, end;
  attended_range(P, b, &first, &end);
  const int t_begin = first + split * P.tokens_per_split;
  if (t_begin >= end) return;  // past this sequence's tokens: the combine reads no such split
  const int t_end = min(end, t_begin + P.tokens_per_split);
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int G = P.group, d = P.d;
  const bool rope = P.rope_enabled != 0;
  load_head(&P.k_heads[kv], &K);
  load_head(&P.v_heads[kv], &V);
  const SmemPlan S = smem_plan(P);
  float* cbk = sm + S.cbk;
  float* cbv = sm + S.cbv;
  float* qs = sm + S.q;
  float* qoff = sm + S.qoff;
  const int ldq = rope ? d : P.max_cdk;
  const int ncbk = codebook_floats(K.L), ncbv = codebook_floats(V.L);
  for (int i = tid; i < ncbk; i += blockDim.x) cbk[i] = K.codebook[i];
  for (int i = tid; i < ncbv; i += blockDim.x) cbv[i] = V.codebook[i];
  const size_t row0 = (size_t)b * P.n_q + (size_t)kv * G;
  if (rope) {
    for (int i = tid; i < G * d; i += blockDim.x) qs[i] = P.q[row0 * d + i];
  } else {
    const int cdk = (int)K.L.code_dim;
    for (int i = tid; i < G * cdk; i += blockDim.x) {
      const int g = i / cdk, k = i - g * cdk;
      qs[g * ldq + k] = P.ws_qc[(row0 + g) * P.max_cdk + k];
    }
  }
  for (int g = tid; g < G; g += blockDim.x) qoff[g] = rope ? 0.f : P.ws_qoff[row0 + g];

  float* wsm = sm + S.warp0 + warp * S.warp_stride;
  float* acc = wsm + S.w_acc;  // [G][cdv]
  float* pw = wsm + S.w_p;     // [G][kTokTile]
  float* vsw = wsm + S.w_vs;   // [kTokTile][max_ngv]
  float* mw = wsm + S.w_m;
  float* lw = wsm + S.w_l;
  float* lat = wsm + S.w_lat;
  float* xk = wsm + S.w_x;
  uint8_t* kstage = reinterpret_cast<uint8_t*>(wsm + S.w_kbytes);
  uint8_t* vstage = reinterpret_cast<uint8_t*>(wsm + S.w_vbytes);
  const int cdv = (int)V.L.code_dim;
  for (int i = lane; i < G * cdv; i += 32) acc[i] = 0.f;
  __syncthreads();  // codebooks and queries in shared memory

  const LaneCoords lc = lane_coords(V, lane);
  const uint8_t* kglob = P.k_buf[(size_t)b * P.n_kv + kv];
  const uint8_t* vglob = P.v_buf[(size_t)b * P.n_kv + kv];
  const bool kstaged = K.L.tokens_per_block == 1, vstaged = V.L.tokens_per_block == 1;
  const int ngv = V.L.n_groups > 0 ? (int)V.L.n_groups : 1;
  float m_run[kMaxGqaGroup], l_lane[kMaxGqaGroup], s[kMaxGqaGroup];
KVQ_UNROLL
  for (int g = 0; g < kMaxGqaGroup; ++g) {
    m_run[g] = -INFINITY;
    l_lane[g] = 0.f;
  }
  for (int t0 = t_begin + warp * kTokTile; t0 < t_end; t0 += kWarps * kTokTile) {
    const int nt = min(kTokTile, t_end - t0);
    const uint8_t* ks = kstaged ? stage_bytes(kglob + (size_t)t0 * K.L.block_bytes, nt * (int)K.L.block_bytes, kstage, lane)
                                : nullptr;
    const uint8_t* vs = vstaged ? stage_bytes(vglob + (size_t)t0 * V.L.block_bytes, nt * (int)V.L.block_bytes, vstage, lane)
                                : nullptr;
    __syncwarp();
    // Scores: lane t holds token t0 + t's (scaled) logits for the G query heads.
    if (rope) {
KVQ_UNROLL
      for (int g = 0; g < kMaxGqaGroup; ++g) s[g] = -INFINITY;
      for (int t = 0; t < nt; ++t) {
        float st[kMaxGqaGroup];
        const TokenRef r = token_ref(K.L, ks, kglob, (uint32_t)t0, t);
        const long long pos = P.positions ? P.positions[(long long)b * P.pos_stride + t0 + t] : (long long)(t0 + t);
        key_scores_rope(K, cbk, r, ks ? ks : kglob, ks ? (uint32_t)t : (uint32_t)(t0 + t), P, pos, qs, lat, xk, lane, st);
        if (lane == t) {
KVQ_UNROLL
          for (int g = 0; g < kMaxGqaGroup; ++g) s[g] = st[g] * P.scale;
        }
      }
    } else if (lane < nt) {
      key_scores_latent(K, cbk, token_ref(K.L, ks, kglob, (uint32_t)t0, lane), qs, ldq, G, s);
KVQ_UNROLL
      for (int g = 0; g < kMaxGqaGroup; ++g) s[g] = (s[g] + (g < G ? qoff[g] : 0.f)) * P.scale;
    } else {
KVQ_UNROLL
      for (int g = 0; g < kMaxGqaGroup; ++g) s[g] = -INFINITY;
    }
    if (lane < nt) value_scales(V, cbv, token_ref(V.L, vs, vglob, (uint32_t)t0, lane), vsw + lane * ngv);
    // Online softmax (the warp's own), probabilities to pw, the accumulator rescaled.
KVQ_UNROLL
    for (int g = 0; g < kMaxGqaGroup; ++g) {
      if (g >= G) break;
      const float m_new = fmaxf(m_run[g], warp_max(s[g]));
      const float corr = m_run[g] == -INFINITY ? 0.f : expf(m_run[g] - m_new);
      const float p = lane < nt ? expf(s[g] - m_new) : 0.f;
      l_lane[g] = l_lane[g] * corr + p;
      m_run[g] = m_new;
      pw[g * kTokTile + lane] = p;
      if (corr != 1.f)
        for (int i = 0; i < lc.n; ++i) acc[g * cdv + lane + 32 * i] *= corr;
    }
    __syncwarp();
    // Values: lane owns latent coordinates lane + 32 i; its G sums stay in registers over the tile.
    for (int i = 0; i < lc.n; ++i) {
      float a[kMaxGqaGroup];
      KVQ_UNROLL
      for (int g = 0; g < kMaxGqaGroup; ++g) a[g] = g < G ? acc[g * cdv + lane + 32 * i] : 0.f;
      for (int t = 0; t < nt; ++t) {
        const float v = value_latent(V, cbv, lc, i, token_ref(V.L, vs, vglob, (uint32_t)t0, t), vsw + t * ngv, lane);
        KVQ_UNROLL
        for (int g = 0; g < kMaxGqaGroup; ++g)
          if (g < G) a[g] += pw[g * kTokTile + t] * v;
      }
      KVQ_UNROLL
      for (int g = 0; g < kMaxGqaGroup; ++g)
        if (g < G) acc[g * cdv + lane + 32 * i] = a[g];
    }
    __syncwarp();  // staging, pw and vsw are rewritten by the next tile
  }
KVQ_UNROLL
  for (int g = 0; g < kMaxGqaGroup; ++g) {
    if (g >= G) break;
    const float l = warp_sum(l_lane[g]);
    if (lane == 0) {
      mw[g] = m_run[g];
      lw[g] = l;
    }
  }
  __syncthreads();
  // Merge the warps (a warp without tiles has max -inf and contributes nothing).
  const size_t S_ = (size_t)P.n_splits;
  for (int idx = tid; idx < G * cdv; idx += blockDim.x) {
    const int g = idx / cdv, k = idx - g * cdv;
    float M = -INFINITY;
    for (int w = 0; w < kWarps; ++w) M = fmaxf(M, sm[S.warp0 + w * S.warp_stride + S.w_m + g]);
    float a = 0.f;
    for (int w = 0; w < kWarps; ++w) {
      const float* ww = sm + S.warp0 + w * S.warp_stride;
      if (ww[S.w_m + g] != -INFINITY) a += ww[S.w_acc + idx] * expf(ww[S.w_m + g] - M);
    }
    P.ws_acc[((row0 + g) * S_ + split) * P.max_cdv + k] = a;
  }
  for (int g = tid; g < G; g += blockDim.x) {
    float M = -INFINITY, l = 0.f;
    for (int w = 0; w < kWarps; ++w) M = fmaxf(M, sm[S.warp0 + w * S.warp_stride + S.w_m + g]);
    for (int w = 0; w < kWarps; ++w) {
      const float* ww = sm + S.warp0 + w * S.warp_stride;
      if (ww[S.w_m + g] != -INFINITY) l += ww[S.w_l + g] * expf(ww[S.w_m + g] - M);
    }
    P.ws_m[(row0 + g) * S_ + split] = M;
    P.ws_l[(row0 + g) * S_ + split] = l;
  }
}

// Dynamic shared memory: plan.smem_combine (w[max_cdv], x[d]). out: [batch][n_q][d].
__global__ void __launch_bounds__(kThreads) attention_combine_kernel(AttnParams P, float* out) {
  __shared__ DevHead V;
  KVQ_ATTN_SMEM(sm);
  const int qh = blockIdx.x, b = blockIdx.y, kv = qh / P.group, d = P.d;
  load_head(&P.v_heads[kv], &V);
  int first, end;
  attended_range(P, b, &first, &end);
  const int n_valid = end > first ? (end - first + P.tokens_per_split - 1) / P.tokens_per_split : 0;
  const int cdv = (int)V.L.code_dim;
  float* w = sm;
  float* x = sm + P.max_cdv;
  const size_t row = (size_t)b * P.n_q + qh, S = (size_t)P.n_splits;
  const float* ms = P.ws_m + row * S;
  const float* ls = P.ws_l + row * S;
  float mx = -INFINITY;
  for (int s = 0; s < n_valid; ++s) mx = fmaxf(mx, ms[s]);
  float l = 0.f;
  for (int s = 0; s < n_valid; ++s) l += ms[s] == -INFINITY ? 0.f : ls[s] * expf(ms[s] - mx);
  for (int k = threadIdx.x; k < cdv; k += blockDim.x) {
    float a = 0.f;
    for (int s = 0; s < n_valid; ++s)
      if (ms[s] != -INFINITY) a += P.ws_acc[(row * S + s) * P.max_cdv + k] * expf(ms[s] - mx);
    w[k] = l > 0.f ? a / l : 0.f;  // an empty sequence attends nothing: zeros, not NaN
  }
  __syncthreads();
  latent_to_x_tile(V, w, cdv, 1, x, d);
  __syncthreads();
  for (int i = threadIdx.x; i < d; i += blockDim.x) out[row * d + i] = n_valid > 0 ? x[i] : 0.f;
}

}  // namespace kvq::cuda::detail
