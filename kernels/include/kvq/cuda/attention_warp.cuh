#pragma once
// Per-warp device code of the fused decode attention (attention_kernels.cuh): staging a tile of
// packed tokens into shared memory with 16-byte loads, scoring keys in the code domain (one token
// per lane), scoring pre-RoPE keys in x (one token per warp), and accumulating values in V's
// latent domain (one latent coordinate per lane). Nothing here synchronises more than one warp.
// Plain C++ outside nvcc so the CPU emulation (tests/cuda) runs it.
#include <math.h>
#include <stdint.h>

#include "kvq/cuda/attention_params.cuh"
#include "kvq/cuda/device_codec.cuh"

namespace kvq::cuda::detail {

#if defined(__CUDACC__)
using Word16 = uint4;
#else
struct alignas(16) Word16 {
  uint32_t x, y, z, w;
};
#endif

__device__ inline float warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ inline float warp_max(float v) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// Copies n bytes from global src into dst + (src mod 16) (dst 16-byte aligned) with one warp:
// bytes up to the first 16-byte boundary and after the last one singly, the rest as 16-byte words
// (coalesced: consecutive lanes, consecutive words). Returns where src's first byte landed. Never
// reads outside [src, src + n). The caller __syncwarp()s before reading.
__device__ inline const uint8_t* stage_bytes(const uint8_t* src, int n, uint8_t* dst, int lane) {
  const uintptr_t a = (uintptr_t)src;
  const int shift = (int)(a & 15u);
  uint8_t* out = dst + shift;
  const int head = shift ? min(n, 16 - shift) : 0;
  const int n_words = (n - head) / 16;
  const int body_end = head + 16 * n_words;
  for (int i = lane; i < head; i += 32) out[i] = src[i];
  const Word16* ws = reinterpret_cast<const Word16*>(src + head);
  Word16* wd = reinterpret_cast<Word16*>(out + head);
  for (int i = lane; i < n_words; i += 32) wd[i] = ws[i];
  for (int i = body_end + lane; i < n; i += 32) out[i] = src[i];
  return out;
}

// Where token t of a tile lives: staged (one-token blocks: t's block in shared memory, codes from
// bit 0) or in global memory (KIVI K's multi-token blocks, read in place).
struct TokenRef {
  const uint8_t* blk;
  uint32_t tb;
};
__device__ inline TokenRef token_ref(const PackedLayout& L, const uint8_t* staged, const uint8_t* global,
                                     uint32_t tok0, int t) {
  if (staged) return {staged + (size_t)t * L.block_bytes, 0u};
  const uint32_t tok = tok0 + (uint32_t)t;
  return {layout::block_ptr(L, global, tok), layout::token_code_bit_offset(L, tok)};
}

// Scores of one key (one lane, its whole token) against the G queries in K's latent domain:
// s[g] = qc[g] . latent(token) (without the q_off term). TQ: per group, the group's scale
// (rho~, or rho~/||c|| with norm correction) times sum_j qc_j centroid[code_j]; centroids from the
// shared-memory copy cb. qc: [G][ldq] in shared memory (a broadcast read: every lane the same
// address).
__device__ inline void key_scores_latent(const DevHead& h, const float* cb, TokenRef r, const float* qc, int ldq,
                                         int G, float* s) {
  const PackedLayout& L = h.L;
  const uint8_t* stream = r.blk + L.meta_bytes;
KVQ_UNROLL
  for (int g = 0; g < kMaxGqaGroup; ++g) s[g] = 0.f;
  if (L.kind == layout::kKindTqGroups) {
    for (uint32_t gr = 0; gr < L.n_groups; ++gr) {
      const layout::LayoutGroup& Gr = L.groups[gr];
      const float* c_tab = cb + h.cb_off[gr];
      const float* qg = qc + h.latent_off[gr];
      float dot[kMaxGqaGroup];
KVQ_UNROLL
      for (int g = 0; g < kMaxGqaGroup; ++g) dot[g] = 0.f;
      float n2 = 0.f;
      uint32_t pos = r.tb + Gr.code_bit_offset;
      for (int j = 0; j < (int)Gr.dim; ++j, pos += Gr.bits) {
        const float c = c_tab[layout::get_code(stream, pos, Gr.bits)];
        n2 += c * c;
KVQ_UNROLL
        for (int g = 0; g < kMaxGqaGroup; ++g)
          if (g < G) dot[g] += qg[g * ldq + j] * c;
      }
      const float rho = tq_rho(h, r.blk, gr);
      const float sc = h.norm_correction ? (n2 > 0.f ? rho / sqrtf(n2) : 0.f) : rho;
KVQ_UNROLL
      for (int g = 0; g < kMaxGqaGroup; ++g)
        if (g < G) s[g] += sc * dot[g];
    }
  } else if (L.kind == layout::kKindLowRankHadamard) {
    const float step = layout::f16_to_f32(layout::load_u16le(r.blk)) * h.step_unit;
    const int half = 1 << (L.bits - 1);
    uint32_t pos = r.tb;
    for (int k = 0; k < (int)L.code_dim; ++k, pos += L.bits) {
      const float z = (float)((int)layout::get_code(stream, pos, L.bits) - half) + 0.5f;
KVQ_UNROLL
      for (int g = 0; g < kMaxGqaGroup; ++g)
        if (g < G) s[g] += qc[g * ldq + k] * z;
    }
KVQ_UNROLL
    for (int g = 0; g < kMaxGqaGroup; ++g) s[g] *= step;
  } else {  // KIVI and minifloat: the latent is x
    const bool mf = L.kind == layout::kKindMinifloat;
    for (int k = 0; k < (int)L.code_dim; ++k) {
      const float x = mf ? mf_latent_value(h, r.blk, r.tb, (uint32_t)k) : kivi_latent_value(h, r.blk, r.tb, (uint32_t)k);
KVQ_UNROLL
      for (int g = 0; g < kMaxGqaGroup; ++g)
        if (g < G) s[g] += qc[g * ldq + k] * x;
    }
  }
}

// Per-token scales of V's latent (one lane, its token): TQ rho~ or rho~/||c|| per group, low rank
// the quantizer step; KIVI and minifloat need none (their scales are per record, read per
// value). vs: [n_groups] (this lane's row).
__device__ inline void value_scales(const DevHead& h, const float* cb, TokenRef r, float* vs) {
  const PackedLayout& L = h.L;
  if (L.kind == layout::kKindTqGroups) {
    const uint8_t* stream = r.blk + L.meta_bytes;
    for (uint32_t gr = 0; gr < L.n_groups; ++gr) {
      const float rho = tq_rho(h, r.blk, gr);
      if (!h.norm_correction) {
        vs[gr] = rho;
        continue;
      }
      const layout::LayoutGroup& Gr = L.groups[gr];
      const float* c_tab = cb + h.cb_off[gr];
      float n2 = 0.f;
      uint32_t pos = r.tb + Gr.code_bit_offset;
      for (int j = 0; j < (int)Gr.dim; ++j, pos += Gr.bits) {
        const float c = c_tab[layout::get_code(stream, pos, Gr.bits)];
        n2 += c * c;
      }
      vs[gr] = n2 > 0.f ? rho / sqrtf(n2) : 0.f;
    }
  } else if (L.kind == layout::kKindLowRankHadamard) {
    vs[0] = layout::f16_to_f32(layout::load_u16le(r.blk)) * h.step_unit;
  }
}

// What one lane needs to read its latent coordinates k = lane + 32 i of any token of a head.
struct LaneCoords {
  int n;                           // coordinates this lane owns
  uint32_t bitpos[kLanesMaxCoords];  // bit offset in a token's code stream
  uint8_t bits[kLanesMaxCoords];
  uint8_t group[kLanesMaxCoords];    // TQ group
  uint16_t cb0[kLanesMaxCoords];     // TQ: first centroid of the group in the codebook copy
};
__device__ inline LaneCoords lane_coords(const DevHead& h, int lane) {
  const PackedLayout& L = h.L;
  LaneCoords c{};
  c.n = 0;
KVQ_UNROLL
  for (int i = 0; i < kLanesMaxCoords; ++i) {
    const int k = lane + 32 * i;
    if (k >= (int)L.code_dim) break;
    if (L.kind == layout::kKindTqGroups) {
      const uint32_t g = h.group_of[k];
      c.group[i] = (uint8_t)g;
      c.bits[i] = L.groups[g].bits;
      c.bitpos[i] = L.groups[g].code_bit_offset + (uint32_t)(k - (int)h.latent_off[g]) * L.groups[g].bits;
      c.cb0[i] = (uint16_t)h.cb_off[g];
    } else {
      c.group[i] = 0;
      c.bits[i] = (uint8_t)L.bits;
      c.bitpos[i] = (uint32_t)k * L.bits;
      c.cb0[i] = 0;
    }
    c.n = i + 1;
  }
  return c;
}

// V's latent coordinate i of this lane for token r, given its per-token scales vs.
__device__ inline float value_latent(const DevHead& h, const float* cb, const LaneCoords& lc, int i, TokenRef r,
                                     const float* vs, int lane) {
  const PackedLayout& L = h.L;
  const uint8_t* stream = r.blk + L.meta_bytes;
  if (L.kind == layout::kKindTqGroups)
    return vs[lc.group[i]] * cb[lc.cb0[i] + layout::get_code(stream, r.tb + lc.bitpos[i], lc.bits[i])];
  if (L.kind == layout::kKindLowRankHadamard) {
    const int half = 1 << (L.bits - 1);
    return ((float)((int)layout::get_code(stream, r.tb + lc.bitpos[i], L.bits) - half) + 0.5f) * vs[0];
  }
  if (L.kind == layout::kKindMinifloat) return mf_latent_value(h, r.blk, r.tb, (uint32_t)(lane + 32 * i));
  return kivi_latent_value(h, r.blk, r.tb, (uint32_t)(lane + 32 * i));
}

// Pre-RoPE keys: one token decoded by the whole warp to x (lat: [cdk], x: [d], this warp's shared
// memory), rotated at position pos, and scored against the G queries in x (q_x: [G][d]). Every
// lane returns the G scores in s.
__device__ inline void key_scores_rope(const DevHead& h, const float* cb, TokenRef r, const uint8_t* lat_base,
                                       uint32_t lat_tok, const AttnParams& P, long long pos, const float* q_x,
                                       float* lat, float* x, int lane, float* s) {
  const PackedLayout& L = h.L;
  const int cd = (int)L.code_dim, d = P.d;
  if (L.kind == layout::kKindTqGroups && h.norm_correction) {
    const uint8_t* stream = r.blk + L.meta_bytes;
    for (uint32_t gr = 0; gr < L.n_groups; ++gr) {
      const layout::LayoutGroup& Gr = L.groups[gr];
      float n2 = 0.f;
      for (int j = lane; j < (int)Gr.dim; j += 32) {
        const float c = cb[h.cb_off[gr] + layout::get_code(stream, r.tb + Gr.code_bit_offset + (uint32_t)j * Gr.bits, Gr.bits)];
        lat[h.latent_off[gr] + j] = c;
        n2 += c * c;
      }
      n2 = warp_sum(n2);
      const float rho = tq_rho(h, r.blk, gr);
      const float sc = n2 > 0.f ? rho / sqrtf(n2) : 0.f;
      for (int j = lane; j < (int)Gr.dim; j += 32) lat[h.latent_off[gr] + j] *= sc;
    }
  } else {
    for (int k = lane; k < cd; k += 32) lat[k] = latent_value(h, lat_base, lat_tok, (uint32_t)k);
  }
  __syncwarp();
  if (L.kind == layout::kKindTqGroups) {
    for (int kk = lane; kk < d; kk += 32) {
      const uint32_t g = h.group_of[kk];
      const int m = L.groups[g].dim, i = kk - (int)h.latent_off[g];
      const float* pi = h.rot + h.rot_off[g];
      const float* wg = lat + h.latent_off[g];
      float acc = 0.f;
      for (int j = 0; j < m; ++j) acc += pi[j * m + i] * wg[j];
      x[h.dims[kk]] = acc;
    }
  } else if (L.kind == layout::kKindLowRankHadamard) {
    for (int i = lane; i < d; i += 32) {
      float acc = h.mean[i];
      for (int p = 0; p < cd; ++p) acc += h.folded[p * d + i] * lat[p];
      x[i] = acc;
    }
  } else {
    for (int i = lane; i < d; i += 32) x[i] = lat[i];
  }
  __syncwarp();
  for (int i = lane; i < P.rotary_dim / 2; i += 32) {
    // The angle in double (positions reach 2^19 and more), reduced to [-pi, pi] in double, then a
    // float sine and cosine: within a few 1e-7 of the reference's double sincos at a fraction of
    // its cost (this runs for every pair of every key).
    const double ang = (double)pos * P.inv_freq[i];
    const double kTwoPi = 6.283185307179586476925286766559;
    const float red = (float)(ang - kTwoPi * rint(ang * (1.0 / kTwoPi)));
    float snf, csf;
    sincosf(red, &snf, &csf);
    const double sn = (double)snf * P.rope_attention_factor;
    const double cs = (double)csf * P.rope_attention_factor;
    int a, b;
    rope_block_coords(P.pairing, d, P.rotary_dim, i, &a, &b);
    double ya, yb;
    rope_rotate_pair<double>(x[a], x[b], cs, sn, &ya, &yb);
    x[a] = (float)ya;
    x[b] = (float)yb;
  }
  __syncwarp();
KVQ_UNROLL
  for (int g = 0; g < kMaxGqaGroup; ++g) {
    if (g >= P.group) break;
    float part = 0.f;
    for (int i = lane; i < d; i += 32) part += q_x[g * d + i] * x[i];
    s[g] = warp_sum(part);
  }
  __syncwarp();  // lat and x are rewritten by the next token
}

}  // namespace kvq::cuda::detail
