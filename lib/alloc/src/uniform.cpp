#include "kvq/alloc/uniform.hpp"

#include <cmath>
#include <cstdio>

#include "kvq/format/decision_layout.hpp"

#include "internal.hpp"
#include "kvq/util/error.hpp"

namespace kvq::alloc {

using detail::fail;
using detail::num;

Allocation allocate_uniform(const Shape& shape, Side side, double bits_per_dim,
                            const UniformOptions& opt) {
  validate_shape(shape);
  if (!std::isfinite(bits_per_dim) || bits_per_dim < 1 || bits_per_dim > opt.b_max ||
      bits_per_dim != std::floor(bits_per_dim))
    fail("bits_per_dim", "uniform TQ-MSE needs a whole number of bits in [1, " + num(opt.b_max) +
                             "], got " + num(bits_per_dim));
  const int bits = static_cast<int>(bits_per_dim);
  const int d = shape.head_dim;

  Allocation out;
  out.heads.reserve(shape.n_heads());
  for (int i = 0; i < shape.n_heads(); ++i) {
    HeadDecision h;
    h.layer = shape.layer_of(i);
    h.kv_head = shape.head_of(i);
    h.side = side;
    h.kind = CodingKind::kTqGroups;
    h.post_rope = side == Side::kK && opt.post_rope;
    TqGroup g;
    g.bits = bits;
    g.dims.resize(d);
    for (int j = 0; j < d; ++j) g.dims[j] = j;
    g.rotation_seed = derive_seed(opt.seed, h.layer, h.kv_head, side, static_cast<uint64_t>(bits));
    h.groups.push_back(std::move(g));
    h.budget_bits = bits * d;
    out.heads.push_back(std::move(h));
  }
  auto& s = out.summary;
  s.method = Method::kUniform;
  s.nominal_bpd = bits_per_dim;
  s.budget_total = static_cast<int64_t>(bits) * d * shape.n_heads();
  s.budget_assigned = s.budget_total;
  summarize_bits(out.heads, d, opt.overhead, &s);
  s.params = {{"bits", num(bits)}, {"post_rope", opt.post_rope ? "1" : "0"},
              {"seed", num(static_cast<unsigned long long>(opt.seed))}};
  return out;
}

bool tq_norm_correction(const std::vector<HeadDecision>& heads) {
  for (const HeadDecision& h : heads)
    if (h.kind == CodingKind::kTqGroups) return h.norm_correction;
  return true;
}

std::vector<HeadDecision> baseline_heads(const std::string& kind, const Shape& shape, double k_bpd, double v_bpd,
                                         bool norm_correction, const std::string& source,
                                         const std::string& remedy) {
  if (kind != to_string(Method::kUniform) && kind != to_string(Method::kKivi))
    throw Error(source, "kind", "unknown baseline '" + kind + "' (uniform or kivi)");
  const Method method = method_from_string(kind);
  std::vector<HeadDecision> out;
  for (auto [side, bpd] : {std::make_pair(Side::kK, k_bpd), std::make_pair(Side::kV, v_bpd)}) {
    if (!(bpd >= 1 && bpd <= 8 && bpd == std::floor(bpd)))
      throw Error(source, side == Side::kK ? "budget.k_bpd_nominal" : "budget.v_bpd_nominal",
                  "the " + kind + " baseline needs whole bits in 1..8, the allocation has " + num(bpd) +
                      (remedy.empty() ? "" : " (" + remedy + ")"));
    if (method == Method::kUniform) {
      Allocation a = allocate_uniform(shape.for_side(side), side, bpd);
      for (HeadDecision& h : a.heads) h.norm_correction = norm_correction;
      out.insert(out.end(), a.heads.begin(), a.heads.end());
      continue;
    }
    for (int i = 0; i < shape.n_heads(); ++i) {
      HeadDecision h;
      h.layer = shape.layer_of(i);
      h.kv_head = shape.head_of(i);
      h.side = side;
      h.kind = CodingKind::kKivi;
      h.bits = static_cast<int>(bpd);
      h.group_size = 32;
      out.push_back(std::move(h));
    }
  }
  return out;
}

double mean_effective_bpd(const std::vector<HeadDecision>& heads, Side side, int head_dim) {
  double sum = 0;
  int n = 0;
  for (const auto& h : heads)
    if (h.side == side) sum += layout::effective_bpd(h, head_dim), ++n;
  return n ? sum / n : 0.0;
}

int match_effective_bits(const std::string& kind, const Shape& shape, Side side, double target,
                         bool norm_correction) {
  double widest = 0;
  int found = 0;
  double found_bpd = 0;
  for (int b = 1; b <= 8; ++b) {
    widest = mean_effective_bpd(baseline_heads(kind, shape, b, b, norm_correction, ""), side, shape.dim(side));
    if (found == 0 && widest >= target - 1e-9) found = b, found_bpd = widest;
    else if (found > 0 && widest <= found_bpd + 1e-9) found = b;  // more bits in the same bytes
    else if (found > 0) break;
  }
  if (found > 0) return found;
  char buf[320];
  std::snprintf(buf, sizeof buf,
                "effective: no %s baseline budget (whole bits 1..8) reaches the allocation's %s effective bpd %.4f "
                "(the widest, 8 bits, is %.4f effective bpd); use --match nominal or --baseline-%s-bpd",
                kind.c_str(), side == Side::kK ? "K" : "V", target, widest, side == Side::kK ? "k" : "v");
  throw Error("", "--match", buf);
}

void check_match(const std::string& match, double baseline_k_bpd, double baseline_v_bpd) {
  if (match != "nominal" && match != "effective")
    throw Error("", "--match", "unknown value '" + match + "' (nominal or effective)");
  if (match == "effective" && (baseline_k_bpd > 0 || baseline_v_bpd > 0))
    throw Error("", "--match", "effective chooses the baseline's bits itself: drop --baseline-k-bpd / --baseline-v-bpd "
                               "(or use --match nominal)");
}

}  // namespace kvq::alloc
