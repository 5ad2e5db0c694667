#pragma once
// The GPU encoder (fp32 head vectors -> the frozen packed layout), every coding kind, bit for bit
// the CPU encoder's bytes (lib/codec/src/kind_*.cpp): the same float and double operations in the
// same order, each rounded once (rn_math.cuh: no fused multiply-adds, IEEE division and sqrt), the
// same tie rules. Free of CUDA runtime calls so tests/cuda/test_encode_emulation.cpp runs this
// exact code on CPU threads; kernels/encode.cu adds the launch. Include from one .cu only (the
// kernel is not inline).
//
// One thread block per unit of work, grid-stride: a tile of up to kEncTile tokens for TQ and low
// rank (each projection weight is loaded once for the whole tile, so a bulk encode reads the
// rotation / basis from L2 kEncTile times less often), a layout block otherwise (a token; KIVI K:
// group_size tokens). Per unit:
//   1. the per-record work (group norms, scale/zero, the latent norm) by one thread per (token,
//      record), sequential sums in the CPU's order (the order decides the rounding);
//   2. one thread per code index: projection (TQ: row j of Pi_g; low rank: row k of M, read as the
//      transposes so that the threads' loads coalesce) and the scalar quantizer, codes to shared
//      memory;
//   3. one thread per output byte assembles records, codes and padding: consecutive threads write
//      consecutive bytes, no read-modify-write of global memory, no atomics.
#include <math.h>
#include <stdint.h>

#include "kvq/cuda/device_codec.cuh"
#include "kvq/cuda/rn_math.cuh"

// Unrolled on the device (the tile's accumulators stay in registers); host compilers (the CPU
// emulation) do not know the pragma.
#if defined(__CUDACC__)
#define KVQ_ENC_UNROLL _Pragma("unroll")
#else
#define KVQ_ENC_UNROLL
#endif

