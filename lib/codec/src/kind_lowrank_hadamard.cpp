#include "kind_lowrank_hadamard.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "code_stream.hpp"
#include "kvq/codec/codebook.hpp"
#include "kvq/codec/hadamard.hpp"
#include "small_gemm.hpp"

namespace kvq::codec::detail {

using layout::f16_to_f32;
using layout::put_code;

LowRankHadamardCodec::LowRankHadamardCodec(const HeadDecision& dec, int head_dim, const layout::PackedLayout& L)
    : KindCodec(dec, head_dim, L) {
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
}

void LowRankHadamardCodec::encode(const float* x, int n_tokens, uint8_t* out) const {
  const int r = dec_.rank;
  const int b = dec_.bits;
  const int half = 1 << (b - 1);
  std::vector<float> xc(static_cast<size_t>(kTile) * d_), z(static_cast<size_t>(kTile) * r);
  for (int t0 = 0; t0 < n_tokens; t0 += kTile) {
    const int nt = std::min(kTile, n_tokens - t0);
    for (int t = 0; t < nt; ++t)
      for (int i = 0; i < d_; ++i)
        xc[static_cast<size_t>(t) * d_ + i] = x[static_cast<size_t>(t0 + t) * d_ + i] - mean_[static_cast<size_t>(i)];
    small_gemm_exact(xc.data(), d_, folded_t_.data(), r, z.data(), r, nt, d_, r, false);
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

void LowRankHadamardCodec::decode_latent(const uint8_t* packed, int n_tokens, float* latent) const {
  const int cd = static_cast<int>(layout_.code_dim);
  const uint8_t* end = packed + layout::packed_bytes(layout_, static_cast<uint64_t>(n_tokens));
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
}

void LowRankHadamardCodec::latent_to_head(const float* latent, int n_tokens, float* out) const {
  const int cd = static_cast<int>(layout_.code_dim);
  for (int t = 0; t < n_tokens; ++t)
    std::memcpy(out + static_cast<size_t>(t) * d_, mean_.data(), sizeof(float) * d_);
  small_gemm(latent, cd, folded_.data(), d_, out, d_, n_tokens, cd, d_, true);
}

// x = mu + M^T z, so q . x = (M q) . z + q . mu.
void LowRankHadamardCodec::query_to_latent(const float* q, float* qc, float* q_off) const {
  const int r = dec_.rank;
  for (int p = 0; p < r; ++p) {
    const float* row = folded_.data() + static_cast<size_t>(p) * d_;
    double s = 0.0;
    for (int i = 0; i < d_; ++i) s += static_cast<double>(row[i]) * q[i];
    qc[p] = static_cast<float>(s);
  }
  double off = 0.0;
  for (int i = 0; i < d_; ++i) off += static_cast<double>(mean_[static_cast<size_t>(i)]) * q[i];
  *q_off = static_cast<float>(off);
}

}  // namespace kvq::codec::detail
