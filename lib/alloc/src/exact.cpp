#include "kvq/alloc/exact.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>

#include "exact_flat.hpp"
#include "internal.hpp"

namespace kvq::alloc {

using detail::fail;
using detail::num;

HeadCurve make_curve(const std::vector<CurveOption>& options, int64_t b_min, int64_t b_max) {
  if (b_min < 0) fail("b_min", "head budget floor must be >= 0, got " + num(static_cast<long long>(b_min)));
  if (b_max < b_min)
    fail("b_max", "head budget cap " + num(static_cast<long long>(b_max)) + " is below the floor " +
                      num(static_cast<long long>(b_min)));
  struct Item {
    int64_t cost, weight;
    double v;
    int rank, bits;
  };
  std::vector<Item> items;
  items.reserve(options.size());
  for (const auto& o : options) {
    if (!std::isfinite(o.distortion))
      fail("distortion", "not finite at rank " + num(o.rank) + ", bits " + num(o.bits));
    int64_t w = static_cast<int64_t>(o.rank) * o.bits;
    if (w > b_max) continue;
    items.push_back({std::max(w, b_min), w, o.distortion, o.rank, o.bits});
  }
  std::sort(items.begin(), items.end(), [](const Item& a, const Item& b) {
    if (a.cost != b.cost) return a.cost < b.cost;
    if (a.v != b.v) return a.v < b.v;
    if (a.weight != b.weight) return a.weight < b.weight;
    if (a.rank != b.rank) return a.rank < b.rank;
    return a.bits > b.bits;
  });
  HeadCurve c;
  c.b_min = b_min;
  c.b_max = b_max;
  for (const auto& it : items)
    if (c.points.empty() || it.v < c.points.back().distortion)
      c.points.push_back({it.cost, it.v, it.rank, it.bits});
  if (c.points.empty())
    fail("b_max", "no option fits under the head cap " + num(static_cast<long long>(b_max)));
  return c;
}

double curve_value(const HeadCurve& c, int64_t budget, int* point_index) {
  auto it = std::upper_bound(c.points.begin(), c.points.end(), budget,
                             [](int64_t b, const CurvePoint& p) { return b < p.cost; });
  if (it == c.points.begin()) {
    if (point_index) *point_index = -1;
    return std::numeric_limits<double>::infinity();
  }
  --it;
  if (point_index) *point_index = static_cast<int>(it - c.points.begin());
  return it->distortion;
}

namespace detail {

double FlatCurves::value(int h, int64_t budget, int* k) const {
  const CurvePoint* b = of(h);
  const CurvePoint* e = b + size(h);
  const CurvePoint* it =
      std::upper_bound(b, e, budget, [](int64_t x, const CurvePoint& p) { return x < p.cost; });
  if (it == b) {
    if (k) *k = -1;
    return std::numeric_limits<double>::infinity();
  }
  if (k) *k = static_cast<int>(it - 1 - b);
  return (it - 1)->distortion;
}

namespace {

// Lower convex hull of a staircase (costs increasing, values decreasing), as point indices
// written to out[0..returned); collinear points are dropped so slopes strictly flatten along the
// hull. Plain array stack: this runs over every staircase point of every head.
int lower_hull(const CurvePoint* p, int np, int* out) {
  int top = 0;
  for (int i = 0; i < np; ++i) {
    const double xi = static_cast<double>(p[i].cost), yi = p[i].distortion;
    while (top >= 2) {
      const CurvePoint& a = p[out[top - 2]];
      const CurvePoint& b = p[out[top - 1]];
      double cross = static_cast<double>(b.cost - a.cost) * (yi - a.distortion) -
                     (b.distortion - a.distortion) * (xi - static_cast<double>(a.cost));
      if (cross > 0) break;
      --top;
    }
    out[top++] = i;
  }
  return top;
}

struct Segment {
  double eff;    // distortion saved per bit
  int32_t cost;  // bits (one hull step of one head: far below 2^31)
  int32_t head;
  int32_t seg;   // index along the head's hull
};

// Key order of the LP greedy: better efficiency first, ties to the lower head, then hull order.
inline bool seg_before(const Segment& a, const Segment& b) {
  return (a.eff > b.eff) |
         ((a.eff == b.eff) & ((a.head < b.head) | ((a.head == b.head) & (a.seg < b.seg))));
}

// Spread `slack` evenly over heads below their cap (lower index first for the remainder).
void spread_slack(const FlatCurves& c, std::vector<int64_t>* budgets, int64_t slack) {
  const int n = c.n();
  while (slack > 0) {
    int open = 0;
    for (int h = 0; h < n; ++h) open += (*budgets)[h] < c.b_max[h];
    KVQ_ASSERT(open > 0);
    int64_t share = slack / open, extra = slack % open;
    for (int h = 0; h < n && slack > 0; ++h) {
      int64_t room = c.b_max[h] - (*budgets)[h];
      if (room <= 0) continue;
      int64_t give = std::min(room, share + (extra > 0 ? 1 : 0));
      if (extra > 0) --extra;
      (*budgets)[h] += give;
      slack -= give;
    }
  }
}

}  // namespace

ExactSolution solve_flat(const FlatCurves& c, int64_t total) {
  const int n = c.n();
  if (n == 0) fail("heads", "no heads to allocate");
  int64_t base = 0, caps = 0;
  for (int h = 0; h < n; ++h) {
    KVQ_ASSERT(c.size(h) > 0);
    KVQ_ASSERT(c.of(h)[0].cost >= c.b_min[h] && c.of(h)[c.size(h) - 1].cost <= c.b_max[h]);
    base += c.of(h)[0].cost;
    caps += c.b_max[h];
  }
  if (base > total)
    fail("budget", "total " + num(static_cast<long long>(total)) +
                       " bits is below the sum of per-head minimum budgets " +
                       num(static_cast<long long>(base)));
  if (caps < total)
    fail("budget", "total " + num(static_cast<long long>(total)) +
                       " bits exceeds what the heads can hold (sum of caps " +
                       num(static_cast<long long>(caps)) + ")");

  // Scratch kept across calls (per thread): the panels are large and this is called in loops.
  thread_local std::vector<int> hull_idx;
  thread_local std::vector<size_t> hull_start;
  thread_local std::vector<Segment> segs;

  // 1. Hulls and their segments.
  if (hull_idx.size() < c.pts.size()) hull_idx.resize(c.pts.size());
  hull_start.resize(n + 1);
  size_t used_idx = 0;
  for (int h = 0; h < n; ++h) {
    hull_start[h] = used_idx;
    used_idx += static_cast<size_t>(lower_hull(c.of(h), c.size(h), hull_idx.data() + used_idx));
  }
  hull_start[n] = used_idx;
  auto hv_of = [&](int h) { return hull_idx.data() + hull_start[h]; };
  auto hsize = [&](int h) { return static_cast<int>(hull_start[h + 1] - hull_start[h]); };
  const size_t n_segs = used_idx - static_cast<size_t>(n);
  if (segs.size() < n_segs) segs.resize(n_segs);
  size_t w_seg = 0;
  for (int h = 0; h < n; ++h) {
    const CurvePoint* p = c.of(h);
    const int* hv = hv_of(h);
    double prev = std::numeric_limits<double>::infinity();
    for (int s = 0; s + 1 < hsize(h); ++s) {
      const CurvePoint& a = p[hv[s]];
      const CurvePoint& b = p[hv[s + 1]];
      double eff = (a.distortion - b.distortion) / static_cast<double>(b.cost - a.cost);
      eff = std::min(eff, prev);  // rounding must not break per-head hull order
      prev = eff;
      segs[w_seg++] = {eff, static_cast<int32_t>(b.cost - a.cost), h, s};
    }
  }
  KVQ_ASSERT(w_seg == n_segs);

  // 2. LP relaxation: in key order, segments are taken while they fit; the first that does not is
  // critical and its efficiency is the multiplier mu. No sort: the efficiencies are positive
  // doubles, whose bit patterns order like their values, so a histogram of cost over the top 16
  // bits (sign, exponent, 4 mantissa bits) finds the bucket where the running cost crosses the
  // budget; only that bucket is sorted.
  int64_t left = total - base;
  double mu = 0.0;
  auto bucket = [](double e) {
    uint64_t u;
    std::memcpy(&u, &e, sizeof u);
    return static_cast<uint32_t>(u >> 48);
  };
  thread_local std::vector<int64_t> hist;
  thread_local std::vector<Segment> crit_bucket;
  uint32_t bmin_key = UINT32_MAX, bmax_key = 0;
  for (size_t k = 0; k < n_segs; ++k) {
    uint32_t b = bucket(segs[k].eff);
    bmin_key = std::min(bmin_key, b);
    bmax_key = std::max(bmax_key, b);
  }
  // Taken: every segment whose bucket is above `cut`, plus the first `in_cut` of bucket `cut` in
  // key order. cut = -1 (as bmin_key - 1) when everything fits.
  int64_t cut = -1;
  size_t in_cut = 0;
  if (n_segs > 0) {
    hist.assign(bmax_key - bmin_key + 1, 0);
    for (size_t k = 0; k < n_segs; ++k) hist[bucket(segs[k].eff) - bmin_key] += segs[k].cost;
    for (int64_t b = static_cast<int64_t>(hist.size()) - 1; b >= 0; --b) {
      if (hist[b] <= left) {
        left -= hist[b];
        continue;
      }
      cut = b + bmin_key;
      crit_bucket.clear();
      for (size_t k = 0; k < n_segs; ++k)
        if (bucket(segs[k].eff) == static_cast<uint32_t>(cut)) crit_bucket.push_back(segs[k]);
      std::sort(crit_bucket.begin(), crit_bucket.end(), seg_before);
      while (crit_bucket[in_cut].cost <= left) left -= crit_bucket[in_cut++].cost;
      mu = crit_bucket[in_cut].eff;
      break;
    }
  }
  std::vector<int> lp_at(n, 0);  // hull vertex reached per head (taken sets are prefixes)
  for (size_t k = 0; k < n_segs; ++k)
    if (cut < 0 || bucket(segs[k].eff) > static_cast<uint32_t>(cut))
      lp_at[segs[k].head] = std::max(lp_at[segs[k].head], segs[k].seg + 1);
  for (size_t k = 0; k < in_cut; ++k)
    lp_at[crit_bucket[k].head] = std::max(lp_at[crit_bucket[k].head], crit_bucket[k].seg + 1);

  // 3. Integer incumbent, the better of two roundings of the LP: (A) leave the critical segment
  // out; (B) take it and pay for it by stepping one other head back down its staircase where that
  // costs least. Either way the leftover then goes to whichever head saves most by climbing its
  // staircase, repeatedly. A tight incumbent keeps the DP below small.
  std::vector<int> inc(n);
  for (int h = 0; h < n; ++h) inc[h] = hv_of(h)[lp_at[h]];
  auto climb = [&](std::vector<int>* pos, int64_t lft) {
    while (lft > 0) {
      int best_h = -1, best_k = -1;
      double best_gain = 0.0;
      for (int h = 0; h < n; ++h) {
        const CurvePoint* p = c.of(h);
        const int at = (*pos)[h];
        int k = at;
        while (k + 1 < c.size(h) && p[k + 1].cost - p[at].cost <= lft) ++k;
        double gain = p[at].distortion - p[k].distortion;
        if (gain > best_gain) best_gain = gain, best_h = h, best_k = k;
      }
      if (best_h < 0) break;
      lft -= c.of(best_h)[best_k].cost - c.of(best_h)[(*pos)[best_h]].cost;
      (*pos)[best_h] = best_k;
    }
  };
  auto total_of = [&](const std::vector<int>& pos) {
    double v = 0.0;
    for (int h = 0; h < n; ++h) v += c.of(h)[pos[h]].distortion;
    return v;
  };
  std::vector<int> alt;
  if (cut >= 0) {
    const Segment& crit = crit_bucket[in_cut];
    const int hc = crit.head;
    const int64_t deficit = crit.cost - left;
    int give_h = -1, give_k = -1;
    double give_loss = std::numeric_limits<double>::infinity();
    for (int h = 0; h < n; ++h) {
      if (h == hc) continue;
      const CurvePoint* p = c.of(h);
      int k = inc[h];
      while (k > 0 && p[inc[h]].cost - p[k].cost < deficit) --k;
      if (p[inc[h]].cost - p[k].cost < deficit) continue;
      double loss = p[k].distortion - p[inc[h]].distortion;
      if (loss < give_loss) give_loss = loss, give_h = h, give_k = k;
    }
    if (give_h >= 0) {
      alt = inc;
      alt[hc] = hv_of(hc)[crit.seg + 1];
      alt[give_h] = give_k;
      climb(&alt, c.of(give_h)[inc[give_h]].cost - c.of(give_h)[give_k].cost - deficit);
    }
  }
  climb(&inc, left);
  double ub = total_of(inc);
  if (!alt.empty()) {
    double ub_alt = total_of(alt);
    if (ub_alt < ub) ub = ub_alt, inc = alt;
  }

  // 4. Lagrangian bound L(mu) = sum_h min_k (D_hk + mu c_hk) - mu total; the minimum over a
  // staircase is attained on its hull.
  std::vector<double> m(n);
  double lb = -mu * static_cast<double>(total);
  for (int h = 0; h < n; ++h) {
    // The LP vertex minimises D + mu c along the hull; its neighbours are checked as well so
    // that rounding in the hull cannot make m (and so the bound) too high.
    double best = std::numeric_limits<double>::infinity();
    const int* hv = hv_of(h);
    for (int j = std::max(0, lp_at[h] - 1); j <= std::min(hsize(h) - 1, lp_at[h] + 1); ++j) {
      const CurvePoint& p = c.of(h)[hv[j]];
      best = std::min(best, p.distortion + mu * static_cast<double>(p.cost));
    }
    m[h] = best;
    lb += best;
  }

  ExactSolution sol;
  sol.lower_bound = lb;
  sol.upper_bound_greedy = ub;
  std::vector<int> choice = inc;
  // Any solution x has sum D = L(mu) + sum_h rc_h(x_h) + mu (total - sum c) with all terms >= 0.
  // So if the best solution using only options with rc <= g has sum D <= LB + g, no solution is
  // better (a better one would use only such options too); with g = UB - LB that always holds.
  // g starts small and grows, which keeps the DP tiny when the bound is tight. The tolerance
  // absorbs rounding and only ever keeps extra options.
  const double tol =
      1e-9 * std::max({std::fabs(ub), std::fabs(lb), std::numeric_limits<double>::min()});
  const double full_gap = std::max(0.0, ub - lb) + tol;
  struct Opt {
    int k;
    int64_t cost;
    double v;
  };
  struct State {
    int64_t cost;  // above the free heads' cheapest survivors
    double value;
    int parent;
    int opt;
  };
  std::vector<Opt> surv;
  std::vector<size_t> sstart(n + 1, 0);
  std::vector<int> free;
  std::vector<std::vector<State>> layers;
  std::vector<State> cand;
  // Reduced-cost fixing at g, then the Pareto DP; returns false when the restricted problem has
  // no solution or none within LB + g (unless g is the full gap).
  auto solve_within = [&](double g, std::vector<int>* out, double* out_obj) {
    // Staircase points lie on or above the hull, whose reduced cost is convex with minimum 0 at
    // lp_at; only points between the first hull vertices (either side) above g can survive.
    surv.clear();
    for (int h = 0; h < n; ++h) {
      sstart[h] = surv.size();
      const CurvePoint* p = c.of(h);
      const int* hv = hv_of(h);
      auto rc = [&](int k) { return p[k].distortion + mu * static_cast<double>(p[k].cost) - m[h]; };
      int a = lp_at[h], b = lp_at[h];
      while (a > 0 && rc(hv[a]) <= g) --a;
      while (b + 1 < hsize(h) && rc(hv[b]) <= g) ++b;
      for (int k = hv[a]; k <= hv[b]; ++k)
        if (rc(k) <= g) surv.push_back({k, p[k].cost, p[k].distortion});
      if (surv.size() == sstart[h]) return false;
    }
    sstart[n] = surv.size();
    int64_t room = total;
    double fixed_sum = 0.0;
    free.clear();
    *out = choice;
    for (int h = 0; h < n; ++h) {
      const Opt& cheapest = surv[sstart[h]];  // survivors are in cost order
      room -= cheapest.cost;
      if (sstart[h + 1] - sstart[h] == 1) {
        (*out)[h] = cheapest.k;
        fixed_sum += cheapest.v;
      } else {
        free.push_back(h);
      }
    }
    if (room < 0) return false;
    layers.assign(1, {{0, 0.0, -1, -1}});
    double mpart = 0.0;
    for (size_t f = 0; f < free.size(); ++f) {
      const Opt* so = surv.data() + sstart[free[f]];
      const int nso = static_cast<int>(sstart[free[f] + 1] - sstart[free[f]]);
      const auto& prev = layers.back();
      cand.clear();
      for (int si = 0; si < static_cast<int>(prev.size()); ++si)
        for (int o = 0; o < nso; ++o) {
          int64_t cc = prev[si].cost + (so[o].cost - so[0].cost);
          if (cc > room) break;  // survivors ascend in cost
          cand.push_back({cc, prev[si].value + so[o].v, si, o});
        }
      std::sort(cand.begin(), cand.end(), [](const State& x, const State& y) {
        if (x.cost != y.cost) return x.cost < y.cost;
        if (x.value != y.value) return x.value < y.value;
        if (x.parent != y.parent) return x.parent < y.parent;
        return x.opt < y.opt;
      });
      // Partial reduced cost (value + mu cost - sum of m over the heads so far) must stay <= g.
      mpart += m[free[f]] - mu * static_cast<double>(so[0].cost);
      std::vector<State> next;
      double best = std::numeric_limits<double>::infinity();
      for (const State& st : cand) {
        if (!(st.value < best)) continue;  // dominated: a cheaper-or-equal state is no worse
        if (st.value + mu * static_cast<double>(st.cost) - mpart > g) continue;
        best = st.value;
        next.push_back(st);
      }
      sol.dp_states += static_cast<int64_t>(next.size());
      if (next.empty()) return false;
      layers.push_back(std::move(next));
    }
    // Values fall along a Pareto list: the last state is the cheapest optimum.
    int si = static_cast<int>(layers.back().size()) - 1;
    for (size_t f = free.size(); f-- > 0;) {
      const State& st = layers[f + 1][si];
      (*out)[free[f]] = surv[sstart[free[f]] + st.opt].k;
      si = st.parent;
    }
    *out_obj = fixed_sum + layers.back().back().value;
    sol.free_heads = static_cast<int>(free.size());
    return *out_obj <= lb + g || g >= full_gap;
  };
  if (ub - lb > tol) {
    std::vector<int> dp_choice;
    double dp_obj = 0.0;
    for (double g = std::max(tol, (full_gap - tol) / 256);; g = std::min(4 * g, full_gap)) {
      if (solve_within(g, &dp_choice, &dp_obj)) {
        if (dp_obj <= ub) choice = dp_choice;
        break;
      }
      KVQ_ASSERT(g < full_gap);  // at the full gap the incumbent itself is a candidate
    }
  }

  sol.point = choice;
  sol.budgets.resize(n);
  int64_t used = 0;
  sol.objective = 0.0;
  for (int h = 0; h < n; ++h) {
    const CurvePoint& p = c.of(h)[choice[h]];
    sol.budgets[h] = p.cost;
    used += p.cost;
    sol.objective += p.distortion;
  }
  KVQ_ASSERT(used <= total);
  spread_slack(c, &sol.budgets, total - used);
  return sol;
}

}  // namespace detail

ExactSolution solve_exact_budget(const std::vector<HeadCurve>& curves, int64_t total) {
  detail::FlatCurves flat;
  flat.clear();
  for (const auto& hc : curves) {
    if (hc.points.empty()) fail("curves", "a head has no options");
    flat.pts.insert(flat.pts.end(), hc.points.begin(), hc.points.end());
    flat.close_head(hc.b_min, hc.b_max);
  }
  return detail::solve_flat(flat, total);
}

}  // namespace kvq::alloc
