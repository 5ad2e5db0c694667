#include "kind_tq_groups.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "code_stream.hpp"
#include "kvq/codec/codebook.hpp"
#include "kvq/format/decision_layout.hpp"
#include "small_gemm.hpp"

namespace kvq::codec::detail {

using layout::f16_to_f32;
using layout::put_code;

TqGroupsCodec::TqGroupsCodec(const HeadDecision& dec, int head_dim, const layout::PackedLayout& L)
    : KindCodec(dec, head_dim, L) {
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
}

// Tiles of kTile tokens so the projections are one small GEMM per tile, with the FMA-free kernel:
// the same input gives the same codes on every CPU.
void TqGroupsCodec::encode(const float* x, int n_tokens, uint8_t* out) const {
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
      small_gemm_exact(xg.data(), m, G.rotation->transpose.data(), m, u.data(), m, nt, m, m, false);
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

void TqGroupsCodec::decode_latent(const uint8_t* packed, int n_tokens, float* latent) const {
  const int cd = static_cast<int>(layout_.code_dim);
  const uint8_t* end = packed + layout::packed_bytes(layout_, static_cast<uint64_t>(n_tokens));
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
}

void TqGroupsCodec::unpack_codes(const uint8_t* packed, int n_tokens, uint8_t* codes) const {
  const uint32_t cd = layout_.code_dim;
  const uint8_t* end = packed + layout::packed_bytes(layout_, static_cast<uint64_t>(n_tokens));
  for (int t = 0; t < n_tokens; ++t) {
    const uint8_t* stream = layout::block_ptr(layout_, packed, static_cast<uint64_t>(t)) + layout_.meta_bytes;
    const uint64_t tok = layout::token_code_bit_offset(layout_, static_cast<uint64_t>(t));
    uint8_t* ct = codes + static_cast<size_t>(t) * cd;
    for (size_t g = 0; g < groups_.size(); ++g) {
      const layout::LayoutGroup& lg = layout_.groups[g];
      unpack_run(stream, tok + lg.code_bit_offset, lg.bits, lg.dim, end, ct + groups_[g].latent_offset);
    }
  }
}

void TqGroupsCodec::latent_to_head(const float* latent, int n_tokens, float* out) const {
  const int cd = static_cast<int>(layout_.code_dim);
  if (tq_identity_dims_) {
    small_gemm(latent, cd, groups_[0].rotation->matrix.data(), d_, out, d_, n_tokens, d_, d_, false);
    return;
  }
  std::vector<float> tmp;
  for (const TqGroupTables& G : groups_) {
    const int m = static_cast<int>(G.dims.size());
    tmp.resize(static_cast<size_t>(n_tokens) * m);
    small_gemm(latent + G.latent_offset, cd, G.rotation->matrix.data(), m, tmp.data(), m, n_tokens, m, m, false);
    for (int t = 0; t < n_tokens; ++t)
      for (int j = 0; j < m; ++j)
        out[static_cast<size_t>(t) * d_ + G.dims[static_cast<size_t>(j)]] = tmp[static_cast<size_t>(t) * m + j];
  }
}

// x_D = Pi_g^T z_g, so q . x = sum_g (Pi_g q_D) . z_g.
void TqGroupsCodec::query_to_latent(const float* q, float* qc, float* q_off) const {
  for (const TqGroupTables& G : groups_) {
    const size_t m = G.dims.size();
    const float* pi = G.rotation->matrix.data();
    for (size_t j = 0; j < m; ++j) {
      double s = 0.0;
      for (size_t i = 0; i < m; ++i) s += static_cast<double>(pi[j * m + i]) * q[G.dims[i]];
      qc[G.latent_offset + j] = static_cast<float>(s);
    }
  }
  *q_off = 0.f;
}

}  // namespace kvq::codec::detail