namespace kvq::cuda::detail {

constexpr int kEncMaxDim = 256;  // = kvq::cuda::kMaxHeadDim (encode.cu checks)
constexpr int kEncTile = 8;      // tokens per TQ / low-rank unit of work
constexpr int kTokRec = 2 * layout::kMaxGroups;  // stride of a tile token's records in rec (TQ, low rank)

// Shared memory of one encoder block (about 27 KB).
struct EncShared {
  float x[kEncTile][kEncMaxDim];  // TQ: the tile's tokens in code (latent) order; low rank: x - mu
  float z[kEncTile][kEncMaxDim];  // low rank: the latents M (x - mu)
  float scale[kEncMaxDim];        // KIVI: decoded scale / zero per record
  float zero[kEncMaxDim];
  double inv[kEncTile][layout::kMaxGroups];  // TQ: 1 / rho~_g (0 for a zero norm)
  double n2g[layout::kMaxGroups];            // TQ compact, one token at a time: ||x_g||^2
  double ratio[layout::kMaxGroups];          // TQ compact: rho_g / rho
  double dot[1 << layout::kMaxRatioBits];
  double nv_scale[kEncMaxDim / layout::kNvfp4BlockValues];  // NVFP4: decoded block scale * global
  double n2;
  float step[kEncTile];  // low rank
  uint32_t level;        // TQ compact
  uint8_t codes[kEncTile][kEncMaxDim];
  uint8_t rec[4 * kEncMaxDim];  // records: KIVI K 4 bytes per channel; TQ / low rank kTokRec per token
};
static_assert(kEncTile * kTokRec <= 4 * kEncMaxDim, "the tile's records fit in rec");

// kvq::codec::detail::to_f16_sat: clamp to +-65504, then round to fp16.
__device__ inline uint16_t enc_f16_sat(float v) {
  const float c = v < -layout::kF16Max ? -layout::kF16Max : (layout::kF16Max < v ? layout::kF16Max : v);
  return layout::f32_to_f16(c);
}

// kvq::codec::nearest_index: the first threshold > v (ties go to the upper cell).
__device__ inline uint32_t enc_nearest(const float* th, int n_th, float v) {
  int lo = 0, hi = n_th;
  while (lo < hi) {
    const int mid = (lo + hi) >> 1;
    if (th[mid] <= v) lo = mid + 1; else hi = mid;
  }
  return (uint32_t)lo;
}

// Stream byte `byte` (stream bits [8 byte, 8 byte + 8)) as far as a run of n codes of width b
// starting at stream bit bit0 fills it; code(i) gives code i (LSB-first, as layout::put_code).
template <class Code>
__device__ inline uint32_t run_byte(uint32_t byte, uint32_t bit0, uint32_t n, uint32_t b, Code&& code) {
  const uint32_t lo = byte * 8;
  if (lo + 8 <= bit0 || lo >= bit0 + n * b) return 0;
  const uint32_t i0 = lo > bit0 ? (lo - bit0) / b : 0;
  uint32_t i1 = (lo + 7 - bit0) / b + 1;
  if (i1 > n) i1 = n;
  uint32_t v = 0;
  for (uint32_t i = i0; i < i1; ++i) {
    const uint32_t pos = bit0 + i * b;
    const uint32_t c = (uint32_t)code(i) & ((1u << b) - 1u);
    v |= pos >= lo ? c << (pos - lo) : c >> (lo - pos);
  }
  return v & 0xffu;
}

// Writes nt consecutive blocks: token t's records from rec + t * rec_stride, then a code stream of n
// codes of width b (codes[t]), then zero padding. Cooperative; reads only rec and codes.
__device__ inline void write_uniform_blocks(const PackedLayout& L, const uint8_t* rec, uint32_t rec_stride,
                                            const uint8_t (*codes)[kEncMaxDim], int nt, uint32_t n, uint32_t b,
                                            uint8_t* out) {
  const uint32_t bb = L.block_bytes;
  for (uint32_t i = threadIdx.x; i < (uint32_t)nt * bb; i += blockDim.x) {
    const uint32_t t = i / bb, j = i - t * bb;
    uint32_t v;
    if (j < L.meta_bytes) v = rec[t * rec_stride + j];
    else v = run_byte(j - L.meta_bytes, 0, n, b, [codes, t](uint32_t k) { return codes[t][k]; });
    out[i] = (uint8_t)v;
  }
}

// ---- tq-groups (kind_tq_groups.cpp) -----------------------------------------------------------

// Tile token tt's compact record (head norm level | ratio index) and s.inv[tt]. Cooperative,
// synchronises.
__device__ inline void tq_compact_norms(const DevHead& h, EncShared& s, int tt) {
  const PackedLayout& L = h.L;
  const int tid = threadIdx.x, ng = (int)L.n_groups;
  uint8_t* rec = s.rec + tt * kTokRec;
  if (tid < ng) {
    const float* xg = s.x[tt] + h.latent_off[tid];
    double s2 = 0.0;
    for (int j = 0; j < (int)L.groups[tid].dim; ++j) s2 = rn_add(s2, rn_mul((double)xg[j], (double)xg[j]));
    s.n2g[tid] = s2;
  }
  __syncthreads();
  if (tid == 0) {
    double n2 = 0.0;
    for (int g = 0; g < ng; ++g) n2 = rn_add(n2, s.n2g[g]);
    const float rho = rn_to_float(rn_sqrt(n2));
    // Nearest level (levels ascend; the lower one on a tie): upper_bound, then one step up.
    const uint32_t nl = 1u << layout::tq_level_bits(L);
    const float* lv = h.norm_levels;
    uint32_t lo = 0, hi = nl;
    while (lo < hi) {
      const uint32_t mid = (lo + hi) >> 1;
      if (rho < lv[mid]) hi = mid; else lo = mid + 1;
    }
    uint32_t q = lo == 0 ? 0 : lo - 1;
    if (q + 1 < nl && rn_sub(lv[q + 1], rho) < rn_sub(rho, lv[q])) ++q;
    s.level = q;
    s.n2 = n2;
    if (n2 > 0.0) {
      const double inv_rho = rn_div(1.0, rn_sqrt(n2));
      for (int g = 0; g < ng; ++g) s.ratio[g] = rn_mul(rn_sqrt(s.n2g[g]), inv_rho);
    }
  }
  __syncthreads();
  const uint32_t K = 1u << L.ratio_bits;
  const bool nonzero = s.n2 > 0.0;
  if (nonzero)
    for (uint32_t j = tid; j < K; j += blockDim.x) {
      const float* cj = h.ratios + j * (uint32_t)ng;
      double dot = 0.0;
      for (int g = 0; g < ng; ++g) dot = rn_add(dot, rn_mul(s.ratio[g], (double)cj[g]));
      s.dot[j] = dot;
    }
  __syncthreads();
  if (tid == 0) {
    uint32_t best = 0;
    if (nonzero) {
      double best_dot = -1.0;  // the first codeword with the largest dot product
      for (uint32_t j = 0; j < K; ++j)
        if (s.dot[j] > best_dot) {
          best_dot = s.dot[j];
          best = j;
        }
    }
    const uint32_t w = s.level | (best << layout::tq_level_bits(L));
    rec[0] = (uint8_t)(w & 0xffu);
    rec[1] = (uint8_t)(w >> 8);
  }
  __syncthreads();
  if (tid < ng) {
    // Quantize against the stored norm, as the CPU does.
    const float sg = layout::tq_group_norm(L, rec, (uint32_t)tid, h.norm_levels, h.ratios);
    s.inv[tt][tid] = sg > 0.f ? rn_div(1.0, (double)sg) : 0.0;
  }
}

// Tokens xt[0 .. nt) (nt <= kEncTile) into their nt consecutive blocks at out.
__device__ inline void tq_encode_tile(const DevHead& h, const float* xt, int nt, uint8_t* out, EncShared& s) {
  const PackedLayout& L = h.L;
  const int tid = threadIdx.x, d = (int)L.head_dim, ng = (int)L.n_groups;
  for (int i = tid; i < nt * d; i += blockDim.x) {
    const int t = i / d, k = i - t * d;
    s.x[t][k] = xt[(size_t)t * d + h.dims[k]];
  }
  __syncthreads();
  if (L.ratio_bits > 0) {
    for (int t = 0; t < nt; ++t) tq_compact_norms(h, s, t);  // block-uniform trip count
  } else {
    for (int i = tid; i < nt * ng; i += blockDim.x) {
      const int t = i / ng, g = i - t * ng;
      const float* xg = s.x[t] + h.latent_off[g];
      double n2 = 0.0;
      for (int j = 0; j < (int)L.groups[g].dim; ++j) n2 = rn_add(n2, rn_mul((double)xg[j], (double)xg[j]));
      const uint16_t rho_h = enc_f16_sat(rn_to_float(rn_sqrt(n2)));
      s.rec[t * kTokRec + 2 * g] = (uint8_t)(rho_h & 0xffu);
      s.rec[t * kTokRec + 2 * g + 1] = (uint8_t)(rho_h >> 8);
      const float rho = layout::f16_to_f32(rho_h);
      s.inv[t][g] = rho > 0.f ? rn_div(1.0, (double)rho) : 0.0;
    }
  }
  __syncthreads();
  // u_j = (Pi_g x_g)_j summed over p in order from 0 (small_gemm_exact), each weight loaded once for
  // the tile; then the nearest centroid of the float u_j / rho~ (the product formed in double).
  for (int k = tid; k < d; k += blockDim.x) {
    const uint32_t g = h.group_of[k];
    const int m = (int)L.groups[g].dim, lo = (int)h.latent_off[g];
    const float* pt = h.rot_t + h.rot_off[g] + (k - lo);
    float u[kEncTile];
KVQ_ENC_UNROLL
    for (int t = 0; t < kEncTile; ++t) u[t] = 0.f;
    for (int p = 0; p < m; ++p) {
      const float w = pt[p * m];
KVQ_ENC_UNROLL
      for (int t = 0; t < kEncTile; ++t)
        if (t < nt) u[t] = rn_add(u[t], rn_mul(s.x[t][lo + p], w));
    }
    const float* th = h.thresholds + h.cb_off[g];
    const int n_th = (1 << L.groups[g].bits) - 1;
KVQ_ENC_UNROLL
    for (int t = 0; t < kEncTile; ++t)
      if (t < nt) s.codes[t][k] = (uint8_t)enc_nearest(th, n_th, rn_to_float(rn_mul((double)u[t], s.inv[t][g])));
  }
  __syncthreads();
  const uint32_t bb = L.block_bytes;
  for (uint32_t i = threadIdx.x; i < (uint32_t)nt * bb; i += blockDim.x) {
    const uint32_t t = i / bb, j = i - t * bb;
    uint32_t v = 0;
    if (j < L.meta_bytes) {
      v = s.rec[t * kTokRec + j];
    } else {
      const uint32_t byte = j - L.meta_bytes;
      for (int g = 0; g < ng; ++g) {
        const uint8_t* cg = s.codes[t] + h.latent_off[g];
        v |= run_byte(byte, L.groups[g].code_bit_offset, L.groups[g].dim, L.groups[g].bits,
                      [cg](uint32_t c) { return cg[c]; });
      }
    }
    out[i] = (uint8_t)v;
  }
}

// ---- lowrank-hadamard (kind_lowrank_hadamard.cpp) ---------------------------------------------

// Tokens xt[0 .. nt) (nt <= kEncTile) into their nt consecutive blocks at out.
__device__ inline void lrh_encode_tile(const DevHead& h, const float* xt, int nt, uint8_t* out, EncShared& s) {
  const PackedLayout& L = h.L;
  const int tid = threadIdx.x, d = (int)L.head_dim, r = (int)L.code_dim;
  for (int i = tid; i < nt * d; i += blockDim.x) {
    const int t = i / d, c = i - t * d;
    s.x[t][c] = rn_sub(xt[(size_t)t * d + c], h.mean[c]);
  }
  __syncthreads();
  for (int k = tid; k < r; k += blockDim.x) {  // z = M (x - mu), summed over i in order
    float z[kEncTile];
KVQ_ENC_UNROLL
    for (int t = 0; t < kEncTile; ++t) z[t] = 0.f;
    for (int i = 0; i < d; ++i) {
      const float w = h.folded_t[i * r + k];
KVQ_ENC_UNROLL
      for (int t = 0; t < kEncTile; ++t)
        if (t < nt) z[t] = rn_add(z[t], rn_mul(s.x[t][i], w));
    }
KVQ_ENC_UNROLL
    for (int t = 0; t < kEncTile; ++t)
      if (t < nt) s.z[t][k] = z[t];
  }
  __syncthreads();
  for (int t = tid; t < nt; t += blockDim.x) {
    double n2 = 0.0;
    for (int k = 0; k < r; ++k) n2 = rn_add(n2, rn_mul((double)s.z[t][k], (double)s.z[t][k]));
    const uint16_t rho_h = enc_f16_sat(rn_to_float(rn_sqrt(n2)));
    s.rec[t * kTokRec] = (uint8_t)(rho_h & 0xffu);
    s.rec[t * kTokRec + 1] = (uint8_t)(rho_h >> 8);
    s.step[t] = rn_mul(layout::f16_to_f32(rho_h), h.step_unit);
  }
  __syncthreads();
  const int half = 1 << (L.bits - 1);
  for (int i = tid; i < nt * r; i += blockDim.x) {
    const int t = i / r, k = i - t * r;
    int q = half;  // a zero latent
    if (s.step[t] > 0.f) {
      float v = floorf(rn_div(s.z[t][k], s.step[t]));
      const float lo = (float)-half, hi = (float)(half - 1);
      v = v < lo ? lo : (hi < v ? hi : v);
      q = (int)v + half;
    }
    s.codes[t][k] = (uint8_t)q;
  }
  __syncthreads();
  write_uniform_blocks(L, s.rec, kTokRec, s.codes, nt, (uint32_t)r, L.bits, out);
}

// ---- kivi (kind_kivi.cpp) ---------------------------------------------------------------------

__device__ inline uint32_t kivi_quant(float v, float scale, float zero, float qmax) {
  if (!(scale > 0.f)) return 0;
  float q = floorf(rn_add(rn_div(rn_sub(v, zero), scale), 0.5f));
  q = q < 0.f ? 0.f : (qmax < q ? qmax : q);
  return (uint32_t)q;
}

// Min / max over n values at stride `stride`, in order (std::min / std::max: the first of equal
// values is kept, which decides +0 vs -0), then the record at rec and the decoded scale / zero.
__device__ inline void kivi_record(const float* v, int n, size_t stride, float qmax, uint8_t* rec, float* scale,
                                   float* zero) {
  float mn = INFINITY, mx = -INFINITY;
  for (int i = 0; i < n; ++i) {
    const float a = v[(size_t)i * stride];
    mn = a < mn ? a : mn;
    mx = mx < a ? a : mx;
  }
  const uint16_t s_h = enc_f16_sat(rn_div(rn_sub(mx, mn), qmax));
  const uint16_t z_h = enc_f16_sat(mn);
  rec[0] = (uint8_t)(s_h & 0xffu);
  rec[1] = (uint8_t)(s_h >> 8);
  rec[2] = (uint8_t)(z_h & 0xffu);
  rec[3] = (uint8_t)(z_h >> 8);
  *scale = layout::f16_to_f32(s_h);
  *zero = layout::f16_to_f32(z_h);
}

// V: one token per block, a record per group of group_size channels.
__device__ inline void kivi_v_encode_token(const DevHead& h, const float* xt, uint8_t* blk, EncShared& s) {
  const PackedLayout& L = h.L;
  const int tid = threadIdx.x, d = (int)L.head_dim, g = (int)L.group_size;
  const float qmax = (float)((1 << L.bits) - 1);
  for (int gi = tid; gi < (int)L.n_records; gi += blockDim.x) {
    const int c0 = gi * g, c1 = min(d, c0 + g);
    kivi_record(xt + c0, c1 - c0, 1, qmax, s.rec + 4 * gi, &s.scale[gi], &s.zero[gi]);
  }
  __syncthreads();
  for (int c = tid; c < d; c += blockDim.x) s.codes[0][c] = (uint8_t)kivi_quant(xt[c], s.scale[c / g], s.zero[c / g], qmax);
  __syncthreads();
  write_uniform_blocks(L, s.rec, 0, s.codes, 1, (uint32_t)d, L.bits, blk);
}

// K: one block of group_size tokens (nt of them present), a record per channel; codes token-major.
__device__ inline void kivi_k_encode_block(const DevHead& h, const float* xb, int nt, uint8_t* blk, EncShared& s) {
  const PackedLayout& L = h.L;
  const int tid = threadIdx.x, d = (int)L.head_dim, g = (int)L.group_size;
  const float qmax = (float)((1 << L.bits) - 1);
  for (int c = tid; c < d; c += blockDim.x)
    kivi_record(xb + c, nt, (size_t)d, qmax, s.rec + 4 * c, &s.scale[c], &s.zero[c]);
  __syncthreads();
  const uint32_t n_codes = (uint32_t)g * (uint32_t)d;
  for (uint32_t i = threadIdx.x; i < L.block_bytes; i += blockDim.x) {
    uint32_t v;
    if (i < L.meta_bytes) {
      v = s.rec[i];
    } else {
      v = run_byte(i - L.meta_bytes, 0, n_codes, L.bits, [&](uint32_t k) -> uint32_t {
        const int t = (int)(k / (uint32_t)d), c = (int)(k % (uint32_t)d);
        return t < nt ? kivi_quant(xb[(size_t)t * d + c], s.scale[c], s.zero[c], qmax) : 0u;
      });
    }
    blk[i] = (uint8_t)v;
  }
}

// ---- minifloat (kind_minifloat.cpp, minifloat.cpp) --------------------------------------------

__device__ inline void mf_encode_token(const DevHead& h, const float* xt, uint8_t* blk, EncShared& s) {
  const PackedLayout& L = h.L;
  const int tid = threadIdx.x, d = (int)L.head_dim;
  const double gs = (double)h.mf_scale;
  if (L.bits == 8) {  // FP8: E4M3(x / scale), the quotient in double
    for (int c = tid; c < d; c += blockDim.x) s.codes[0][c] = (uint8_t)mf_e4m3_encode(rn_div((double)xt[c], gs));
  } else {  // NVFP4
    const int nb = (int)L.n_records, bv = (int)layout::kNvfp4BlockValues;
    for (int b = tid; b < nb; b += blockDim.x) {
      const int lo = b * bv, hi = min(d, lo + bv);
      double amax = 0.0;
      for (int i = lo; i < hi; ++i) amax = fmax(amax, fabs((double)xt[i]));
      const uint32_t sc = mf_e4m3_encode(rn_div(amax, rn_mul(6.0, gs)));
      s.rec[b] = (uint8_t)sc;
      s.nv_scale[b] = rn_mul((double)mf_e4m3_decode(sc), gs);
    }
    __syncthreads();
    for (int c = tid; c < d; c += blockDim.x) {
      const double sb = s.nv_scale[c / bv];
      s.codes[0][c] = (uint8_t)(sb == 0.0 ? 0u : mf_e2m1_encode(rn_div((double)xt[c], sb)));
    }
  }
  __syncthreads();
  write_uniform_blocks(L, s.rec, 0, s.codes, 1, (uint32_t)d, L.bits, blk);
}

// ---- the kernels ------------------------------------------------------------------------------

// x: [n_tokens][d]; out: packed_bytes(n_tokens) bytes, every byte written (records, codes,
// padding, the tail of a partial KIVI K block). This thread block takes layout blocks blockIdx.x,
// + gridDim.x, ... Cooperative (all threads of the block, same arguments).
__device__ inline void encode_blocks(const DevHead* gh, const float* x, int n_tokens, uint8_t* out) {
  __shared__ DevHead h;
  __shared__ EncShared s;
  load_head(gh, &h);
  const PackedLayout& L = h.L;
  const size_t d = L.head_dim;
  if (L.kind == layout::kKindTqGroups || L.kind == layout::kKindLowRankHadamard) {  // one token per block
    const int n_tiles = (n_tokens + kEncTile - 1) / kEncTile;
    for (int tile = blockIdx.x; tile < n_tiles; tile += gridDim.x) {  // block-uniform trip count
      const int t0 = tile * kEncTile, nt = min(kEncTile, n_tokens - t0);
      if (L.kind == layout::kKindTqGroups) tq_encode_tile(h, x + (size_t)t0 * d, nt, out + (size_t)t0 * L.block_bytes, s);
      else lrh_encode_tile(h, x + (size_t)t0 * d, nt, out + (size_t)t0 * L.block_bytes, s);
      __syncthreads();  // shared state is reused by the next tile
    }
    return;
  }
  const int tpb = (int)L.tokens_per_block;
  const int n_blocks = (n_tokens + tpb - 1) / tpb;
  for (int b = blockIdx.x; b < n_blocks; b += gridDim.x) {
    const float* xb = x + (size_t)b * (size_t)tpb * d;
    uint8_t* ob = out + (size_t)b * L.block_bytes;
    if (L.kind == layout::kKindKivi) {
      if (L.side == layout::kSideK) kivi_k_encode_block(h, xb, min(tpb, n_tokens - b * tpb), ob, s);
      else kivi_v_encode_token(h, xb, ob, s);
    } else {
      mf_encode_token(h, xb, ob, s);
    }
    __syncthreads();
  }
}

// Thread blocks needed for n_tokens of a head with this layout (encode_blocks' units of work).
__host__ __device__ inline int encode_units(const PackedLayout& L, int n_tokens) {
  const int per = L.kind == layout::kKindTqGroups || L.kind == layout::kKindLowRankHadamard ? kEncTile
                                                                                           : (int)L.tokens_per_block;
  return n_tokens / per + (n_tokens % per != 0);
}

// One head: thread blocks over its units of work (grid-stride).
__global__ void __launch_bounds__(kThreads)
encode_kernel(const DevHead* gh, const float* x, int n_tokens, uint8_t* out) {
  encode_blocks(gh, x, n_tokens, out);
}

// Many heads in one launch (kvq/cuda/encode_batch.hpp: the same layout as kvq::cuda::EncodeJob):
// job blockIdx.y, its layout blocks over blockIdx.x.
struct EncJob {
  const DevHead* head;
  const float* x;
  uint8_t* out;
};

__global__ void __launch_bounds__(kThreads)
encode_batch_kernel(const EncJob* jobs, int n_tokens) {
  const EncJob j = jobs[blockIdx.y];
  encode_blocks(j.head, j.x, n_tokens, j.out);
}

// KIVI K append (PackedKvCache::append): a K record spans the group_size tokens of a layout block,
// so a new token changes its open block's scales, zeros and every code in it. The cache keeps the
// fp32 rows of each sequence's open group; a step writes the new row at slot len % group_size and
// re-encodes the whole block from those rows (kivi_k_encode_block, nt = slot + 1), so the stream
// holds exactly the CPU encoder's bytes of the first len + 1 tokens.
// (KiviKAppend: dev_head.cuh, shared with the cache's host code.)
// grid (batch, KIVI K heads). lengths: before this step's advance; a full sequence is left as is
// (append_tokens_kernel reports the overflow). Cooperative per block; the early return is uniform.
__global__ void __launch_bounds__(kThreads)
kivi_k_append_kernel(const KiviKAppend* jobs, const int32_t* lengths, int capacity) {
  __shared__ DevHead h;
  __shared__ EncShared s;
  const KiviKAppend j = jobs[blockIdx.y];
  load_head(j.head, &h);
  const int b = blockIdx.x;
  const int len = lengths[b];
  if (len >= capacity) return;
  const int g = (int)h.L.tokens_per_block, d = (int)h.L.head_dim;
  const int slot = len % g;
  float* rows = j.rows + (size_t)b * g * d;
  for (int c = threadIdx.x; c < d; c += blockDim.x) rows[(size_t)slot * d + c] = j.x[(size_t)b * d + c];
  __syncthreads();
  kivi_k_encode_block(h, rows, slot + 1, j.stream + (size_t)b * j.seq_bytes + (size_t)(len / g) * h.L.block_bytes, s);
}

}  // namespace kvq::cuda::detail
