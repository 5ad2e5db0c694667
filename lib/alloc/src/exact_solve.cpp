// The exact budget solver on flat staircases (exact_flat.hpp), phase by phase: hulls and their
// segments, the LP relaxation, an integer incumbent, the Lagrangian bound, then reduced-cost
// fixing and a Pareto DP with a growing gap until the optimum is proven.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "exact_flat.hpp"
#include "internal.hpp"

namespace kvq::alloc::detail {

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

// A staircase step that survives reduced-cost fixing: its index in the head, cost and distortion.
struct Survivor {
  int k;
  int64_t cost;
  double v;
};

// A state of the Pareto DP: a partial solution over the free heads so far.
struct DpState {
  int64_t cost;  // above the free heads' cheapest survivors
  double value;
  int parent;
  int opt;
};

// Scratch of one solve, kept across calls (per thread): the panels are large and the solver is
// called in loops.
struct Scratch {
  std::vector<int64_t> hist1, hist2;
  std::vector<Segment> bucket, crit_list;
  std::vector<int> lp_at, inc, alt, choice;
  std::vector<double> m;
  std::vector<Survivor> surv;
  std::vector<size_t> sstart;
  std::vector<int> free;
  std::vector<std::vector<DpState>> layers;
  std::vector<DpState> fa, fb, fc;
  std::vector<int> dp_choice;
};

// The LP relaxation's outcome (the hull vertex reached per head is in Scratch::lp_at).
struct LpRelaxation {
  double mu = 0.0;      // the multiplier: the critical segment's efficiency (0 if none)
  int64_t left = 0;     // budget left over after the segments taken
  bool has_crit = false;
  Segment crit{};       // the first segment in key order that does not fit
};

// Checks that the total lies between the sum of the heads' cheapest costs and the sum of their
// caps; returns the former.
int64_t check_budget(const Stairs& c, int64_t total) {
  const int n = c.n();
  int64_t base = 0, caps = 0;
  for (int h = 0; h < n; ++h) {
    KVQ_ASSERT(c.size(h) > 0);
    KVQ_ASSERT(c.cost_of(h)[0] >= c.budget_floor[h] &&
               c.cost_of(h)[c.size(h) - 1] <= c.budget_cap[h]);
    base += c.cost_of(h)[0];
    caps += c.budget_cap[h];
  }
  if (base > total)
    fail("budget", "total " + num(static_cast<long long>(total)) +
                       " bits is below the sum of per-head minimum budgets " +
                       num(static_cast<long long>(base)));
  if (caps < total)
    fail("budget", "total " + num(static_cast<long long>(total)) +
                       " bits exceeds what the heads can hold (sum of caps " +
                       num(static_cast<long long>(caps)) + ")");
  return base;
}

// Phase 1: each head's lower hull, for staircases that came without one.
void build_hulls(Stairs& c) {
  const int n = c.n();
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

// Phase 1b: each hull vertex's cost and distortion and the segment slopes, when not given.
void build_segments(Stairs& c) {
  const int n = c.n();
  const size_t total_h = c.hstart[n];
  if (c.hcost.size() < total_h)
    c.hcost.resize(total_h), c.hdist.resize(total_h), c.eff.resize(total_h);
  for (int h = 0; h < n; ++h) {
    const int32_t* hv = c.hull_of(h);
    const int nh = c.hull_size(h);
    int64_t* hc = c.hcost.data() + c.hstart[h];
    double* hd = c.hdist.data() + c.hstart[h];
    for (int s = 0; s < nh; ++s) hc[s] = c.cost_of(h)[hv[s]], hd[s] = c.dist_of(h)[hv[s]];
    hull_efficiencies(hc, hd, nh, c.eff.data() + c.hstart[h]);
  }
  c.has_seg = true;
}

// Phase 2: efficiencies made non-increasing along each head (each = min(itself, the one before):
// rounding can make a slope wobble, and the LP takes prefixes of every hull), and the cost
// histogram of the hull segments over the exponent bits of their efficiencies.
void monotone_efficiencies(Stairs& c, std::vector<int64_t>* hist1_out) {
  const int n = c.n();
  std::vector<int64_t>& hist1 = *hist1_out;
  hist1.assign(2 * kKeys1, 0);
  for (int h = 0; h < n; ++h) {
    double* e = c.eff.data() + c.hstart[h];
    const int64_t* hc = c.hcost.data() + c.hstart[h];
    const int ns = c.hull_size(h) - 1;
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
}

// Phase 3: the LP relaxation. In key order, segments are taken while they fit (`left` = the
// budget above the cheapest steps); the first that does not is critical and its efficiency is
// the multiplier mu. Taken sets are prefixes of every hull: s->lp_at = the vertex reached.
LpRelaxation lp_relaxation(const Stairs& c, int64_t left, Scratch* sc) {
  const int n = c.n();
  const std::vector<int64_t>& hist1 = sc->hist1;
  std::vector<int>& lp_at = sc->lp_at;
  LpRelaxation lp;
  lp_at.assign(n, 0);
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
  if (cut1 < 0) {
    for (int h = 0; h < n; ++h) lp_at[h] = c.hull_size(h) - 1;
  } else {
    std::vector<Segment>& bucket = sc->bucket;
    bucket.clear();
    const uint32_t cut = static_cast<uint32_t>(cut1);
    for (int h = 0; h < n; ++h) {
      const double* e = c.eff.data() + c.hstart[h];
      const int ns = c.hull_size(h) - 1;
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
    std::vector<int64_t>& hist2 = sc->hist2;
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
    std::vector<Segment>& crit_list = sc->crit_list;
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
    lp.crit = crit_list[i];
    lp.mu = lp.crit.eff;
    lp.has_crit = true;
  }
  lp.left = left;
  return lp;
}

// Spends up to `lft` bits by moving, repeatedly, the one head that saves most by climbing its
// staircase within what is left.
void climb(const Stairs& c, std::vector<int>* pos, int64_t lft) {
  const int n = c.n();
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
}

// sum_h D_h at the given staircase points.
double objective_of(const Stairs& c, const std::vector<int>& pos) {
  double v = 0.0;
  for (int h = 0; h < c.n(); ++h) v += c.dist_of(h)[pos[h]];
  return v;
}

// Phase 4: the integer incumbent into s->inc, the better of two roundings of the LP: (A) leave
// the critical segment out; (B) take it and pay for it by stepping one other head back down its
// staircase where that costs least. Either way the leftover then goes to whichever head saves
// most by climbing its staircase, repeatedly. A tight incumbent keeps the DP small. Returns its
// objective (UB).
double integer_incumbent(const Stairs& c, const LpRelaxation& lp, Scratch* sc) {
  const int n = c.n();
  std::vector<int>& inc = sc->inc;
  std::vector<int>& alt = sc->alt;
  inc.resize(n);
  for (int h = 0; h < n; ++h) inc[h] = c.hull_of(h)[sc->lp_at[h]];
  bool have_alt = false;
  if (lp.has_crit) {
    const int hc = lp.crit.head;
    const int64_t deficit = lp.crit.cost - lp.left;
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
      alt[hc] = c.hull_of(hc)[lp.crit.seg + 1];
      alt[give_h] = give_k;
      climb(c, &alt, c.cost_of(give_h)[inc[give_h]] - c.cost_of(give_h)[give_k] - deficit);
      have_alt = true;
    }
  }
  climb(c, &inc, lp.left);
  double ub = objective_of(c, inc);
  if (have_alt) {
    const double ub_alt = objective_of(c, alt);
    if (ub_alt < ub) ub = ub_alt, inc.swap(alt);
  }
  return ub;
}

// Phase 5: the Lagrangian bound L(mu) = sum_h m_h - mu total, m_h = min over the head's options
// of D + mu c, into *m (and sum_h |m_h| into *m_abs). Options off the staircase are dominated by
// steps (no more cost, no more D) and steps lie on or above the hull (the monotone chain drops a
// point only when it is not below the line through its neighbours), so the minimum over all hull
// vertices is m_h; it is taken over every vertex, not only near the LP vertex, so it does not
// rest on the LP's rounding.
double lagrangian_bound(const Stairs& c, double mu, int64_t total, std::vector<double>* m_out,
                        double* m_abs_out) {
  const int n = c.n();
  std::vector<double>& m = *m_out;
  m.resize(n);
  double lb = -mu * static_cast<double>(total), m_abs = 0.0;
  for (int h = 0; h < n; ++h) {
    const int64_t* hc = c.hcost.data() + c.hstart[h];
    const double* hd = c.hdist.data() + c.hstart[h];
    const int nh = c.hull_size(h);
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
  *m_abs_out = m_abs;
  return lb;
}

// Reduced-cost fixing: every step with rc <= keep (in cost order) into s->surv / s->sstart.
// Steps lie on or above the hull, along which rc is convex with its minimum at the LP vertex, so
// only steps between the nearest hull vertices (either side) with rc > keep + tol can survive;
// the extra tol covers the rounding of the hull itself. false: some head keeps nothing.
bool collect_survivors(const Stairs& c, double mu, double keep, double tol, Scratch* sc) {
  const int n = c.n();
  std::vector<Survivor>& surv = sc->surv;
  std::vector<size_t>& sstart = sc->sstart;
  const std::vector<double>& m = sc->m;
  surv.clear();
  for (int h = 0; h < n; ++h) {
    sstart[h] = surv.size();
    const int64_t* pc = c.cost_of(h);
    const double* pd = c.dist_of(h);
    const int* hv = c.hull_of(h);
    auto rc = [&](int k) { return pd[k] + mu * static_cast<double>(pc[k]) - m[h]; };
    int a = sc->lp_at[h], b = sc->lp_at[h];
    while (a > 0 && rc(hv[a]) <= keep + tol) --a;
    while (b + 1 < c.hull_size(h) && rc(hv[b]) <= keep + tol) ++b;
    for (int k = hv[a]; k <= hv[b]; ++k)
      if (rc(k) <= keep) surv.push_back({k, pc[k], pd[k]});
    if (surv.size() == sstart[h]) return false;
  }
  sstart[n] = surv.size();
  return true;
}

// The Pareto frontier (cost up, value strictly down; among equal candidates the first in (cost,
// value, parent, option) order) of the candidates prev[si] + option o over the options so[0 ..
// nso) of one head, no costlier than `room`, into sc->fa: the shifted copies of prev (each
// already such a list) are merged one at a time.
void merge_frontier(const std::vector<DpState>& prev, const Survivor* so, int nso, int64_t room,
                    Scratch* sc) {
  const int np = static_cast<int>(prev.size());
  std::vector<DpState>& fa = sc->fa;
  std::vector<DpState>& fb = sc->fb;
  std::vector<DpState>& fc = sc->fc;
  auto copy_of = [&](int o, std::vector<DpState>* out) {
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
        const DpState& x = fa[i];
        const DpState& y = fb[j];
        take_a = x.cost != y.cost     ? x.cost < y.cost
                 : x.value != y.value ? x.value < y.value
                 : x.parent != y.parent ? x.parent < y.parent
                                        : x.opt < y.opt;
      }
      const DpState& z = take_a ? fa[i++] : fb[j++];
      if (z.value < low) low = z.value, fc.push_back(z);
    }
    fa.swap(fc);
  }
}

// Reduced-cost fixing at g, then the Pareto DP over the heads left with more than one option:
// the best solution using only options with rc <= g + tol into *out / *out_obj (false: there is
// none). Heads with one survivor are fixed to it; the others start from s->choice.
bool best_within(const Stairs& c, int64_t total, double mu, double tol, double g, Scratch* sc,
                 ExactSolution* sol, std::vector<int>* out, double* out_obj) {
  const int n = c.n();
  const double keep = g + tol;
  if (!collect_survivors(c, mu, keep, tol, sc)) return false;
  const std::vector<Survivor>& surv = sc->surv;
  const std::vector<size_t>& sstart = sc->sstart;
  const std::vector<double>& m = sc->m;
  std::vector<int>& free = sc->free;
  std::vector<std::vector<DpState>>& layers = sc->layers;
  int64_t room = total;
  double fixed_sum = 0.0;
  free.clear();
  *out = sc->choice;
  for (int h = 0; h < n; ++h) {
    const Survivor& cheapest = surv[sstart[h]];  // survivors are in cost order
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
    const Survivor* so = surv.data() + sstart[free[f]];
    const int nso = static_cast<int>(sstart[free[f] + 1] - sstart[free[f]]);
    // Partial reduced cost (value + mu cost - sum of m over the heads so far) must stay
    // <= g + tol: the heads still to come only add rc >= 0.
    mpart += m[free[f]] - mu * static_cast<double>(so[0].cost);
    std::vector<DpState>& next = layers[f + 1];
    next.clear();
    // The states over the rc bound are dropped after the frontier is built (a dominated
    // candidate has at least the rc of its dominator, so the order of the two filters does not
    // matter).
    merge_frontier(layers[f], so, nso, room, sc);
    for (const DpState& st : sc->fa)
      if (st.value + mu * static_cast<double>(st.cost) - mpart <= keep) next.push_back(st);
    sol->dp_states += static_cast<int64_t>(next.size());
    if (next.empty()) return false;
  }
  // Values fall along a Pareto list: the last state is the cheapest optimum.
  const std::vector<DpState>& last = layers[free.size()];
  int si = static_cast<int>(last.size()) - 1;
  for (size_t f = free.size(); f-- > 0;) {
    const DpState& st = layers[f + 1][si];
    (*out)[free[f]] = surv[sstart[free[f]] + st.opt].k;
    si = st.parent;
  }
  *out_obj = fixed_sum + last.back().value;
  sol->free_heads = static_cast<int>(free.size());
  return true;
}

// Phase 6: the optimum into s->choice, starting from the incumbent (objective ub). g starts
// small (a tight bound keeps the DP tiny) and grows x4 until the DP's best is provably optimal.
// U = the best solution known (the incumbent, then any better DP result); once g >= U - LB every
// solution better than U was in reach, so U is optimal: g never needs to pass U - LB, which
// shrinks as the DP finds better solutions.
void search_optimum(const Stairs& c, int64_t total, double mu, double tol, double lb, double ub,
                    Scratch* sc, ExactSolution* sol) {
  sc->sstart.assign(c.n() + 1, 0);
  double dp_obj = 0.0, best = ub;
  for (double g = std::max(tol, (ub - lb) / 256);;) {
    const bool found = best_within(c, total, mu, tol, g, sc, sol, &sc->dp_choice, &dp_obj);
    if (found && dp_obj <= best) best = dp_obj, sc->choice = sc->dp_choice;
    if ((found && dp_obj <= lb + g) || g >= best - lb) break;
    g = std::min(4 * g, best - lb);
  }
}

// Spread `slack` evenly over heads below their cap (lower index first for the remainder).
void spread_slack(const Stairs& c, std::vector<int64_t>* budgets, int64_t slack) {
  const int n = c.n();
  while (slack > 0) {
    int open = 0;
    for (int h = 0; h < n; ++h) open += (*budgets)[h] < c.budget_cap[h];
    KVQ_ASSERT(open > 0);
    int64_t share = slack / open, extra = slack % open;
    for (int h = 0; h < n && slack > 0; ++h) {
      int64_t room = c.budget_cap[h] - (*budgets)[h];
      if (room <= 0) continue;
      int64_t give = std::min(room, share + (extra > 0 ? 1 : 0));
      if (extra > 0) --extra;
      (*budgets)[h] += give;
      slack -= give;
    }
  }
}

// Phase 7: the chosen points, their budgets and objective into *sol; the budget left over (the
// curves are flat there) is spread so that the budgets sum to the total.
void write_solution(const Stairs& c, int64_t total, const std::vector<int>& choice,
                    ExactSolution* sol) {
  const int n = c.n();
  sol->point.assign(choice.begin(), choice.end());
  sol->budgets.resize(n);
  int64_t used = 0;
  sol->objective = 0.0;
  for (int h = 0; h < n; ++h) {
    sol->budgets[h] = c.cost_of(h)[choice[h]];
    used += sol->budgets[h];
    sol->objective += c.dist_of(h)[choice[h]];
  }
  KVQ_ASSERT(used <= total);
  spread_slack(c, &sol->budgets, total - used);
}

}  // namespace

ExactSolution solve_exact_budget(Stairs& c, int64_t total, SolveInfo* info) {
  const int n = c.n();
  if (n == 0) fail("heads", "no heads to allocate");
  const int64_t base = check_budget(c, total);
  if (!c.has_hull) build_hulls(c);
  if (!c.has_seg) build_segments(c);

  thread_local Scratch sc;
  monotone_efficiencies(c, &sc.hist1);
  const LpRelaxation lp = lp_relaxation(c, total - base, &sc);
  const double ub = integer_incumbent(c, lp, &sc);
  double m_abs = 0.0;
  const double lb = lagrangian_bound(c, lp.mu, total, &sc.m, &m_abs);

  ExactSolution sol;
  sol.lower_bound = lb;
  sol.upper_bound_greedy = ub;
  sc.choice = sc.inc;
  // Exactness. Any solution x has sum D(x) = L(mu) + sum_h rc_h(x_h) + mu (total - sum c(x)),
  // rc_h(o) = D_o + mu c_o - m_h >= 0, so every term is >= 0. If some x beats the best solution
  // found among options with rc <= g, and that best is <= LB + g, then sum_h rc_h(x_h) < g: x uses
  // only options with rc < g, so the search saw it - a contradiction. With g = UB - LB the
  // incumbent itself qualifies, so the search ends. `tol` bounds the rounding in LB, the m_h and
  // the rc (a few ulps per term, n + 1 terms, 8x margin); survivors and DP states are kept up to
  // g + tol, so rounding can only keep extra options, never drop a needed one, and the result is
  // within rounding (not within a tolerance) of the optimum.
  const double tol = rounding_tol(n, std::fabs(ub) + m_abs + lp.mu * static_cast<double>(total));
  if (info) {
    info->mu = lp.mu;
    info->m.assign(sc.m.begin(), sc.m.end());
  }
  if (ub - lb > tol) search_optimum(c, total, lp.mu, tol, lb, ub, &sc, &sol);
  write_solution(c, total, sc.choice, &sol);
  return sol;
}

}  // namespace kvq::alloc::detail
