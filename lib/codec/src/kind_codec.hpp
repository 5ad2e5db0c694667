#pragma once
// One coding kind's CPU codec behind the interface HeadCodec dispatches to (once, when it is
// built): encode, decode to the latent domain, the latent <-> head-vector transforms, and the
// tables the CUDA side uploads. Each kind lives in its own kind_<name>.{hpp,cpp} (the name of its
// row in kvq/format/coding_kinds.hpp); the kernels' device code for it is
// kernels/include/kvq/cuda/kind_<name>.cuh. Private to lib/codec; see lib/codec/README.md.
#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "kvq/codec/tq_tables.hpp"
#include "kvq/format/decision.hpp"
#include "kvq/format/packed_layout.hpp"

namespace kvq::codec::detail {

constexpr int kTile = 32;  // tokens per encode/decode tile (the latent tile stays in L1/L2)

// fp16 store that saturates instead of overflowing to inf (an inf scale would decode to NaN).
uint16_t to_f16_sat(float v);

class KindCodec {
 public:
  // dec has passed layout_for; L is its layout.
  KindCodec(const HeadDecision& dec, int head_dim, const layout::PackedLayout& L)
      : dec_(dec), d_(head_dim), layout_(L) {}
  virtual ~KindCodec() = default;
  KindCodec(const KindCodec&) = delete;
  KindCodec& operator=(const KindCodec&) = delete;

  const HeadDecision& decision() const { return dec_; }

  // x: [n][d], finite; out: the layout's bytes for n tokens, zeroed by the caller.
  virtual void encode(const float* x, int n_tokens, uint8_t* out) const = 0;
  // [n][code_dim] latents (see HeadCodec::decode_latent). packed holds exactly n tokens' blocks.
  virtual void decode_latent(const uint8_t* packed, int n_tokens, float* latent) const = 0;
  // Integer codes [n][code_dim] in code-stream order. Default: one run of layout().bits per token.
  virtual void unpack_codes(const uint8_t* packed, int n_tokens, uint8_t* codes) const;
  // Latent rows [n][code_dim] -> head vectors [n][d] (TQ: Pi_g^T per group; low rank: mu + M^T z).
  // Never called when latent_is_head().
  virtual void latent_to_head(const float* latent, int n_tokens, float* out) const = 0;
  // The adjoint, for a query: qc [code_dim] and *q_off with q . latent_to_head(z) = qc . z + q_off
  // for every latent z (sums in double, rounded once).
  virtual void query_to_latent(const float* q, float* qc, float* q_off) const = 0;
  // The latent is the head vector itself (KIVI, minifloat): decode = decode_latent.
  virtual bool latent_is_head() const { return false; }

  // Tables (HeadCodec's accessors; empty where the kind has none).
  virtual const std::vector<TqGroupTables>& tq_groups() const;
  virtual const std::vector<float>& norm_levels() const;
  virtual const std::vector<float>& folded_basis() const;
  virtual const std::vector<float>& mean() const;
  virtual float step_unit() const { return 0.f; }

 protected:
  const HeadDecision dec_;
  const int d_;
  const layout::PackedLayout layout_;
};

// A kind whose latent is the decoded head vector itself (KIVI, minifloat): the transforms are the
// identity.
class HeadDomainCodec : public KindCodec {
 public:
  using KindCodec::KindCodec;
  void latent_to_head(const float* latent, int n_tokens, float* out) const final;
  void query_to_latent(const float* q, float* qc, float* q_off) const final;
  bool latent_is_head() const final { return true; }
};


}  // namespace kvq::codec::detail
