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

double Stairs::value(int h, int64_t budget, int* k) const {
  // Branch-free upper bound (the search runs for every head; its branches would mispredict).
  const int64_t* first = cost_of(h);
  const int64_t* base = first;
  size_t len = static_cast<size_t>(size(h));
  while (len > 1) {
    const size_t half = len / 2;
    base = base[half] <= budget ? base + half : base;
    len -= half;
  }
  const int i = static_cast<int>(base - first) + (*base <= budget) - 1;  // last step <= budget
  if (k) *k = i;
  return i < 0 ? std::numeric_limits<double>::infinity() : dist_of(h)[i];
}

int lower_hull(const int64_t* cost, const double* dist, int np, int32_t* out) {
  int top = 0;
  for (int i = 0; i < np; ++i) {
    while (top >= 2 && !left_turn(static_cast<double>(cost[out[top - 2]]), dist[out[top - 2]],
                                  static_cast<double>(cost[out[top - 1]]), dist[out[top - 1]],
                                  static_cast<double>(cost[i]), dist[i]))
      --top;
    out[top++] = i;
  }
  return top;
}

namespace {

struct Segment {
  double eff;    // distortion saved per bit
  int64_t cost;  // bits of this hull step
  int32_t head;
  int32_t seg;   // index along the head's hull
};

// Key order of the LP greedy: better efficiency first, ties to the lower head, then hull order.
inline bool seg_before(const Segment& a, const Segment& b) {
  return (a.eff > b.eff) |
         ((a.eff == b.eff) & ((a.head < b.head) | ((a.head == b.head) & (a.seg < b.seg))));
}

// Efficiencies are non-negative doubles, whose bit patterns order like their values. The LP finds
// its critical segment by a cost histogram over the 11 exponent bits (they are > 0), then one over
// the next 8 bits inside the critical bucket; only the final sub-bucket is sorted.
inline uint64_t bits_of(double e) {
  uint64_t u;
  std::memcpy(&u, &e, sizeof u);
  return u;
}
constexpr int kKeys1 = 1 << 11;  // efficiencies are >= 0: the sign bit is clear
inline uint32_t key1(double e) { return static_cast<uint32_t>(bits_of(e) >> 52) & 0x7ffu; }
inline uint32_t key2(double e) { return static_cast<uint32_t>(bits_of(e) >> 44) & 0xffu; }

// Spread `slack` evenly over heads below their cap (lower index first for the remainder).
void spread_slack(const Stairs& c, std::vector<int64_t>* budgets, int64_t slack) {
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

ExactSolution solve_stairs(Stairs& c, int64_t total, SolveInfo* info) {
  const int n = c.n();
  if (n == 0) fail("heads", "no heads to allocate");
  int64_t base = 0, caps = 0;
  for (int h = 0; h < n; ++h) {
    KVQ_ASSERT(c.size(h) > 0);
    KVQ_ASSERT(c.cost_of(h)[0] >= c.b_min[h] && c.cost_of(h)[c.size(h) - 1] <= c.b_max[h]);
    base += c.cost_of(h)[0];
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

  // 1. Hulls (unless the caller built them with the staircases).
  if (!c.has_hull) {
    if (c.hull.size() < c.used()) c.hull.resize(c.used());
    c.hstart.resize(n + 1);
    size_t u = 0;
    for (int h = 0; h < n; ++h) {
      c.hstart[h] = u;
      u += static_cast<size_t>(lower_hull(c.cost_of(h), c.dist_of(h), c.size(h), c.hull.data() + u));
    }
    c.hstart[n] = u;
    c.has_hull = true;
  }
  auto hv_of = [&](int h) { return c.hull.data() + c.hstart[h]; };
  auto hsize = [&](int h) { return static_cast<int>(c.hstart[h + 1] - c.hstart[h]); };

  if (!c.has_seg) {
    const size_t total_h = c.hstart[n];
    if (c.hcost.size() < total_h)
      c.hcost.resize(total_h), c.hdist.resize(total_h), c.eff.resize(total_h);
    for (int h = 0; h < n; ++h) {
      const int32_t* hv = hv_of(h);
      const int nh = hsize(h);
      int64_t* hc = c.hcost.data() + c.hstart[h];
      double* hd = c.hdist.data() + c.hstart[h];
      for (int s = 0; s < nh; ++s) hc[s] = c.cost_of(h)[hv[s]], hd[s] = c.dist_of(h)[hv[s]];
      hull_efficiencies(hc, hd, nh, c.eff.data() + c.hstart[h]);
    }
    c.has_seg = true;
  }

  // Scratch kept across calls (per thread): the panels are large and this is called in loops.
  thread_local std::vector<int64_t> hist1, hist2;
  thread_local std::vector<Segment> bucket, crit_list;
  thread_local std::vector<int> lp_at, inc, alt, choice;
  thread_local std::vector<double> m;

  // 2. Efficiencies made non-increasing along each head (each = min(itself, the one before):
  // rounding can make a slope wobble, and the LP takes prefixes of every hull), and the cost
  // histogram of the hull segments over the exponent bits of their efficiencies.
  hist1.assign(2 * kKeys1, 0);
  for (int h = 0; h < n; ++h) {
    double* e = c.eff.data() + c.hstart[h];
    const int64_t* hc = c.hcost.data() + c.hstart[h];
    const int ns = hsize(h) - 1;
    bool sorted = c.eff_sorted[h];
    if (!sorted) {
      sorted = true;
      for (int s = 1; s < ns; ++s) sorted &= e[s] <= e[s - 1];
    }
    if (!sorted)
      for (int s = 1; s < ns; ++s) e[s] = e[s] < e[s - 1] ? e[s] : e[s - 1];
    // Two histograms for alternate segments: neighbours often share a key, and one array would
    // chain each update to the last through memory.
    int s = 0;
    for (; s + 1 < ns; s += 2) {
      hist1[key1(e[s])] += hc[s + 1] - hc[s];
      hist1[kKeys1 + key1(e[s + 1])] += hc[s + 2] - hc[s + 1];
    }
    if (s < ns) hist1[key1(e[s])] += hc[s + 1] - hc[s];
  }

  // 3. LP relaxation: in key order, segments are taken while they fit; the first that does not is
  // critical and its efficiency is the multiplier mu. Taken sets are prefixes of every hull.
  int64_t left = total - base;
  double mu = 0.0;
  lp_at.assign(n, 0);  // hull vertex reached per head
  int cut1 = -1;
  for (int b = kKeys1 - 1; b >= 0; --b) {
    const int64_t hb = hist1[b] + hist1[kKeys1 + b];
    if (hb <= left) {
      left -= hb;
      continue;
    }
    cut1 = b;
    break;
  }
  bool has_crit = false;
  Segment crit{};
  if (cut1 < 0) {
    for (int h = 0; h < n; ++h) lp_at[h] = hsize(h) - 1;
  } else {
    bucket.clear();
    const uint32_t cut = static_cast<uint32_t>(cut1);
    for (int h = 0; h < n; ++h) {
      const double* e = c.eff.data() + c.hstart[h];
      const int ns = hsize(h) - 1;
      // First segment with key <= cut (keys fall along the hull).
      int lo = 0, hi = ns;
      while (lo < hi) {
        const int mid = (lo + hi) / 2;
        if (key1(e[mid]) > cut) lo = mid + 1;
        else hi = mid;
      }
      lp_at[h] = lo;
      const int64_t* hc = c.hcost.data() + c.hstart[h];
      for (int s = lo; s < ns && key1(e[s]) == cut; ++s)
        bucket.push_back({e[s], hc[s + 1] - hc[s], h, s});
    }
    hist2.assign(256, 0);
    for (const Segment& sg : bucket) hist2[key2(sg.eff)] += sg.cost;
    int cut2 = -1;
    for (int b = 255; b >= 0; --b) {
      if (hist2[b] <= left) {
        left -= hist2[b];
        continue;
      }
      cut2 = b;
      break;
    }
    KVQ_ASSERT(cut2 >= 0);  // the bucket as a whole does not fit
    crit_list.clear();
    for (const Segment& sg : bucket) {
      const int k2 = static_cast<int>(key2(sg.eff));
      if (k2 > cut2) lp_at[sg.head] = std::max(lp_at[sg.head], sg.seg + 1);
      else if (k2 == cut2) crit_list.push_back(sg);
    }
    std::sort(crit_list.begin(), crit_list.end(), seg_before);
    size_t i = 0;
    while (crit_list[i].cost <= left) {
      left -= crit_list[i].cost;
      lp_at[crit_list[i].head] = std::max(lp_at[crit_list[i].head], crit_list[i].seg + 1);
      ++i;
    }
    crit = crit_list[i];
    mu = crit.eff;
    has_crit = true;
  }

  // 4. Integer incumbent, the better of two roundings of the LP: (A) leave the critical segment
  // out; (B) take it and pay for it by stepping one other head back down its staircase where that
  // costs least. Either way the leftover then goes to whichever head saves most by climbing its
  // staircase, repeatedly. A tight incumbent keeps the DP below small.
  inc.resize(n);
  for (int h = 0; h < n; ++h) inc[h] = hv_of(h)[lp_at[h]];
  auto climb = [&](std::vector<int>* pos, int64_t lft) {
    while (lft > 0) {
      int best_h = -1, best_k = -1;
      double best_gain = 0.0;
      for (int h = 0; h < n; ++h) {
        const int64_t* pc = c.cost_of(h);
        const int at = (*pos)[h], np = c.size(h);
        int k = at;
        while (k + 1 < np && pc[k + 1] - pc[at] <= lft) ++k;
        const double gain = c.dist_of(h)[at] - c.dist_of(h)[k];
        if (gain > best_gain) best_gain = gain, best_h = h, best_k = k;
      }
      if (best_h < 0) break;
      lft -= c.cost_of(best_h)[best_k] - c.cost_of(best_h)[(*pos)[best_h]];
      (*pos)[best_h] = best_k;
    }
  };
  auto total_of = [&](const std::vector<int>& pos) {
    double v = 0.0;
    for (int h = 0; h < n; ++h) v += c.dist_of(h)[pos[h]];
    return v;
  };
  bool have_alt = false;
  if (has_crit) {
    const int hc = crit.head;
    const int64_t deficit = crit.cost - left;
    int give_h = -1, give_k = -1;
    double give_loss = std::numeric_limits<double>::infinity();
    for (int h = 0; h < n; ++h) {
      if (h == hc) continue;
      const int64_t* pc = c.cost_of(h);
      const double* pd = c.dist_of(h);
      int k = inc[h];
      while (k > 0 && pc[inc[h]] - pc[k] < deficit) --k;
      if (pc[inc[h]] - pc[k] < deficit) continue;
      const double loss = pd[k] - pd[inc[h]];
      if (loss < give_loss) give_loss = loss, give_h = h, give_k = k;
    }
    if (give_h >= 0) {
      alt = inc;
      alt[hc] = hv_of(hc)[crit.seg + 1];
      alt[give_h] = give_k;
      climb(&alt, c.cost_of(give_h)[inc[give_h]] - c.cost_of(give_h)[give_k] - deficit);
      have_alt = true;
    }
  }
  climb(&inc, left);
  double ub = total_of(inc);
  if (have_alt) {
    const double ub_alt = total_of(alt);
    if (ub_alt < ub) ub = ub_alt, inc.swap(alt);
  }

  // 5. Lagrangian bound L(mu) = sum_h m_h - mu total, m_h = min over the head's options of
  // D + mu c. Options off the staircase are dominated by steps (no more cost, no more D) and steps
  // lie on or above the hull (the monotone chain drops a point only when it is not below the
  // line through its neighbours), so the minimum over all hull vertices is m_h; it is taken over
  // every vertex, not only near the LP vertex, so it does not rest on the LP's rounding.
  m.resize(n);
  double lb = -mu * static_cast<double>(total), m_abs = 0.0;
  for (int h = 0; h < n; ++h) {
    const int64_t* hc = c.hcost.data() + c.hstart[h];
    const double* hd = c.hdist.data() + c.hstart[h];
    const int nh = hsize(h);
    double b0 = std::numeric_limits<double>::infinity(), b1 = b0;  // two chains of min
    int k = 0;
    for (; k + 1 < nh; k += 2) {
      const double v0 = hd[k] + mu * static_cast<double>(hc[k]);
      const double v1 = hd[k + 1] + mu * static_cast<double>(hc[k + 1]);
      b0 = v0 < b0 ? v0 : b0;
      b1 = v1 < b1 ? v1 : b1;
    }
    if (k < nh) {
      const double v0 = hd[k] + mu * static_cast<double>(hc[k]);
      b0 = v0 < b0 ? v0 : b0;
    }
    const double best = b0 < b1 ? b0 : b1;
    m[h] = best;
    lb += best;
    m_abs += std::fabs(best);
  }

  ExactSolution sol;
  sol.lower_bound = lb;
  sol.upper_bound_greedy = ub;
  choice = inc;
  // Exactness. Any solution x has sum D(x) = L(mu) + sum_h rc_h(x_h) + mu (total - sum c(x)),
  // rc_h(o) = D_o + mu c_o - m_h >= 0, so every term is >= 0. If some x beats the best solution
  // found among options with rc <= g, and that best is <= LB + g, then sum_h rc_h(x_h) < g: x uses
  // only options with rc < g, so the search saw it - a contradiction. With g = UB - LB the
  // incumbent itself qualifies, so the loop below ends. `tol` bounds the rounding in LB, the m_h
  // and the rc (a few ulps per term, n + 1 terms, 8x margin); survivors and DP states are kept up
  // to g + tol, so rounding can only keep extra options, never drop a needed one, and the result
  // is within rounding (not within a tolerance) of the optimum.
  const double tol = rounding_tol(n, std::fabs(ub) + m_abs + mu * static_cast<double>(total));
  if (info) {
    info->mu = mu;
    info->m.assign(m.begin(), m.end());
  }
  if (ub - lb > tol) {
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
    thread_local std::vector<Opt> surv;
    thread_local std::vector<size_t> sstart;
    thread_local std::vector<int> free;
    thread_local std::vector<std::vector<State>> layers;
    thread_local std::vector<State> fa, fb, fc;
    sstart.assign(n + 1, 0);
    // Reduced-cost fixing at g, then the Pareto DP over the heads left with more than one option:
    // the best solution using only options with rc <= g + tol (false: there is none).
    auto solve_within = [&](double g, std::vector<int>* out, double* out_obj) {
      const double keep = g + tol;
      // Survivors: every step with rc <= g + tol (in cost order). Steps lie on or above the hull,
      // along which rc is convex with its minimum at the LP vertex, so only steps between the
      // nearest hull vertices (either side) with rc > g + 2 tol can survive; the extra tol covers
      // the rounding of the hull itself.
      surv.clear();
      for (int h = 0; h < n; ++h) {
        sstart[h] = surv.size();
        const int64_t* pc = c.cost_of(h);
        const double* pd = c.dist_of(h);
        const int* hv = hv_of(h);
        auto rc = [&](int k) { return pd[k] + mu * static_cast<double>(pc[k]) - m[h]; };
        int a = lp_at[h], b = lp_at[h];
        while (a > 0 && rc(hv[a]) <= keep + tol) --a;
        while (b + 1 < hsize(h) && rc(hv[b]) <= keep + tol) ++b;
        for (int k = hv[a]; k <= hv[b]; ++k)
          if (rc(k) <= keep) surv.push_back({k, pc[k], pd[k]});
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
      layers.resize(free.size() + 1);
      layers[0].assign(1, {0, 0.0, -1, -1});
      double mpart = 0.0;
      for (size_t f = 0; f < free.size(); ++f) {
        const Opt* so = surv.data() + sstart[free[f]];
        const int nso = static_cast<int>(sstart[free[f] + 1] - sstart[free[f]]);
        const std::vector<State>& prev = layers[f];
        const int np = static_cast<int>(prev.size());
        // Partial reduced cost (value + mu cost - sum of m over the heads so far) must stay
        // <= g + tol: the heads still to come only add rc >= 0.
        mpart += m[free[f]] - mu * static_cast<double>(so[0].cost);
        std::vector<State>& next = layers[f + 1];
        next.clear();
        // The Pareto frontier (cost up, value strictly down; among equal candidates the first in
        // (cost, value, parent, option) order) of the candidates prev[si] + option o, built by
        // merging the shifted copies of prev (each already such a list) one at a time; then the
        // states over the rc bound are dropped (a dominated candidate has at least the rc of its
        // dominator, so the order of the two filters does not matter).
        auto copy_of = [&](int o, std::vector<State>* out) {
          const int64_t dc = so[o].cost - so[0].cost;
          out->clear();
          for (int si = 0; si < np && prev[si].cost + dc <= room; ++si)
            out->push_back({prev[si].cost + dc, prev[si].value + so[o].v, si, o});
        };
        copy_of(0, &fa);
        for (int o = 1; o < nso; ++o) {
          copy_of(o, &fb);
          fc.clear();
          size_t i = 0, j = 0;
          double low = std::numeric_limits<double>::infinity();
          while (i < fa.size() || j < fb.size()) {
            bool take_a = j >= fb.size();
            if (!take_a && i < fa.size()) {
              const State& x = fa[i];
              const State& y = fb[j];
              take_a = x.cost != y.cost     ? x.cost < y.cost
                       : x.value != y.value ? x.value < y.value
                       : x.parent != y.parent ? x.parent < y.parent
                                              : x.opt < y.opt;
            }
            const State& z = take_a ? fa[i++] : fb[j++];
            if (z.value < low) low = z.value, fc.push_back(z);
          }
          fa.swap(fc);
        }
        for (const State& st : fa)
          if (st.value + mu * static_cast<double>(st.cost) - mpart <= keep) next.push_back(st);
        sol.dp_states += static_cast<int64_t>(next.size());
        if (next.empty()) return false;
      }
      // Values fall along a Pareto list: the last state is the cheapest optimum.
      const std::vector<State>& last = layers[free.size()];
      int si = static_cast<int>(last.size()) - 1;
      for (size_t f = free.size(); f-- > 0;) {
        const State& st = layers[f + 1][si];
        (*out)[free[f]] = surv[sstart[free[f]] + st.opt].k;
        si = st.parent;
      }
      *out_obj = fixed_sum + last.back().value;
      sol.free_heads = static_cast<int>(free.size());
      return true;
    };
    // g starts small (a tight bound keeps the DP tiny) and grows x4 until the DP's best is
    // provably optimal. U = the best solution known (the incumbent, then any better DP result);
    // once g >= U - LB every solution better than U was in reach, so U is optimal: g never needs
    // to pass U - LB, which shrinks as the DP finds better solutions.
    thread_local std::vector<int> dp_choice;
    double dp_obj = 0.0, best = ub;
    for (double g = std::max(tol, (ub - lb) / 256);;) {
      const bool found = solve_within(g, &dp_choice, &dp_obj);
      if (found && dp_obj <= best) best = dp_obj, choice = dp_choice;
      if ((found && dp_obj <= lb + g) || g >= best - lb) break;
      g = std::min(4 * g, best - lb);
    }
  }

  sol.point.assign(choice.begin(), choice.end());
  sol.budgets.resize(n);
  int64_t used = 0;
  sol.objective = 0.0;
  for (int h = 0; h < n; ++h) {
    sol.budgets[h] = c.cost_of(h)[choice[h]];
    used += sol.budgets[h];
    sol.objective += c.dist_of(h)[choice[h]];
  }
  KVQ_ASSERT(used <= total);
  spread_slack(c, &sol.budgets, total - used);
  return sol;
}

}  // namespace detail

ExactSolution solve_exact_budget(const std::vector<HeadCurve>& curves, int64_t total) {
  thread_local detail::Stairs flat;
  flat.clear();
  for (const auto& hc : curves) {
    if (hc.points.empty()) fail("curves", "a head has no options");
    flat.reserve_more(hc.points.size());
    const size_t at = flat.used();
    for (size_t i = 0; i < hc.points.size(); ++i) {
      flat.cost[at + i] = hc.points[i].cost;
      flat.dist[at + i] = hc.points[i].distortion;
    }
    flat.close_head(hc.points.size(), 0, hc.b_min, hc.b_max);
  }
  return detail::solve_stairs(flat, total);
}

}  // namespace kvq::alloc
