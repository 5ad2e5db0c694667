#include "kvq/alloc/common.hpp"

#include <cmath>
#include <limits>

#include "kvq/format/decision_layout.hpp"
#include "kvq/util/error.hpp"
#include "kvq/util/rng.hpp"

namespace kvq::alloc {

void validate_shape(const Shape& s) {
  if (s.n_layers <= 0) throw Error("", "n_layers", "must be positive, got " + std::to_string(s.n_layers));
  if (s.n_kv_heads <= 0)
    throw Error("", "n_kv_heads", "must be positive, got " + std::to_string(s.n_kv_heads));
  if (s.head_dim <= 0) throw Error("", "head_dim", "must be positive, got " + std::to_string(s.head_dim));
}

uint64_t derive_seed(uint64_t base, int layer, int kv_head, Side side, uint64_t tag) {
  // Chained rather than xor-ed so that swapping two fields gives a different seed.
  uint64_t h = splitmix64_mix(base);
  h = splitmix64_mix(h ^ static_cast<uint64_t>(static_cast<uint32_t>(layer)));
  h = splitmix64_mix(h ^ static_cast<uint64_t>(static_cast<uint32_t>(kv_head)));
  h = splitmix64_mix(h ^ static_cast<uint64_t>(side));
  return splitmix64_mix(h ^ tag);
}

void summarize_bits(const std::vector<HeadDecision>& heads, int head_dim, AllocSummary* s, int head_dim_v) {
  int64_t code = 0;
  double bpd_sum = 0.0, dims = 0.0;
  for (const auto& h : heads) {
    const int d = h.side == Side::kV && head_dim_v > 0 ? head_dim_v : head_dim;
    dims += d;
    code += code_bits(h, d);  // the kind's per-dimension widths (kvq/format/coding_kinds.hpp)
    try {  // the basis and mean fix what the codes mean, not how many bytes they take
      bpd_sum += layout::effective_bpd(layout::layout_ignoring_payload(h, d));
    } catch (const Error&) {
      bpd_sum = std::numeric_limits<double>::quiet_NaN();
    }
  }
  s->code_bits_used = code;
  s->code_bits_per_dim = dims > 0 ? static_cast<double>(code) / dims : 0.0;
  s->effective_bpd = heads.empty() ? 0.0 : bpd_sum / static_cast<double>(heads.size());
}

}  // namespace kvq::alloc
