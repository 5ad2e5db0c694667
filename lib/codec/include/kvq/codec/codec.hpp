#pragma once
// CPU encoder and CPU reference decoder for one (layer, KV head, side), every CodingKind.
// Inputs are fp32 [T][d] row-major (token t's head vector at x + t*d); output is the packed byte
// layout of packed_layout.hpp. The decoder is the oracle the CUDA kernels are tested against.
//
//  kTqGroups        per group g (dims D_g, m = |D_g|, b bits, seed s_g): rho = ||x_D|| as fp16;
//                   Pi_g the Haar matrix of s_g, or the identity (TqGroup::rotation);
//                   u = Pi_g x_D / rho~ (rho~ = the stored fp16 value); code_i = nearest Lloyd-Max
//                   centroid of N(0, 1/m) (TqGroup::codebook kGaussian), or with kSphere of the
//                   exact law of a uniformly random unit vector's coordinate in R^m (codebook.hpp
//                   group_codebook; 2 <= m <= 64, the decision is refused otherwise; an identity
//                   group takes the recorded table too); decode x_D = rho~ Pi_g^T c, or with the decision's
//                   norm_correction x_D = s Pi_g^T c, s = float(rho~ / ||c||) (||c|| summed in
//                   double over the group's centroids); the latent is then s * c.
//                   Compact group norms (ratio_bits = k > 0): one 16-bit record per token, the
//                   head norm rho = ||x|| as the nearest of tq_compact_levels (linear distance,
//                   the lower level on a tie) and the ratio vector index j maximising
//                   sum_g (rho_g / rho) C[j][g] (double; the lowest j on a tie); then
//                   rho~_g = level * C[j][g] (float) takes the place of the fp16 norm: the codes
//                   quantize Pi_g x_D / rho~_g (so, as with fp16 norms, they do not depend on
//                   norm correction) and decode as above.
//  kLowRankHadamard y = U_r^T (x - mu); z = H P D y (hadamard.hpp); rho = ||z|| as fp16;
//                   step = rho~ * step*(b) / sqrt(r) (step*(b) the MSE-optimal uniform step for
//                   N(0,1)); code = clamp(floor(z / step) + 2^(b-1), 0, 2^b - 1);
//                   decode z = (code - 2^(b-1) + 1/2) step, x = U_r D P^T H z + mu.
//                   The whole transform is folded into the basis once per head (as the paper
//                   fuses it): M = H P D U_r^T, so encode is z = M (x - mu) and decode is
//                   x = mu + M^T z, one r x d product per token and no per-token WHT.
//                   The per-token norm is the quantizer's scale (16 bits per token, counted in the
//                   effective bpd); HeadDecision::scale is not used.
//  kKivi            asymmetric min/max: scale = (max - min) / (2^b - 1), zero = min, both fp16;
//                   code = clamp(round((x - zero~) / scale~), 0, 2^b - 1); decode code*scale~+zero~.
//                   K: statistics per channel over group_size consecutive tokens; V: per token over
//                   group_size consecutive channels.
//  kMinifloat       FP8 E4M3: code = E4M3(x / scale), decode code * scale (scale = the decision's
//                   static per-head scale). NVFP4: per 16 channels an E4M3 block scale
//                   s = E4M3(amax / (6 g)), codes E2M1(x / (s~ g)), decode e2m1 * s~ * g (g = the
//                   decision's global scale). kvq/codec/minifloat.hpp does the rounding; the latent
//                   is the decoded x.
//  kVllmTurboQuant  vLLM's TurboQuant cache, exactly as kvq/codec/vllm_turboquant.hpp writes it
//                   (the engine's quantizers, one side of its slot): K 3/4 bits Lloyd-Max after
//                   the Hadamard rotation with the norm correction, K 8 FP8 E4M3 (no scale), V 3/4
//                   bits per-token min/max; bits 16 = a kept layer, BF16. CPU only; latent = x.
// Norms above the fp16 range are stored as 65504 (the largest fp16); non-finite inputs throw.
// Encoding is bit-identical on every CPU (its projections use an FMA-free kernel); decoding may
// differ in the last bits between CPUs (it uses FMA where available).
#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "kvq/format/decision.hpp"
#include "kvq/format/packed_layout.hpp"
#include "kvq/codec/rotation.hpp"
#include "kvq/codec/tq_tables.hpp"

