#include "kvq/codec/codec.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>

#include "kind_kivi.hpp"
#include "kind_lowrank_hadamard.hpp"
#include "kind_minifloat.hpp"
#include "kind_vllm_turboquant.hpp"
#include "kind_tq_groups.hpp"
#include "kvq/format/coding_kinds.hpp"
#include "kvq/format/decision_layout.hpp"
#include "kvq/util/error.hpp"

namespace kvq::codec {

namespace detail {
namespace {

using Factory = std::unique_ptr<const KindCodec> (*)(const HeadDecision&, int, const layout::PackedLayout&);

template <class Codec>
std::unique_ptr<const KindCodec> make(const HeadDecision& dec, int head_dim, const layout::PackedLayout& L) {
  return std::make_unique<const Codec>(dec, head_dim, L);
}

// Index = CodingKind value, as kCodingKinds.
constexpr Factory kFactories[] = {make<TqGroupsCodec>, make<LowRankHadamardCodec>, make<KiviCodec>,
                                  make<MinifloatCodec>, make<VllmTurboQuantCodec>};
static_assert(sizeof(kFactories) / sizeof(kFactories[0]) == kNumCodingKinds, "one codec per kCodingKinds row");

}  // namespace

// The codec of dec's kind: the one dispatch on the kind.
std::unique_ptr<const KindCodec> make_kind_codec(const HeadDecision& dec, int head_dim, const layout::PackedLayout& L) {
  const auto i = static_cast<size_t>(dec.kind);
  KVQ_ASSERT(i < kNumCodingKinds);  // layout_for refused any other value
  return kFactories[i](dec, head_dim, L);
}

}  // namespace detail

namespace {

void check_finite(const HeadDecision& dec, const float* x, int n_tokens, int d) {
  for (int t = 0; t < n_tokens; ++t)
    for (int i = 0; i < d; ++i)
      if (!std::isfinite(x[static_cast<size_t>(t) * d + i]))
        throw Error("", "encode " + decision_name(dec),
                    "non-finite input at token " + std::to_string(t) + ", dim " + std::to_string(i));
}

}  // namespace

HeadCodec::HeadCodec(const HeadDecision& dec, int head_dim)
    : d_(head_dim), layout_(layout::layout_for(dec, head_dim)), kind_(detail::make_kind_codec(dec, head_dim, layout_)) {}

const HeadDecision& HeadCodec::decision() const { return kind_->decision(); }
const std::vector<HeadCodec::TqGroupTables>& HeadCodec::tq_groups() const { return kind_->tq_groups(); }
const std::vector<float>& HeadCodec::norm_levels() const { return kind_->norm_levels(); }
const std::vector<float>& HeadCodec::folded_basis() const { return kind_->folded_basis(); }
const std::vector<float>& HeadCodec::mean() const { return kind_->mean(); }
float HeadCodec::step_unit() const { return kind_->step_unit(); }

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
  check_finite(decision(), x, n_tokens, d_);
  std::memset(out, 0, packed_bytes(n_tokens));
  kind_->encode(x, n_tokens, out);
}

void HeadCodec::unpack_codes(const uint8_t* packed, int n_tokens, uint8_t* codes) const {
  kind_->unpack_codes(packed, n_tokens, codes);
}

void HeadCodec::decode_latent(const uint8_t* packed, int n_tokens, float* latent) const {
  kind_->decode_latent(packed, n_tokens, latent);
}

void HeadCodec::query_to_latent(const float* q, float* qc, float* q_off) const {
  kind_->query_to_latent(q, qc, q_off);
}

void HeadCodec::decode(const uint8_t* packed, int n_tokens, float* out) const {
  KVQ_ASSERT(n_tokens >= 0);
  if (kind_->latent_is_head()) {
    kind_->decode_latent(packed, n_tokens, out);
    return;
  }
  const int cd = code_dim();
  std::vector<float> latent(static_cast<size_t>(detail::kTile) * cd);
  for (int t0 = 0; t0 < n_tokens; t0 += detail::kTile) {
    const int nt = std::min(detail::kTile, n_tokens - t0);
    // A tile starts on a token boundary: kinds with a latent domain hold one token per block.
    kind_->decode_latent(packed + static_cast<size_t>(t0) * layout_.block_bytes, nt, latent.data());
    kind_->latent_to_head(latent.data(), nt, out + static_cast<size_t>(t0) * d_);
  }
}

void HeadCodec::round_trip(const float* x, int n_tokens, float* out) const {
  const std::vector<uint8_t> packed = encode(x, n_tokens);
  decode(packed.data(), n_tokens, out);
}

std::vector<float> quantize_dequantize(const HeadDecision& dec, int head_dim, const float* x, int n_tokens) {
  HeadCodec codec(dec, head_dim);
  std::vector<float> out(static_cast<size_t>(n_tokens) * head_dim);
  codec.round_trip(x, n_tokens, out.data());
  return out;
}

}  // namespace kvq::codec
