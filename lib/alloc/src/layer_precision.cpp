#include "kvq/alloc/layer_precision.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

#include "internal.hpp"
#include "kvq/format/decision_layout.hpp"
#include "kvq/util/error.hpp"

namespace kvq::alloc {

using detail::fail;
using detail::num;

float minifloat_scale(MinifloatFormat f, double amax, double margin, const std::string& field) {
  if (!(std::isfinite(margin) && margin > 0)) fail("margin", "must be finite and > 0, got " + num(margin));
  if (!std::isfinite(amax) || amax <= 0)
    fail(field, "amax " + num(amax) + ": the head never fired (or the statistics are corrupt), it has no " +
                    kvq::to_string(f) + " scale");
  const double s = f == MinifloatFormat::kFp8E4M3 ? amax * margin / 448.0 : amax * margin / (448.0 * 6.0);
  const float sf = static_cast<float>(s);
  if (!(std::isfinite(sf) && sf >= std::numeric_limits<float>::min()))
    fail(field, "amax " + num(amax) + " gives a " + kvq::to_string(f) + " scale " + num(s) + " outside the float range");
  return sf;
}

GroupChoice solve_group_choice(const std::vector<std::vector<int64_t>>& cost,
                               const std::vector<std::vector<double>>& distortion, int64_t budget) {
  const size_t G = cost.size();
  KVQ_ASSERT(distortion.size() == G);
  int64_t unit = 0, cheapest = 0;
  for (size_t g = 0; g < G; ++g) {
    KVQ_ASSERT(!cost[g].empty() && cost[g].size() == distortion[g].size());
    int64_t lo = std::numeric_limits<int64_t>::max();
    for (size_t o = 0; o < cost[g].size(); ++o) {
      KVQ_ASSERT(cost[g][o] >= 0 && std::isfinite(distortion[g][o]));
      unit = std::gcd(unit, cost[g][o]);
      lo = std::min(lo, cost[g][o]);
    }
    cheapest += lo;
  }
  if (cheapest > budget)
    fail("bits_per_dim", "budget " + num(static_cast<long long>(budget)) + " bits per token is below the cheapest choice (" +
                             num(static_cast<long long>(cheapest)) + ")");
  GroupChoice out;
  out.option.assign(G, 0);
  if (G == 0) return out;
  if (unit == 0) unit = 1;  // every option free
  // States: total cost in units, capped by the budget. Options cost at least one unit or zero, so
  // the table has at most G * (largest option / unit) + 1 live states.
  int64_t max_total = 0;
  for (size_t g = 0; g < G; ++g) max_total += *std::max_element(cost[g].begin(), cost[g].end()) / unit;
  const int64_t cap = std::min(budget / unit, max_total);
  const double inf = std::numeric_limits<double>::infinity();
  std::vector<double> best(size_t(cap) + 1, inf), next;
  std::vector<std::vector<int8_t>> pick(G, std::vector<int8_t>(size_t(cap) + 1, -1));
  best[0] = 0.0;
  for (size_t g = 0; g < G; ++g) {
    KVQ_ASSERT(cost[g].size() <= 127);
    next.assign(best.size(), inf);
    for (int64_t c = 0; c <= cap; ++c) {
      if (best[size_t(c)] == inf) continue;
      for (size_t o = 0; o < cost[g].size(); ++o) {
        const int64_t nc = c + cost[g][o] / unit;
        if (nc > cap) continue;
        const double v = best[size_t(c)] + distortion[g][o];
        // Strict: among equal sums the first found wins (lower previous cost, then lower option).
        if (v < next[size_t(nc)]) {
          next[size_t(nc)] = v;
          pick[g][size_t(nc)] = static_cast<int8_t>(o);
        }
      }
    }
    best.swap(next);
  }
  int64_t at = -1;
  for (int64_t c = 0; c <= cap; ++c)
    if (best[size_t(c)] < inf && (at < 0 || best[size_t(c)] < best[size_t(at)])) at = c;
  KVQ_ASSERT(at >= 0);
  out.distortion = best[size_t(at)];
  out.cost = at * unit;
  for (size_t g = G; g-- > 0;) {
    const int o = pick[g][size_t(at)];
    KVQ_ASSERT(o >= 0);
    out.option[g] = o;
    at -= cost[g][size_t(o)] / unit;
  }
  KVQ_ASSERT(at == 0);
  return out;
}

std::string to_string(const KvFormatPair& p) {
  if (p.k == p.v) return kvq::to_string(p.k);
  return std::string(kvq::to_string(p.k)) + "_k_" + kvq::to_string(p.v) + "_v";
}

Allocation allocate_layer_precision(const LayerPrecisionInput& in, double bpd) {
  const Shape& sh = in.shape;
  validate_shape(sh);
  const int L = sh.n_layers, H = sh.n_kv_heads, d = sh.head_dim, dv = sh.v_dim();
  const size_t F = in.formats.size();
  if (F == 0) fail("formats", "no format allowed (fp8, nvfp4)");
  for (size_t f = 0; f < F; ++f) {
    if (in.formats[f] != MinifloatFormat::kFp8E4M3 && in.formats[f] != MinifloatFormat::kNvfp4)
      fail("formats", "unknown format " + num(static_cast<int>(in.formats[f])));
    for (size_t e = 0; e < f; ++e)
      if (in.formats[e] == in.formats[f]) fail("formats", std::string("'") + kvq::to_string(in.formats[f]) + "' given twice");
  }
  auto index_of = [&](MinifloatFormat m) -> size_t {
    const size_t i = size_t(std::find(in.formats.begin(), in.formats.end(), m) - in.formats.begin());
    if (i == F)
      fail("formats", std::string("combination uses '") + kvq::to_string(m) + "', which was not measured");
    return i;
  };
  // The allowed combinations as indices into `formats`: (K, V).
  std::vector<KvFormatPair> combos = in.combos;
  if (combos.empty())
    for (MinifloatFormat f : in.formats) combos.push_back({f, f});
  std::vector<std::pair<size_t, size_t>> ci;
  for (size_t c = 0; c < combos.size(); ++c) {
    for (size_t e = 0; e < c; ++e)
      if (combos[e] == combos[c]) fail("formats", "'" + to_string(combos[c]) + "' given twice");
    ci.emplace_back(index_of(combos[c].k), index_of(combos[c].v));
  }
  const size_t C = combos.size();
  const size_t n_heads = size_t(sh.n_heads());
  if (in.k_mse.size() != n_heads * F || in.v_mse.size() != n_heads * F)
    fail("mse", "expected " + num(static_cast<long long>(n_heads * F)) + " values per side");
  if (in.k_amax.size() != n_heads || in.v_amax.size() != n_heads)
    fail("amax", "expected " + num(static_cast<long long>(n_heads)) + " values per side");
  if (!std::isfinite(bpd) || bpd <= 0) fail("bits_per_dim", "must be finite and > 0, got " + num(bpd));

  // Bits per token of one head in each format, from the packed layout, per side (K and V differ
  // in dim for MLA's served cache).
  std::vector<int64_t> head_bits(F), head_bits_v(F);
  for (size_t f = 0; f < F; ++f) {
    HeadDecision probe;
    probe.kind = CodingKind::kMinifloat;
    probe.minifloat = in.formats[f];
    probe.scale = 1.f;
    head_bits[f] = int64_t(layout::layout_for(probe, d).block_bytes) * 8;
    head_bits_v[f] = int64_t(layout::layout_for(probe, dv).block_bytes) * 8;
  }
  for (size_t i = 0; i < n_heads * F; ++i)
    if (!(std::isfinite(in.k_mse[i]) && in.k_mse[i] >= 0 && std::isfinite(in.v_mse[i]) && in.v_mse[i] >= 0))
      fail("mse", "layer " + num(int(i / F) / H) + " head " + num(int(i / F) % H) + ": not a finite value >= 0");
  std::vector<std::vector<int64_t>> cost(static_cast<size_t>(L), std::vector<int64_t>(C, 0));
  std::vector<std::vector<double>> dist(size_t(L), std::vector<double>(C, 0.0));
  for (int l = 0; l < L; ++l)
    for (size_t c = 0; c < C; ++c) {
      const auto [fk, fv] = ci[c];
      cost[size_t(l)][c] = (head_bits[fk] + head_bits_v[fv]) * H;
      for (int h = 0; h < H; ++h) {
        const size_t i = size_t(l * H + h) * F;
        dist[size_t(l)][c] += in.k_mse[i + fk] + in.v_mse[i + fv];
      }
    }
  const double dims = double(L) * H * (d + dv);
  const int64_t budget = static_cast<int64_t>(std::floor(bpd * dims));
  size_t cheapest = 0;
  for (size_t c = 1; c < C; ++c)
    if (cost[0][c] < cost[0][cheapest]) cheapest = c;
  if (cost[0][cheapest] * L > budget)
    fail("bits_per_dim", num(bpd) + " is below the cheapest layer-precision choice: all " + to_string(combos[cheapest]) +
                             " = " + num(double(cost[0][cheapest]) / (double(H) * (d + dv))) +
                             " effective bits per dim (allowed formats: " + [&] {
                               std::string s;
                               for (size_t c = 0; c < C; ++c) s += (c ? "," : "") + to_string(combos[c]);
                               return s;
                             }() + ")");
  const GroupChoice choice = solve_group_choice(cost, dist, budget);

  Allocation out;
  out.heads.reserve(2 * n_heads);
  for (Side side : {Side::kK, Side::kV})
    for (int l = 0; l < L; ++l)
      for (int h = 0; h < H; ++h) {
        const size_t c = size_t(choice.option[size_t(l)]);
        const size_t f = side == Side::kK ? ci[c].first : ci[c].second;
        const size_t i = size_t(l * H + h);
        HeadDecision dec;
        dec.layer = l;
        dec.kv_head = h;
        dec.side = side;
        dec.kind = CodingKind::kMinifloat;
        dec.post_rope = side == Side::kK;  // as the serving cache stores keys
        dec.minifloat = in.formats[f];
        const std::string field = std::string(side == Side::kK ? "k_amax" : "v_amax") + "[" + num(l) + "][" + num(h) + "]";
        dec.scale = minifloat_scale(dec.minifloat, side == Side::kK ? in.k_amax[i] : in.v_amax[i], in.margin, field);
        dec.budget_bits = static_cast<int>(side == Side::kK ? head_bits[f] : head_bits_v[f]);
        dec.predicted_distortion = (side == Side::kK ? in.k_mse : in.v_mse)[i * F + f];
        out.heads.push_back(std::move(dec));
      }
  auto& s = out.summary;
  s.method = Method::kLayerPrecision;
  s.nominal_bpd = bpd;
  s.budget_total = budget;
  s.budget_assigned = choice.cost;
  s.has_prediction = true;
  s.predicted_distortion = choice.distortion;
  summarize_bits(out.heads, d, &s, dv);
  std::string formats, chosen;
  for (size_t c = 0; c < C; ++c) formats += (c ? "," : "") + to_string(combos[c]);
  for (int l = 0; l < L; ++l) chosen += (l ? "," : "") + to_string(combos[size_t(choice.option[size_t(l)])]);
  s.params = {{"formats", formats}, {"margin", num(in.margin)}, {"layer_formats", chosen}};
  return out;
}

}  // namespace kvq::alloc
