#include "kind_codec.hpp"

#include <algorithm>
#include <cstring>

#include "code_stream.hpp"

namespace kvq::codec::detail {

uint16_t to_f16_sat(float v) { return layout::f32_to_f16(std::clamp(v, -layout::kF16Max, layout::kF16Max)); }

void KindCodec::unpack_codes(const uint8_t* packed, int n_tokens, uint8_t* codes) const {
  const uint32_t cd = layout_.code_dim;
  const uint8_t* end = packed + layout::packed_bytes(layout_, static_cast<uint64_t>(n_tokens));
  for (int t = 0; t < n_tokens; ++t) {
    const uint8_t* stream = layout::block_ptr(layout_, packed, static_cast<uint64_t>(t)) + layout_.meta_bytes;
    unpack_run(stream, layout::token_code_bit_offset(layout_, static_cast<uint64_t>(t)), layout_.bits, cd, end,
               codes + static_cast<size_t>(t) * cd);
  }
}

namespace {
const std::vector<float> kNoFloats;
const std::vector<TqGroupTables> kNoGroups;
}  // namespace

const std::vector<TqGroupTables>& KindCodec::tq_groups() const { return kNoGroups; }
const std::vector<float>& KindCodec::norm_levels() const { return kNoFloats; }
const std::vector<float>& KindCodec::folded_basis() const { return kNoFloats; }
const std::vector<float>& KindCodec::mean() const { return kNoFloats; }

void HeadDomainCodec::latent_to_head(const float* latent, int n_tokens, float* out) const {
  std::memcpy(out, latent, sizeof(float) * static_cast<size_t>(n_tokens) * d_);
}

void HeadDomainCodec::query_to_latent(const float* q, float* qc, float* q_off) const {
  std::memcpy(qc, q, sizeof(float) * static_cast<size_t>(d_));
  *q_off = 0.f;
}

}  // namespace kvq::codec::detail
