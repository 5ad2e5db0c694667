#include "kvq/codec/codec.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>

#include "kvq/codec/codebook.hpp"
#include "kvq/codec/hadamard.hpp"
#include "kvq/codec/layout.hpp"
#include "kvq/codec/minifloat.hpp"
#include "kvq/util/error.hpp"
#include "small_gemm.hpp"

namespace kvq::codec {

using layout::f16_to_f32;
using layout::get_code;
using layout::put_code;

namespace {

constexpr int kTile = 32;  // tokens decoded per batch (latent tile stays in L1/L2)

// fp16 store that saturates instead of overflowing to inf (an inf scale would decode to NaN).
uint16_t to_f16_sat(float v) {
  return layout::f32_to_f16(std::clamp(v, -layout::kF16Max, layout::kF16Max));
}

void check_finite(const HeadDecision& dec, const float* x, int n_tokens, int d) {
  for (int t = 0; t < n_tokens; ++t)
    for (int i = 0; i < d; ++i)
      if (!std::isfinite(x[static_cast<size_t>(t) * d + i]))
        throw Error("", "encode " + decision_name(dec),
                    "non-finite input at token " + std::to_string(t) + ", dim " +
                        std::to_string(i));
}

}  // namespace

HeadCodec::HeadCodec(const HeadDecision& dec, int head_dim)
    : dec_(dec), d_(head_dim), layout_(layout_for(dec, head_dim)) {
  switch (dec.kind) {
    case CodingKind::kTqGroups: {
      uint32_t off = 0;
      for (const TqGroup& g : dec.groups) {
        TqGroupTables t;
        t.dims = g.dims;
        t.bits = g.bits;
        t.latent_offset = off;
        const int m = static_cast<int>(g.dims.size());
        t.rotation = g.rotation == TqRotation::kIdentity ? identity_rotation(m) : haar_rotation(g.rotation_seed, m);
        ScaledCodebook cb = group_codebook(g.codebook, g.bits, m);
        t.centroids = std::move(cb.centroids);
        t.thresholds = std::move(cb.thresholds);
        off += static_cast<uint32_t>(m);
        groups_.push_back(std::move(t));
      }
      norm_levels_ = layout::tq_compact_levels(dec);
      tq_identity_dims_ = groups_.size() == 1;
      if (tq_identity_dims_)
        for (int i = 0; i < d_; ++i)
          if (groups_[0].dims[static_cast<size_t>(i)] != i) tq_identity_dims_ = false;
      break;
    }
    case CodingKind::kLowRankHadamard: {
      const int r = dec.rank;
      // M = H P D U_r^T, built once: F = P D U_r^T row by row, then the fast WHT down each
      // column. Per token the codec then needs one r x d product, no transform.
      const std::vector<float> signs = hadamard_signs(dec.hadamard_seed, r);
      const std::vector<int> interleave = hadamard_interleave(r);
      folded_.resize(static_cast<size_t>(r) * d_);
      for (int k = 0; k < r; ++k) {
        float* row = folded_.data() + static_cast<size_t>(interleave[static_cast<size_t>(k)]) * d_;
        for (int i = 0; i < d_; ++i)
          row[i] = signs[static_cast<size_t>(k)] * dec.basis[static_cast<size_t>(i) * r + k];
      }
      std::vector<float> col(static_cast<size_t>(r));
      for (int i = 0; i < d_; ++i) {
        for (int p = 0; p < r; ++p) col[static_cast<size_t>(p)] = folded_[static_cast<size_t>(p) * d_ + i];
        wht_inplace(col.data(), r);
        for (int p = 0; p < r; ++p) folded_[static_cast<size_t>(p) * d_ + i] = col[static_cast<size_t>(p)];
      }
      folded_t_.resize(folded_.size());
      for (int p = 0; p < r; ++p)
        for (int i = 0; i < d_; ++i)
          folded_t_[static_cast<size_t>(i) * r + p] = folded_[static_cast<size_t>(p) * d_ + i];
      mean_ = dec.mean;
      step_unit_ = static_cast<float>(optimal_uniform_gaussian(dec.bits).step /
                                      std::sqrt(static_cast<double>(r)));
      break;
    }
    case CodingKind::kKivi:
    case CodingKind::kMinifloat:
      break;
  }
}

size_t HeadCodec::packed_bytes(int n_tokens) const {
  KVQ_ASSERT(n_tokens >= 0);
  return static_cast<size_t>(layout::packed_bytes(layout_, static_cast<uint64_t>(n_tokens)));
}

std::vector<uint8_t> HeadCodec::encode(const float* x, int n_tokens) const {
  std::vector<uint8_t> out(packed_bytes(n_tokens));
  encode(x, n_tokens, out.data());
  return out;
}

void HeadCodec::encode(const float* x, int n_tokens, uint8_t* out) const {
  KVQ_ASSERT(n_tokens >= 0);
  check_finite(dec_, x, n_tokens, d_);
  std::memset(out, 0, packed_bytes(n_tokens));
  switch (dec_.kind) {
    case CodingKind::kTqGroups: encode_tq(x, n_tokens, out); break;
    case CodingKind::kLowRankHadamard: encode_lrh(x, n_tokens, out); break;
    case CodingKind::kKivi: encode_kivi(x, n_tokens, out); break;
    case CodingKind::kMinifloat: encode_minifloat(x, n_tokens, out); break;
  }
}

// Encoders work on tiles of kTile tokens so the projections are one small GEMM per tile, with the
// FMA-free kernel: the same input gives the same codes on every CPU.
void HeadCodec::encode_tq(const float* x, int n_tokens, uint8_t* out) const {
  std::vector<float> xg, u;
  const size_t ng = groups_.size();
  const bool compact = layout_.ratio_bits > 0;
  // Compact: per token of the tile, the scale the codes quantize against (1 / rho~_g), group-major
  // [g][t].
  std::vector<double> inv_of(compact ? ng * kTile : 0), n2_of(compact ? ng : 0), ratio(compact ? ng : 0);
  for (int t0 = 0; t0 < n_tokens; t0 += kTile) {
    const int nt = std::min(kTile, n_tokens - t0);
    if (compact)
      for (int t = 0; t < nt; ++t) {
        const float* xt = x + static_cast<size_t>(t0 + t) * d_;
        double n2 = 0.0;
        for (size_t g = 0; g < ng; ++g) {
          double s2 = 0.0;
          for (int c : groups_[g].dims) s2 += static_cast<double>(xt[c]) * xt[c];
          n2_of[g] = s2;
          n2 += s2;
        }
        const float rho = static_cast<float>(std::sqrt(n2));
        // Nearest level (levels ascend; the lower one on a tie).
        const auto it = std::upper_bound(norm_levels_.begin(), norm_levels_.end(), rho);
        size_t q = it == norm_levels_.begin() ? 0 : static_cast<size_t>(it - norm_levels_.begin()) - 1;
        if (q + 1 < norm_levels_.size() && norm_levels_[q + 1] - rho < rho - norm_levels_[q]) ++q;
        uint32_t best = 0;
        if (n2 > 0.0) {
          double best_dot = -1.0;
          const double inv_rho = 1.0 / std::sqrt(n2);
          for (size_t g = 0; g < ng; ++g) ratio[g] = std::sqrt(n2_of[g]) * inv_rho;
          for (uint32_t j = 0; j < (1u << layout_.ratio_bits); ++j) {
            const float* cj = dec_.ratio_codebook.data() + static_cast<size_t>(j) * ng;
            double dot = 0.0;
            for (size_t g = 0; g < ng; ++g) dot += ratio[g] * cj[g];
            if (dot > best_dot) {
              best_dot = dot;
              best = j;
            }
          }
        }
        uint8_t* block = out + static_cast<size_t>(t0 + t) * layout_.block_bytes;
        layout::store_u16le(block, static_cast<uint16_t>(q | (best << layout::tq_level_bits(layout_))));
        // As with fp16 norms: quantize against the stored norm, so the codes do not depend on
        // norm correction (only the decoder's scale does).
        for (size_t g = 0; g < ng; ++g) {
          const float s = layout::tq_group_norm(layout_, block, static_cast<uint32_t>(g), norm_levels_.data(),
                                                dec_.ratio_codebook.data());
          inv_of[g * kTile + static_cast<size_t>(t)] = s > 0.f ? 1.0 / s : 0.0;
        }
      }
    for (size_t g = 0; g < ng; ++g) {
      const TqGroupTables& G = groups_[g];
      const int m = static_cast<int>(G.dims.size());
      xg.resize(static_cast<size_t>(nt) * m);
      u.resize(xg.size());
      for (int t = 0; t < nt; ++t)
        for (int j = 0; j < m; ++j)
          xg[static_cast<size_t>(t) * m + j] = x[static_cast<size_t>(t0 + t) * d_ + G.dims[static_cast<size_t>(j)]];
      detail::small_gemm_exact(xg.data(), m, G.rotation->transpose.data(), m, u.data(), m, nt, m, m, false);
      const int n_th = static_cast<int>(G.thresholds.size());
      const uint32_t base = layout_.groups[g].code_bit_offset;
      for (int t = 0; t < nt; ++t) {
        uint8_t* block = out + static_cast<size_t>(t0 + t) * layout_.block_bytes;
        double inv;
        if (compact) {
          inv = inv_of[g * kTile + static_cast<size_t>(t)];
        } else {
          const float* xt = &xg[static_cast<size_t>(t) * m];
          double n2 = 0.0;
          for (int j = 0; j < m; ++j) n2 += static_cast<double>(xt[j]) * xt[j];
          const uint16_t rho_h = to_f16_sat(static_cast<float>(std::sqrt(n2)));
          layout::store_u16le(block + 2 * g, rho_h);
          const float rho = f16_to_f32(rho_h);
          // Quantize Pi x / rho~ (the stored norm): minimises ||x - rho~ Pi^T c|| given rho~.
          inv = rho > 0.f ? 1.0 / rho : 0.0;
        }
        const float* ut = &u[static_cast<size_t>(t) * m];
        uint8_t* codes = block + layout_.meta_bytes;
        for (int i = 0; i < m; ++i) {
          const int q = nearest_index(G.thresholds.data(), n_th, static_cast<float>(ut[i] * inv));
          put_code(codes, base + static_cast<uint64_t>(i) * G.bits, static_cast<uint32_t>(G.bits),
                   static_cast<uint32_t>(q));
        }
      }
    }
  }
}

void HeadCodec::encode_lrh(const float* x, int n_tokens, uint8_t* out) const {
  const int r = dec_.rank;
  const int b = dec_.bits;
  const int half = 1 << (b - 1);
  std::vector<float> xc(static_cast<size_t>(kTile) * d_), z(static_cast<size_t>(kTile) * r);
  for (int t0 = 0; t0 < n_tokens; t0 += kTile) {
    const int nt = std::min(kTile, n_tokens - t0);
    for (int t = 0; t < nt; ++t)
      for (int i = 0; i < d_; ++i)
        xc[static_cast<size_t>(t) * d_ + i] = x[static_cast<size_t>(t0 + t) * d_ + i] - mean_[static_cast<size_t>(i)];
    detail::small_gemm_exact(xc.data(), d_, folded_t_.data(), r, z.data(), r, nt, d_, r, false);
    for (int t = 0; t < nt; ++t) {
      uint8_t* block = out + static_cast<size_t>(t0 + t) * layout_.block_bytes;
      const float* zt = &z[static_cast<size_t>(t) * r];
      double n2 = 0.0;
      for (int k = 0; k < r; ++k) n2 += static_cast<double>(zt[k]) * zt[k];
      const uint16_t rho_h = to_f16_sat(static_cast<float>(std::sqrt(n2)));
      layout::store_u16le(block, rho_h);
      const float step = f16_to_f32(rho_h) * step_unit_;
      uint8_t* codes = block + layout_.meta_bytes;
      for (int k = 0; k < r; ++k) {
        int q = half;  // a zero latent decodes to +step/2 * 0 = 0 either way
        if (step > 0.f) {
          const float v = std::floor(zt[k] / step);
          q = static_cast<int>(std::clamp(v, static_cast<float>(-half), static_cast<float>(half - 1))) + half;
        }
        put_code(codes, static_cast<uint64_t>(k) * b, static_cast<uint32_t>(b), static_cast<uint32_t>(q));
      }
    }
  }
}

void HeadCodec::encode_kivi(const float* x, int n_tokens, uint8_t* out) const {
  const int b = dec_.bits;
  const int g = dec_.group_size;
  const float qmax = static_cast<float>((1 << b) - 1);
  auto quant = [&](float v, float scale, float zero) -> uint32_t {
    if (!(scale > 0.f)) return 0;
    const float q = std::floor((v - zero) / scale + 0.5f);
    return static_cast<uint32_t>(std::clamp(q, 0.f, qmax));
  };
  auto record = [&](uint8_t* rec, float mn, float mx, float& scale, float& zero) {
    const uint16_t s_h = to_f16_sat((mx - mn) / qmax);
    const uint16_t z_h = to_f16_sat(mn);
    layout::store_u16le(rec, s_h);
    layout::store_u16le(rec + 2, z_h);
    scale = f16_to_f32(s_h);
    zero = f16_to_f32(z_h);
  };
  if (dec_.side == Side::kK) {
    const int n_blocks = (n_tokens + g - 1) / g;
    for (int blk = 0; blk < n_blocks; ++blk) {
      uint8_t* block = out + static_cast<size_t>(blk) * layout_.block_bytes;
      uint8_t* codes = block + layout_.meta_bytes;
      const int t0 = blk * g;
      const int nt = std::min(g, n_tokens - t0);
      for (int c = 0; c < d_; ++c) {
        float mn = INFINITY, mx = -INFINITY;
        for (int t = 0; t < nt; ++t) {
          const float v = x[static_cast<size_t>(t0 + t) * d_ + c];
          mn = std::min(mn, v);
          mx = std::max(mx, v);
        }
        float scale, zero;
        record(block + 4 * c, mn, mx, scale, zero);
        for (int t = 0; t < nt; ++t) {
          const float v = x[static_cast<size_t>(t0 + t) * d_ + c];
          put_code(codes, (static_cast<uint64_t>(t) * d_ + c) * b, static_cast<uint32_t>(b),
                   quant(v, scale, zero));
        }
      }
    }
  } else {
    const int n_groups = (d_ + g - 1) / g;
    for (int t = 0; t < n_tokens; ++t) {
      const float* xt = x + static_cast<size_t>(t) * d_;
      uint8_t* block = out + static_cast<size_t>(t) * layout_.block_bytes;
      uint8_t* codes = block + layout_.meta_bytes;
      for (int gi = 0; gi < n_groups; ++gi) {
        const int c0 = gi * g, c1 = std::min(d_, c0 + g);
        float mn = INFINITY, mx = -INFINITY;
        for (int c = c0; c < c1; ++c) {
          mn = std::min(mn, xt[c]);
          mx = std::max(mx, xt[c]);
        }
        float scale, zero;
        record(block + 4 * gi, mn, mx, scale, zero);
        for (int c = c0; c < c1; ++c)
          put_code(codes, static_cast<uint64_t>(c) * b, static_cast<uint32_t>(b),
                   quant(xt[c], scale, zero));
      }
    }
  }
}

// FP8: the E4M3 codes are the code stream's bytes (8-bit codes, LSB-first = byte order).
// NVFP4: block scales into the records, E2M1 codes packed two per byte (low nibble first).
void HeadCodec::encode_minifloat(const float* x, int n_tokens, uint8_t* out) const {
  const size_t d = static_cast<size_t>(d_);
  std::vector<uint8_t> codes(d);
  for (int t = 0; t < n_tokens; ++t) {
    const float* xt = x + static_cast<size_t>(t) * d;
    uint8_t* block = out + static_cast<size_t>(t) * layout_.block_bytes;
    if (dec_.minifloat == MinifloatFormat::kFp8E4M3) {
      encode_fp8(xt, d, dec_.scale, block);
    } else {
      encode_nvfp4(xt, d, codes.data(), block, dec_.scale);
      layout::pack_codes(codes.data(), static_cast<uint32_t>(d), 4, block + layout_.meta_bytes, 0);
    }
  }
}

namespace {

// Calls f(i, code_i) for n codes of width B from stream bit pos, reading no byte at or beyond
// `end`. The hot loop takes one unaligned 64-bit little-endian load per floor(57 / B) codes
// (57 = 64 - 7 bits of start offset); the tail and big-endian hosts use the portable get_code.
template <uint32_t B, class F>
inline void for_each_code(const uint8_t* stream, uint64_t pos, uint32_t n, const uint8_t* end, F&& f) {
  uint32_t i = 0;
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
  constexpr uint32_t kPer = 57 / B;
  constexpr uint64_t kMask = (uint64_t{1} << B) - 1;
  while (i + kPer <= n && stream + (pos >> 3) + 8 <= end) {
    uint64_t v;
    std::memcpy(&v, stream + (pos >> 3), 8);
    v >>= (pos & 7);
#pragma GCC unroll 64
    for (uint32_t j = 0; j < kPer; ++j) f(i + j, static_cast<uint32_t>((v >> (j * B)) & kMask));
    i += kPer;
    pos += uint64_t{kPer} * B;
  }
#endif
  for (; i < n; ++i, pos += B) f(i, get_code(stream, pos, B));
}

// Dispatches a run of width `bits` to the width-specialised loop.
template <class F>
inline void for_each_code(const uint8_t* stream, uint64_t pos, uint32_t bits, uint32_t n,
                          const uint8_t* end, F&& f) {
  switch (bits) {
    case 1: return for_each_code<1>(stream, pos, n, end, f);
    case 2: return for_each_code<2>(stream, pos, n, end, f);
    case 3: return for_each_code<3>(stream, pos, n, end, f);
    case 4: return for_each_code<4>(stream, pos, n, end, f);
    case 5: return for_each_code<5>(stream, pos, n, end, f);
    case 6: return for_each_code<6>(stream, pos, n, end, f);
    case 7: return for_each_code<7>(stream, pos, n, end, f);
    case 8: return for_each_code<8>(stream, pos, n, end, f);
  }
  KVQ_ASSERT(false);
}

void unpack_run(const uint8_t* stream, uint64_t pos, uint32_t bits, uint32_t n, const uint8_t* end,
                uint8_t* out) {
  for_each_code(stream, pos, bits, n, end, [out](uint32_t i, uint32_t c) { out[i] = static_cast<uint8_t>(c); });
}

}  // namespace

void HeadCodec::unpack_codes(const uint8_t* packed, int n_tokens, uint8_t* codes) const {
  const int cd = code_dim();
  const uint8_t* end = packed + packed_bytes(n_tokens);
  for (int t = 0; t < n_tokens; ++t) {
    const uint8_t* block = layout::block_ptr(layout_, packed, static_cast<uint64_t>(t));
    const uint8_t* stream = block + layout_.meta_bytes;
    const uint64_t tok = layout::token_code_bit_offset(layout_, static_cast<uint64_t>(t));
    uint8_t* ct = codes + static_cast<size_t>(t) * cd;
    if (dec_.kind == CodingKind::kTqGroups) {
      for (size_t g = 0; g < groups_.size(); ++g) {
        const layout::LayoutGroup& lg = layout_.groups[g];
        unpack_run(stream, tok + lg.code_bit_offset, lg.bits, lg.dim, end, ct + groups_[g].latent_offset);
      }
    } else {
      unpack_run(stream, tok, layout_.bits, static_cast<uint32_t>(cd), end, ct);
    }
  }
}

void HeadCodec::decode_latent(const uint8_t* packed, int n_tokens, float* latent) const {
  const int cd = code_dim();
  const uint8_t* end = packed + packed_bytes(n_tokens);
  switch (dec_.kind) {
    case CodingKind::kTqGroups:
      for (int t = 0; t < n_tokens; ++t) {
        const uint8_t* block = packed + static_cast<size_t>(t) * layout_.block_bytes;
        float* lt = latent + static_cast<size_t>(t) * cd;
        for (size_t g = 0; g < groups_.size(); ++g) {
          const layout::LayoutGroup& lg = layout_.groups[g];
          const float rho = layout::tq_group_norm(layout_, block, static_cast<uint32_t>(g), norm_levels_.data(),
                                                  dec_.ratio_codebook.data());
          const float* cent = groups_[g].centroids.data();
          float* dst = lt + groups_[g].latent_offset;
          if (!dec_.norm_correction) {
            for_each_code(block + layout_.meta_bytes, lg.code_bit_offset, lg.bits, lg.dim, end,
                          [&](uint32_t j, uint32_t c) { dst[j] = rho * cent[c]; });
            continue;
          }
          // rho~ / ||c|| with ||c|| summed in double; no centroid is 0, so ||c|| > 0.
          double n2 = 0.0;
          for_each_code(block + layout_.meta_bytes, lg.code_bit_offset, lg.bits, lg.dim, end,
                        [&](uint32_t j, uint32_t c) {
                          dst[j] = cent[c];
                          n2 += static_cast<double>(cent[c]) * cent[c];
                        });
          const float s = n2 > 0.0 ? static_cast<float>(rho / std::sqrt(n2)) : 0.f;
          for (uint32_t j = 0; j < lg.dim; ++j) dst[j] *= s;
        }
      }
      return;
    case CodingKind::kLowRankHadamard: {
      // (q - 2^(b-1)) + 1/2 is exact in float: tabulate it, then one rounding (the multiply).
      const int half = 1 << (layout_.bits - 1);
      float level[256];
      for (int q = 0; q < (1 << layout_.bits); ++q) level[q] = static_cast<float>(q - half) + 0.5f;
      for (int t = 0; t < n_tokens; ++t) {
        const uint8_t* block = packed + static_cast<size_t>(t) * layout_.block_bytes;
        const float step = f16_to_f32(layout::load_u16le(block)) * step_unit_;
        float* lt = latent + static_cast<size_t>(t) * cd;
        for_each_code(block + layout_.meta_bytes, 0, layout_.bits, static_cast<uint32_t>(cd), end,
                      [&](uint32_t k, uint32_t c) { lt[k] = level[c] * step; });
      }
      return;
    }
    case CodingKind::kKivi: {
      const uint32_t b = layout_.bits;
      const bool per_channel = dec_.side == Side::kK;
      std::vector<float> scale(layout_.n_records), zero(layout_.n_records);
      std::vector<uint16_t> rec_of(static_cast<size_t>(d_));
      for (int c = 0; c < d_; ++c) rec_of[static_cast<size_t>(c)] = static_cast<uint16_t>(per_channel ? c : c / dec_.group_size);
      const int tpb = static_cast<int>(layout_.tokens_per_block);
      for (int t0 = 0; t0 < n_tokens; t0 += tpb) {
        const uint8_t* block = layout::block_ptr(layout_, packed, static_cast<uint64_t>(t0));
        for (uint32_t r = 0; r < layout_.n_records; ++r) {
          scale[r] = f16_to_f32(layout::load_u16le(block + 4 * r));
          zero[r] = f16_to_f32(layout::load_u16le(block + 4 * r + 2));
        }
        const int nt = std::min(tpb, n_tokens - t0);
        for (int tt = 0; tt < nt; ++tt) {
          float* lt = latent + static_cast<size_t>(t0 + tt) * cd;
          for_each_code(block + layout_.meta_bytes, static_cast<uint64_t>(tt) * layout_.code_bits_per_token, b,
                        static_cast<uint32_t>(d_), end, [&](uint32_t c, uint32_t q) {
                          const uint16_t r = rec_of[c];
                          lt[c] = static_cast<float>(q) * scale[r] + zero[r];
                        });
        }
      }
      return;
    }
    case CodingKind::kMinifloat: {
      const size_t d = static_cast<size_t>(d_);
      std::vector<uint8_t> codes(d);
      for (int t = 0; t < n_tokens; ++t) {
        const uint8_t* block = packed + static_cast<size_t>(t) * layout_.block_bytes;
        float* lt = latent + static_cast<size_t>(t) * cd;
        if (dec_.minifloat == MinifloatFormat::kFp8E4M3) {
          decode_fp8(block, d, dec_.scale, lt);
        } else {
          unpack_run(block + layout_.meta_bytes, 0, 4, static_cast<uint32_t>(d), end, codes.data());
          decode_nvfp4(codes.data(), block, d, lt, dec_.scale);
        }
      }
      return;
    }
  }
}

void HeadCodec::latent_to_output(const float* latent, int n_tokens, float* out) const {
  const int cd = code_dim();
  switch (dec_.kind) {
    case CodingKind::kTqGroups: {
      if (tq_identity_dims_) {
        detail::small_gemm(latent, cd, groups_[0].rotation->matrix.data(), d_, out, d_, n_tokens,
                           d_, d_, false);
        return;
      }
      std::vector<float> tmp;
      for (const TqGroupTables& G : groups_) {
        const int m = static_cast<int>(G.dims.size());
        tmp.resize(static_cast<size_t>(n_tokens) * m);
        detail::small_gemm(latent + G.latent_offset, cd, G.rotation->matrix.data(), m, tmp.data(),
                           m, n_tokens, m, m, false);
        for (int t = 0; t < n_tokens; ++t)
          for (int j = 0; j < m; ++j)
            out[static_cast<size_t>(t) * d_ + G.dims[static_cast<size_t>(j)]] =
                tmp[static_cast<size_t>(t) * m + j];
      }
      return;
    }
    case CodingKind::kLowRankHadamard: {
      for (int t = 0; t < n_tokens; ++t)
        std::memcpy(out + static_cast<size_t>(t) * d_, mean_.data(), sizeof(float) * d_);
      detail::small_gemm(latent, cd, folded_.data(), d_, out, d_, n_tokens, cd, d_, true);
      return;
    }
    case CodingKind::kKivi:
    case CodingKind::kMinifloat:
      std::memcpy(out, latent, sizeof(float) * static_cast<size_t>(n_tokens) * d_);
      return;
  }
}

void HeadCodec::decode(const uint8_t* packed, int n_tokens, float* out) const {
  KVQ_ASSERT(n_tokens >= 0);
  const int cd = code_dim();
  if (dec_.kind == CodingKind::kKivi || dec_.kind == CodingKind::kMinifloat) {
    decode_latent(packed, n_tokens, out);
    return;
  }
  std::vector<float> latent(static_cast<size_t>(kTile) * cd);
  for (int t0 = 0; t0 < n_tokens; t0 += kTile) {
    const int nt = std::min(kTile, n_tokens - t0);
    // A tile starts on a token boundary, and TQ / low-rank blocks hold one token each.
    decode_latent(packed + static_cast<size_t>(t0) * layout_.block_bytes, nt, latent.data());
    latent_to_output(latent.data(), nt, out + static_cast<size_t>(t0) * d_);
  }
}

void HeadCodec::round_trip(const float* x, int n_tokens, float* out) const {
  const std::vector<uint8_t> packed = encode(x, n_tokens);
  decode(packed.data(), n_tokens, out);
}

std::vector<float> quantize_dequantize(const HeadDecision& dec, int head_dim, const float* x,
                                       int n_tokens) {
  HeadCodec codec(dec, head_dim);
  std::vector<float> out(static_cast<size_t>(n_tokens) * head_dim);
  codec.round_trip(x, n_tokens, out.data());
  return out;
}

}  // namespace kvq::codec