namespace kvq::codec {

namespace detail {
class KindCodec;  // one per coding kind: src/kind_<name>.{hpp,cpp}
}

// Dispatches once, when built, to its kind's codec (lib/codec/README.md).
class HeadCodec {
 public:
  // Validates (kvq::Error on a bad decision, see layout_for) and builds the tables: rotations and
  // codebooks (TQ); the folded basis M, mean and step (low-rank). Cheap after the first use of a
  // (seed, m) rotation and a width's codebook (both cached process-wide). Thread-safe to use
  // concurrently once built (all methods are const).
  HeadCodec(const HeadDecision& dec, int head_dim);

  const HeadDecision& decision() const;
  const layout::PackedLayout& layout() const { return layout_; }
  int head_dim() const { return d_; }
  int code_dim() const { return static_cast<int>(layout_.code_dim); }
  size_t packed_bytes(int n_tokens) const;
  double effective_bpd() const { return layout::effective_bpd(layout_); }

  // x: [n_tokens][d]; out: packed_bytes(n_tokens) bytes (fully written, padding zero).
  void encode(const float* x, int n_tokens, uint8_t* out) const;
  std::vector<uint8_t> encode(const float* x, int n_tokens) const;
  // out: [n_tokens][d].
  void decode(const uint8_t* packed, int n_tokens, float* out) const;
  // quantize -> dequantize.
  void round_trip(const float* x, int n_tokens, float* out) const;
  // A query in the latent domain: qc [code_dim] and *q_off such that q . decode(token) =
  // qc . latent(token) + q_off for every token (TQ: Pi_g q per group, q_off 0; low rank: M q and
  // q . mu; KIVI, minifloat: q itself). Sums in double, rounded once.
  void query_to_latent(const float* q, float* qc, float* q_off) const;

  // Integer codes, [n_tokens][code_dim] in code-stream order (TQ: group by group).
  void unpack_codes(const uint8_t* packed, int n_tokens, uint8_t* codes) const;
  // Per-token values before the linear back-transform, [n_tokens][code_dim]: TQ rho~ * centroid
  // (rotated coordinates; rho~ / ||c|| * centroid with norm correction), low-rank the dequantized z, KIVI and minifloat the decoded x. The fused attention
  // kernel works in this domain (q is moved into it once per query instead of decoding each key).
  void decode_latent(const uint8_t* packed, int n_tokens, float* latent) const;

  // ---- tables (the CUDA side uploads exactly these) ----
  using TqGroupTables = codec::TqGroupTables;
  const std::vector<TqGroupTables>& tq_groups() const;
  // Compact group norms (decision().ratio_bits > 0): the head-norm levels (tq_compact_levels) and
  // the ratio codebook [2^k][n_groups]; both empty otherwise.
  const std::vector<float>& norm_levels() const;
  const std::vector<float>& ratio_codebook() const { return decision().ratio_codebook; }
  const std::vector<float>& folded_basis() const;  // M = H P D U_r^T, [r][d]
  const std::vector<float>& mean() const;          // [d]
  float step_unit() const;                         // step*(b) / sqrt(r)

 private:
  int d_ = 0;
  layout::PackedLayout layout_{};
  std::shared_ptr<const detail::KindCodec> kind_;
};

// Convenience: decision -> quantize -> dequantize of x [n_tokens][head_dim].
std::vector<float> quantize_dequantize(const HeadDecision& dec, int head_dim, const float* x,
                                       int n_tokens);

}  // namespace kvq::codec
