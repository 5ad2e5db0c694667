#include "kvq/alloc/cobra.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <memory>
#include <numeric>
#include <tuple>

#include "exact_flat.hpp"
#include "internal.hpp"

namespace kvq::alloc {

using detail::fail;
using detail::num;

const char* to_string(C1Rounding r) {
  switch (r) {
    case C1Rounding::kFloor: return "floor";
    case C1Rounding::kRound: return "round";
  }
  return "unknown";
}

C1Rounding c1_rounding_from_string(const std::string& s) {
  if (s == "floor") return C1Rounding::kFloor;
  if (s == "round") return C1Rounding::kRound;
  fail("c1_rounding", "unknown value '" + s + "' (valid: floor, round)");
}

const char* to_string(C2Kind k) {
  switch (k) {
    case C2Kind::kNone: return "none";
    case C2Kind::kDamped: return "damped";
    case C2Kind::kExact: return "exact";
  }
  return "unknown";
}

C2Kind c2_kind_from_string(const std::string& s) {
  if (s == "none") return C2Kind::kNone;
  if (s == "damped") return C2Kind::kDamped;
  if (s == "exact") return C2Kind::kExact;
  fail("c2", "unknown value '" + s + "' (valid: none, damped, exact)");
}

void validate_model(const CobraModel& m, int d) {
  if (d <= 0) fail("head_dim", "must be positive, got " + num(d));
  if (!std::isfinite(m.c) || m.c <= 0) fail("c", "q(b) = c 2^-2b needs c > 0, got " + num(m.c));
  if (m.r_min < 1 || m.r_min > d)
    fail("r_min", "must be in [1, head_dim=" + num(d) + "], got " + num(m.r_min));
  if (m.r_step < 1) fail("r_step", "must be >= 1, got " + num(m.r_step));
  if (m.b_min < 1 || m.b_min > 16) fail("b_min", "must be in [1, 16], got " + num(m.b_min));
  if (m.b_max < m.b_min || m.b_max > 16)
    fail("b_max", "must be in [b_min=" + num(m.b_min) + ", 16], got " + num(m.b_max));
  if (m.rounding != C1Rounding::kFloor && m.rounding != C1Rounding::kRound)
    fail("c1_rounding", "unknown value " + num(static_cast<int>(m.rounding)));
}

std::vector<double> checked_spectrum(const std::vector<double>& lambda, int d,
                                     const std::string& field) {
  if (static_cast<int>(lambda.size()) != d)
    fail(field, "expected " + num(d) + " values, got " + num(static_cast<long long>(lambda.size())));
  std::vector<double> out(lambda);
  double top = 0.0;
  for (int i = 0; i < d; ++i) {
    if (!std::isfinite(out[i])) fail(field, "value " + num(i) + " is not finite: " + num(out[i]));
    top = std::max(top, out[i]);
  }
  for (int i = 0; i < d; ++i) {
    if (out[i] < 0) {
      if (out[i] < -1e-12 * top) fail(field, "value " + num(i) + " is negative: " + num(out[i]));
      out[i] = 0.0;
    }
    if (i > 0 && out[i] > out[i - 1])
      fail(field, "not descending at index " + num(i) + " (" + num(out[i - 1]) + " then " +
                      num(out[i]) + ")");
  }
  return out;
}

namespace {

// One head's spectrum in the form every solver uses: P[r] = sum_{i<r} lambda_i; S = P[d].
// D(r, b) = (S - P[r]) + q(b) P[r] is evaluated by this one expression everywhere so that C1,
// the curves and the decisions agree to the bit.
struct Prefix {
  const double* p;
  int d;
  double total() const { return p[d]; }
  double dist(int r, double q) const { return (p[d] - p[r]) + q * p[r]; }
};

// Every head's prefix sums back to back: one allocation for the whole panel.
struct Prefixes {
  int d = 0;
  std::vector<double> data;
  Prefix operator[](size_t h) const { return {data.data() + h * (d + 1), d}; }
  size_t size() const { return d >= 0 && !data.empty() ? data.size() / (d + 1) : 0; }
};

Prefixes make_prefix(const std::vector<double>& lambda) {
  Prefixes pr;
  pr.d = static_cast<int>(lambda.size());
  pr.data.resize(lambda.size() + 1);
  pr.data[0] = 0.0;
  for (size_t i = 0; i < lambda.size(); ++i) pr.data[i + 1] = pr.data[i] + lambda[i];
  return pr;
}

std::vector<double> q_table(const CobraModel& m) {
  std::vector<double> q(m.b_max + 1);
  for (int b = 0; b <= m.b_max; ++b) q[b] = m.c * std::ldexp(1.0, -2 * b);
  return q;
}

int64_t round_half_even(int64_t num_, int64_t den) {
  int64_t q = num_ / den, rem = num_ % den;
  if (2 * rem > den || (2 * rem == den && (q & 1))) ++q;
  return q;
}

RankBits c1_prefix(const Prefix& pr, int d, int64_t budget, const CobraModel& m,
                   const std::vector<double>& q) {
  RankBits best{0, 0, pr.total()};
  double best_d = std::numeric_limits<double>::infinity();
  if (budget < 0) return best;
  // Beyond floor(B / b_min) no rank reaches b_min bits (floor mode); the reference caps the grid
  // there in round mode too.
  const int64_t r_cap = std::min<int64_t>(d, budget / m.b_min);
  // floor(B / r) by a double division: exact for these magnitudes (a quotient just below an
  // integer k is at least 1/r below it, far above the rounding error), and much cheaper than an
  // int64 division in the loop that dominates C1 and the damped C2.
  const double bd = static_cast<double>(budget);
  for (int64_t r = m.r_min; r <= r_cap; r += m.r_step) {
    int64_t b = m.rounding == C1Rounding::kFloor
                    ? static_cast<int64_t>(bd / static_cast<double>(r))
                    : round_half_even(budget, r);
    if (b < m.b_min) continue;
    b = std::min<int64_t>(b, m.b_max);
    double dist = pr.dist(static_cast<int>(r), q[b]);
    if (dist < best_d) {  // strict: ties keep the smaller rank
      best_d = dist;
      best = {static_cast<int>(r), static_cast<int>(b), dist};
    }
  }
  return best;
}

// C1 (floor mode) when its minimum is already known: `target` = D*(budget), the staircase value
// of the exact solver. When some grid rank attains it, that minimum is C1's (every (r, b(r)) C1
// tries weighs <= budget, and the step's own rank is one of them), so C1's answer is the smallest
// rank r with D(r, b(r)) == target. D(r, .) >= its tail S - P_r (rounding is monotone) and the
// tail falls with r, so no rank below the first with tail <= target can attain it: a binary
// search skips them, and the scan stops at the first match, usually a few ranks on. Same
// expressions as c1_prefix, so the same result to the bit. false: no rank attains the target
// (D* is rank 0's S); the caller runs c1_prefix.
bool c1_at_target(const Prefix& pr, int d, int64_t budget, const CobraModel& m,
                  const std::vector<double>& q, double target, RankBits* out) {
  const int64_t r_cap = std::min<int64_t>(d, budget / m.b_min);
  if (r_cap < m.r_min) return false;
  const int64_t count = (r_cap - m.r_min) / m.r_step + 1;
  int64_t lo = 0, hi = count;  // first grid index with tail <= target
  while (lo < hi) {
    const int64_t mid = (lo + hi) / 2;
    const int r = static_cast<int>(m.r_min + mid * m.r_step);
    if (pr.p[d] - pr.p[r] <= target) hi = mid;
    else lo = mid + 1;
  }
  const double bd = static_cast<double>(budget);
  for (int64_t i = lo; i < count; ++i) {
    const int64_t r = m.r_min + i * m.r_step;
    int64_t b = static_cast<int64_t>(bd / static_cast<double>(r));
    if (b < m.b_min) continue;
    b = std::min<int64_t>(b, m.b_max);
    const double dist = pr.dist(static_cast<int>(r), q[b]);
    if (dist == target) {
      *out = {static_cast<int>(r), static_cast<int>(b), dist};
      return true;
    }
    if (dist < target) return false;  // not the minimum after all: leave it to c1_prefix
  }
  return false;
}

void check_bpd(double bpd, const CobraModel& m) {
  if (!std::isfinite(bpd) || bpd <= 0) fail("bpd", "must be a positive number, got " + num(bpd));
  if (bpd > m.b_max)
    fail("bpd", num(bpd) + " is above b_max=" + num(m.b_max) + " (no head can use it)");
}

// Every head's prefix sums into *out, whose storage is reused (callers keep one per thread: the
// panel is large and rebuilt on every call). Bit for bit the sequential sums p[i+1] = p[i] + l[i].
void prefixes(const std::vector<std::vector<double>>& spectra, int* d, Prefixes* out) {
  if (spectra.empty()) fail("spectra", "no heads");
  *d = static_cast<int>(spectra[0].size());
  const int D = *d;
  const size_t n = spectra.size();
  out->d = D;
  if (out->data.size() != n * (D + 1)) out->data.resize(n * (D + 1));
  thread_local std::vector<const double*> src;
  thread_local std::vector<std::vector<double>> cleaned;
  src.resize(n);
  size_t n_clean = 0;
  for (size_t h = 0; h < n; ++h) {
    const auto& lam = spectra[h];
    // Fast path: finite, non-negative, descending (lam[0] finite, each <= the one before, the
    // last >= 0; NaN fails a comparison). Anything else goes through checked_spectrum for the
    // clamping of eigen-solver noise or the error message.
    bool ok = static_cast<int>(lam.size()) == D;
    if (ok && D > 0) {
      bool bad = !(lam[0] <= std::numeric_limits<double>::max()) || !(lam[D - 1] >= 0);
      for (int i = 1; i < D; ++i) bad |= !(lam[i] <= lam[i - 1]);
      ok = !bad;
    }
    if (ok) {
      src[h] = lam.data();
      continue;
    }
    if (cleaned.size() <= n_clean) cleaned.resize(n_clean + 1);
    cleaned[n_clean] = checked_spectrum(lam, D, "spectra[" + num(static_cast<long long>(h)) + "]");
    src[h] = cleaned[n_clean++].data();
  }
  // Four heads at a time: four independent addition chains instead of one.
  double* base = out->data.data();
  const size_t stride = static_cast<size_t>(D) + 1;
  size_t h = 0;
  for (; h + 4 <= n; h += 4) {
    const double *s0 = src[h], *s1 = src[h + 1], *s2 = src[h + 2], *s3 = src[h + 3];
    double* p0 = base + h * stride;
    double *p1 = p0 + stride, *p2 = p1 + stride, *p3 = p2 + stride;
    double a0 = 0.0, a1 = 0.0, a2 = 0.0, a3 = 0.0;
    p0[0] = p1[0] = p2[0] = p3[0] = 0.0;
    for (int i = 0; i < D; ++i) {
      a0 += s0[i], a1 += s1[i], a2 += s2[i], a3 += s3[i];
      p0[i + 1] = a0, p1[i + 1] = a1, p2[i + 1] = a2, p3[i + 1] = a3;
    }
  }
  for (; h < n; ++h) {
    double* p = base + h * stride;
    p[0] = 0.0;
    for (int i = 0; i < D; ++i) p[i + 1] = p[i] + src[h][i];
  }
}

void check_total(int64_t total, int n, int64_t floor_b) {
  if (total < static_cast<int64_t>(n) * floor_b)
    fail("bpd", "budget too small: " + num(static_cast<long long>(total)) + " bits over " +
                    num(n) + " heads is below the per-head floor B_min=" +
                    num(static_cast<long long>(floor_b)));
}

// The (r, b) options of the model grid no heavier than the head cap, shared by every head (the
// weights do not depend on the spectrum). Chain k holds b = b_min + k over the ranks
// r_j = r_min + j r_step.
struct ModelGrid {
  int J = 0, K = 0, JS = 0;       // ranks, widths, row stride of a head's value table (J + 2)
  std::vector<int32_t> rank;      // [j]
  std::vector<double> q;          // [k] = q(b_min + k)
  std::vector<int32_t> len;       // [k]: ranks j < len[k] have r_j b_k <= cap (falls with k)
  std::vector<int32_t> chains;    // [j]: chains holding rank j (k < chains[j])
  std::vector<double> q_last;     // [j]: q of the widest of them (the rank's lowest D)
  // [k * J + j], k >= 1: the heaviest chain-0 option no heavier than (j, k), as its j; J when
  // there is none (the value table holds +inf there). Grows with k.
  std::vector<int32_t> dom;
  // [k * J + j], k >= 2: the same in chain k - 1 (its heaviest option no heavier than (j, k)).
  std::vector<int32_t> dom_prev;
  std::vector<int32_t> dom1;      // [j]: dom for k = 1; J + 1 when rank j has no chain 1
  // Options in weight order (weight, then rank asc, bits desc): value-table slot k * JS + j and
  // the cost charged, max(r b, floor); pos[k * J + j] = an option's place in that order.
  std::vector<int32_t> slot;
  std::vector<int64_t> cost;
  std::vector<int32_t> pos;
  int words = 0;                  // 64-bit words of a bitmap over positions
  // Chain 0 by rank: cost charged (int and double), position; j_floor = the last rank charged the
  // floor (-1 if none); beyond it the costs strictly rise.
  std::vector<int64_t> cost0;
  std::vector<double> cost0d;
  std::vector<int32_t> pos0;
  std::vector<int32_t> before0;   // [p]: chain-0 options before position p (p = N: all)
  int j_floor = -1;

  ModelGrid(int d, const CobraModel& m, const std::vector<double>& qt, int64_t floor_b,
            int64_t cap) {
    for (int r = m.r_min; r <= d; r += m.r_step) rank.push_back(r);
    J = static_cast<int>(rank.size());
    K = m.b_max - m.b_min + 1;
    JS = J + 2;
    struct Item {
      int64_t weight;
      int r, b, k, j;
    };
    std::vector<Item> items;
    chains.assign(J, 0);
    q_last.assign(J, 0.0);
    for (int k = 0; k < K; ++k) {
      const int b = m.b_min + k;
      q.push_back(qt[b]);
      int l = 0;
      while (l < J && int64_t{rank[l]} * b <= cap) ++l;
      len.push_back(l);
      for (int j = 0; j < l; ++j) {
        items.push_back({int64_t{rank[j]} * b, rank[j], b, k, j});
        chains[j] = k + 1;
        q_last[j] = qt[b];
      }
    }
    dom.assign(static_cast<size_t>(K) * J, J);
    dom_prev.assign(static_cast<size_t>(K) * J, J);
    auto heaviest = [&](int k, int64_t w) {  // in chain k, no heavier than w (J: none)
      int best = J;
      for (int jj = 0; jj < len[k] && int64_t{rank[jj]} * (m.b_min + k) <= w; ++jj) best = jj;
      return best;
    };
    for (int k = 1; k < K; ++k)
      for (int j = 0; j < len[k]; ++j) {
        const int64_t w = int64_t{rank[j]} * (m.b_min + k);
        dom[static_cast<size_t>(k) * J + j] = heaviest(0, w);
        if (k >= 2) dom_prev[static_cast<size_t>(k) * J + j] = heaviest(k - 1, w);
      }
    dom1.assign(J, J + 1);
    for (int j = 0; j < J; ++j)
      if (chains[j] > 1) dom1[j] = dom[static_cast<size_t>(J) + j];
    std::sort(items.begin(), items.end(), [](const Item& a, const Item& b) {
      if (a.weight != b.weight) return a.weight < b.weight;
      if (a.r != b.r) return a.r < b.r;
      return a.b > b.b;
    });
    pos.assign(static_cast<size_t>(K) * J, -1);
    words = static_cast<int>((items.size() + 63) / 64);
    for (size_t p = 0; p < items.size(); ++p) {
      const Item& it = items[p];
      slot.push_back(it.k * JS + it.j);
      cost.push_back(std::max(it.weight, floor_b));
      pos[static_cast<size_t>(it.k) * J + it.j] = static_cast<int32_t>(p);
    }
    for (int j = 0; j < len[0]; ++j) {
      cost0.push_back(std::max(int64_t{rank[j]} * m.b_min, floor_b));
      cost0d.push_back(static_cast<double>(cost0.back()));
      pos0.push_back(pos[j]);
      if (int64_t{rank[j]} * m.b_min <= floor_b) j_floor = j;
    }
    before0.assign(items.size() + 1, 0);
    for (size_t p = 0; p < items.size(); ++p) before0[p + 1] = before0[p] + (items[p].k == 0);
  }
};

// Scratch of the per-head builder (kept per thread by the caller).
struct StairScratch {
  std::vector<double> vals, e0;
  std::vector<int32_t> cand, done;
  std::vector<uint64_t> bm;
  void fit(const ModelGrid& g) {
    const size_t J = static_cast<size_t>(g.J);
    if (cand.size() < J) cand.resize(J), done.resize(J + 1), e0.resize(J);
    if (vals.size() < static_cast<size_t>(g.K) * g.JS) vals.resize(static_cast<size_t>(g.K) * g.JS);
    if (bm.size() < static_cast<size_t>(g.words)) bm.resize(g.words);
  }
};

// One head's staircase D*(B) = min over grid options with r b <= B (plus rank 0 = S), each option
// charged max(r b, floor), its lower hull and the hull's slopes, appended to `st`. The same
// staircase as sorting all options by weight and keeping each that beats everything lighter (one
// that beats a step of its own cost replaces it), without visiting most options:
//  - D(r, b) = (S - P_r) + q(b) P_r, the expression every path uses (so all of them agree to the
//    bit). Chain 0 (b = b_min) is evaluated whole.
//  - An option (r, b), b > b_min, no better than an option of no greater weight is dominated
//    (that one costs no more and is no worse): neither a step nor a hull vertex. Tested against
//    the heaviest such option of chain 0 and of chain b - 1. Rank by rank, widths upward, a rank
//    stops as soon as even its lowest D (its widest b; computed D falls with q exactly, rounding
//    being monotone) is no better than that option, which weighs no more than any wider b of the
//    rank either. A rank is not visited at all when that holds at b_min + 1 against chain 0. With
//    q = c 4^-b small (c = 1/12) only a few ranks near d have options above chain 0 that survive
//    (the "extras").
//  - Steps and the hull (monotone chain, top two points in registers) are built in weight order,
//    merging chain 0 with the extras (a bitmap over the precomputed order). Where chain 0's slopes
//    fall strictly (the usual case past the floor: lambda falls), a run of chain-0 points between
//    two extras is appended without tests once its first two are on the hull. A step that
//    replaces the last one replaces the hull top: lowering a point never brings back points it
//    removed.
void model_stairs(const Prefix& pr, const ModelGrid& g, int64_t floor_b, int64_t cap,
                  bool merge_extras, StairScratch* sc, detail::Stairs* st) {
  const int J = g.J, JS = g.JS;
  const double S = pr.total();
  const double* P = pr.p;
  const double inf = std::numeric_limits<double>::infinity();
  double* vals = sc->vals.data();  // row k = chain k; row 0 = chain 0
  double* v0 = vals;
  v0[J] = inf;        // "no dominator": everything beats it
  v0[J + 1] = -inf;   // "no chain 1": nothing beats it
  const double q0 = g.q[0];
  int32_t* cand = sc->cand.data();
  int32_t* done = sc->done.data();  // chains evaluated per rank (chain 0 always; J: none)
  done[J] = 0;
  // Chain 0, and the ranks that may hold something better above it (the dominance rule below
  // at k = 1), heaviest first: dominators have ranks >= j, so their values are ready. On the way,
  // chain 0's slopes past the floor and the first rank from which they fall strictly and stay
  // positive: from there on every chain-0 point is a step and makes a left turn with the two
  // before it, so a run of them goes onto the staircase and the hull without tests (below).
  const int L0 = g.len[0];
  const int j0 = std::max(g.j_floor, 0);
  double* e0 = sc->e0.data();
  int convex_from = L0;  // none: no run goes in bulk
  bool convex = true;
  if (L0 >= 1) e0[L0 - 1] = 0.0;  // so that the last slope must be > 0
  int nc = 0;
  for (int j = J - 1; j >= 0; --j) {
    const double p = P[g.rank[j]];
    const double t = S - p;
    v0[j] = t + q0 * p;  // ranks beyond len[0] are never read through chain 0
    done[j] = 1;
    const double low = t + g.q_last[j] * p;
    cand[nc] = j;
    nc += !(low >= v0[g.dom1[j]]);
    if (j >= j0 && j + 1 < L0) {  // the slope to the next chain-0 point (as the hull computes it)
      const double e = (v0[j] - v0[j + 1]) / (g.cost0d[j + 1] - g.cost0d[j]);
      e0[j] = e;
      convex &= e > e0[j + 1];
      convex_from = convex ? j : convex_from;
    }
  }
  uint64_t* bm = sc->bm.data();  // the extras: options above chain 0 that survive
  std::fill(bm, bm + g.words, uint64_t{0});
  for (int i = 0; i < nc; ++i) {  // heaviest first: the chain k - 1 bound of (j, k) has rank >= j
    const int j = cand[i];
    const int nk = g.chains[j];
    const double p = P[g.rank[j]];
    const double t = S - p;
    const double low = t + g.q_last[j] * p;
    for (int k = 1; k < nk; ++k) {
      const size_t at = static_cast<size_t>(k) * J + j;
      // The better of the heaviest chain-0 and chain-(k-1) options no heavier than (j, k); the
      // latter only if it was evaluated (J for k = 1: chain 0 is the other one).
      const int ja = g.dom_prev[at];
      double dv = v0[g.dom[at]];
      if (done[ja] > k - 1) dv = std::min(dv, vals[static_cast<size_t>(k - 1) * JS + ja]);
      if (low >= dv) break;  // that option also bounds every wider b of this rank
      const double v = t + g.q[k] * p;
      vals[static_cast<size_t>(k) * JS + j] = v;
      done[j] = k + 1;
      if (v < dv) {
        const int p_at = g.pos[at];
        bm[p_at >> 6] |= uint64_t{1} << (p_at & 63);
      }
    }
  }
  st->reserve_more(g.slot.size() + 1);
  int64_t* oc = st->cost.data() + st->used();
  double* od = st->dist.data() + st->used();
  const size_t hs = st->hstart.back();
  int32_t* oh = st->hull.data() + hs;
  int64_t* hc = st->hcost.data() + hs;
  double* hd = st->hdist.data() + hs;
  double* he = st->eff.data() + hs;
  oc[0] = floor_b;  // rank 0: nothing stored, D = S
  od[0] = S;
  oh[0] = 0;
  hc[0] = floor_b;
  hd[0] = S;
  int np = 1, nh = 1;
  double best = S;
  int64_t last = floor_b;
  // The top two hull points in registers: (bx, by) = top, (ax, ay) = the one below (nh >= 2);
  // tj / aj = their chain-0 ranks (-1: not a chain-0 point, or not known). Everything here is a
  // plain local so that it stays in registers.
  double ax = 0.0, ay = 0.0, bx = static_cast<double>(floor_b), by = S;
  int tj = -1, aj = -1;
  bool rises = false;             // some slope rose (a bulk run's slopes fall by construction)
  int j = 0;                      // next chain-0 rank
  int w = 0;                      // extras: bitmap word, its remaining bits, next position
  if (!merge_extras) {  // set the extras aside (st->ex_*) and build chain 0 alone
    for (int wi = 0; wi < g.words; ++wi) {
      for (uint64_t x = bm[wi]; x; x &= x - 1) {
        const int p = (wi << 6) + __builtin_ctzll(x);
        st->ex_cost.push_back(g.cost[p]);
        st->ex_dist.push_back(vals[g.slot[p]]);
      }
      bm[wi] = 0;
    }
  }
  uint64_t bits = g.words > 0 ? bm[0] : 0;
  const int kNone = std::numeric_limits<int>::max();
  int pe = kNone;
  auto next_extra = [&bm, &w, &bits, &g, kNone]() {
    while (bits == 0 && ++w < g.words) bits = bm[w];
    if (bits == 0) return kNone;
    const int p = (w << 6) + __builtin_ctzll(bits);
    bits &= bits - 1;
    return p;
  };
  pe = next_extra();
  // Chain-0 ranks up to j_floor are all charged the floor: only their lowest D can be the step
  // there (whatever the order among equal costs), so the others are not visited.
  int j_first = -1;  // that rank, taken first
  if (g.j_floor >= 1) {
    j_first = 0;
    for (int t = 1; t <= g.j_floor; ++t) j_first = v0[t] < v0[j_first] ? t : j_first;
  }
  for (;;) {
    int64_t cst;
    double cx, v;
    int rank0;  // chain-0 rank of this point, -1 for an extra
    if (j_first >= 0) {
      cst = g.cost0[j_first], cx = g.cost0d[j_first], v = v0[j_first], rank0 = j_first;
      j_first = -1;
      j = g.j_floor + 1;
    } else if (j < L0 && g.pos0[j] < pe) {
      // Bulk: once the hull top is chain-0 point j - 1 and j turns left after it, every
      // chain-0 point up to the next extra is a step and a left turn (slopes fall from there).
      const bool prev2 = aj == j - 2 && j - 2 >= convex_from;  // that turn is already known
      if (tj == j - 1 && j - 1 >= convex_from &&
          (prev2 || nh < 2 || detail::left_turn(ax, ay, bx, by, g.cost0d[j], v0[j]))) {
        if (!prev2 && nh >= 2) rises |= e0[j - 1] > he[nh - 2];
        const int jb = pe == kNone ? L0 : g.before0[pe];
        int lnp = np, lnh = nh;
        for (int t = j; t < jb; ++t) {
          oc[lnp] = g.cost0[t];
          od[lnp] = v0[t];
          he[lnh - 1] = e0[t - 1];
          hc[lnh] = g.cost0[t];
          hd[lnh] = v0[t];
          oh[lnh++] = lnp++;
        }
        np = lnp, nh = lnh;
        ax = g.cost0d[jb - 2], ay = v0[jb - 2], bx = g.cost0d[jb - 1], by = v0[jb - 1];
        tj = jb - 1, aj = jb - 2;
        best = v0[jb - 1];
        last = g.cost0[jb - 1];
        j = jb;
        continue;
      }
      cst = g.cost0[j], cx = g.cost0d[j], v = v0[j], rank0 = j++;
    } else if (pe != kNone) {
      cst = g.cost[pe], cx = static_cast<double>(cst), v = vals[g.slot[pe]], rank0 = -1;
      pe = next_extra();
    } else {
      break;
    }
    // One step of the staircase and of the monotone-chain hull.
    if (!(v < best)) continue;
    best = v;
    if (cst == last) {  // same cost as the last step (the hull top): replace it
      --np, --nh;
      bx = ax, by = ay, tj = aj, aj = -1;
      if (nh >= 2) ax = static_cast<double>(hc[nh - 2]), ay = hd[nh - 2];
    }
    oc[np] = cst;
    od[np] = v;
    while (nh >= 2 && !detail::left_turn(ax, ay, bx, by, cx, v)) {
      --nh;
      bx = ax, by = ay, tj = aj, aj = -1;
      if (nh >= 2) ax = static_cast<double>(hc[nh - 2]), ay = hd[nh - 2];
    }
    if (nh >= 1) {  // the new segment's slope (the solver needs them non-increasing)
      const double e = (by - v) / (cx - bx);
      he[nh - 1] = e;
      rises |= nh >= 2 && e > he[nh - 2];
    }
    hc[nh] = cst;
    hd[nh] = v;
    oh[nh++] = np++;
    ax = bx, ay = by, bx = cx, by = v;
    aj = tj, tj = rank0;
    last = cst;
  }
  st->close_head(static_cast<size_t>(np), static_cast<size_t>(nh), floor_b, cap, !rises);
}

double mean_of(const std::vector<double>& v) {
  double s = 0.0;
  for (double x : v) s += x;
  return v.empty() ? 0.0 : s / static_cast<double>(v.size());
}

}  // namespace

double cobra_distortion(const std::vector<double>& lambda, int rank, int bits, const CobraModel& m) {
  const int d = static_cast<int>(lambda.size());
  if (rank < 0 || rank > d) fail("rank", "must be in [0, " + num(d) + "], got " + num(rank));
  if (bits < 0 || bits > 62) fail("bits", "must be in [0, 62], got " + num(bits));
  Prefixes pr = make_prefix(lambda);
  return pr[0].dist(rank, m.c * std::ldexp(1.0, -2 * bits));
}

RankBits cobra_c1(const std::vector<double>& lambda, int64_t budget, const CobraModel& m) {
  const int d = static_cast<int>(lambda.size());
  validate_model(m, d);
  if (budget < 0) fail("budget", "must be >= 0, got " + num(static_cast<long long>(budget)));
  Prefixes pr = make_prefix(checked_spectrum(lambda, d, "eigenvalues"));
  return c1_prefix(pr[0], d, budget, m, q_table(m));
}

int64_t cobra_total_budget(int n_heads, int head_dim, double bpd) {
  if (!std::isfinite(bpd) || bpd <= 0) fail("bpd", "must be a positive number, got " + num(bpd));
  return std::llround(static_cast<double>(n_heads) * head_dim * bpd);
}

int64_t cobra_min_head_budget(double bbar, const BudgetFloor& f) {
  if (f.abs < 0) fail("floor_abs", "must be >= 0, got " + num(static_cast<long long>(f.abs)));
  if (f.div < 1) fail("floor_div", "must be >= 1, got " + num(static_cast<long long>(f.div)));
  return std::max<int64_t>(f.abs, static_cast<int64_t>(std::floor(bbar / static_cast<double>(f.div))));
}

std::vector<int64_t> even_split(int64_t total, int n) {
  KVQ_ASSERT(n > 0);
  std::vector<int64_t> b(n, total / n);
  for (int64_t h = 0; h < total % n; ++h) ++b[h];
  return b;
}

C2Result cobra_c2_none(const std::vector<std::vector<double>>& spectra, int64_t total,
                       const CobraModel& m) {
  int d = 0;
  thread_local Prefixes pr;
  prefixes(spectra, &d, &pr);
  validate_model(m, d);
  const int n = static_cast<int>(pr.size());
  if (total < 0) fail("budget", "must be >= 0, got " + num(static_cast<long long>(total)));
  auto q = q_table(m);
  C2Result r;
  r.total_target = total;
  r.budgets = even_split(total, n);
  for (int h = 0; h < n; ++h) {
    r.choice.push_back(c1_prefix(pr[h], d, r.budgets[h], m, q));
    r.objective += r.choice.back().distortion;
    r.uniform_distortion.push_back(r.choice.back().distortion);
  }
  r.total_assigned = total;
  return r;
}

C2Result cobra_c2_damped(const std::vector<std::vector<double>>& spectra, int64_t total,
                         const CobraModel& m, const DampedOptions& opt, const BudgetFloor& floor) {
  int d = 0;
  thread_local Prefixes pr;
  prefixes(spectra, &d, &pr);
  validate_model(m, d);
  if (opt.rounds < 0) fail("rounds", "must be >= 0, got " + num(opt.rounds));
  if (!std::isfinite(opt.damping) || opt.damping < 0)
    fail("damping", "must be finite and >= 0, got " + num(opt.damping));
  const int n = static_cast<int>(pr.size());
  const double bbar = static_cast<double>(total) / n;
  const int64_t bmin = cobra_min_head_budget(bbar, floor);
  check_total(total, n, bmin);
  auto q = q_table(m);

  C2Result r;
  r.total_target = total;
  r.head_floor = bmin;
  std::vector<int64_t> b = even_split(total, n);
  r.rounds.reserve(opt.rounds);
  for (int round = 0; round < opt.rounds; ++round) {
    DampedRound st;
    st.start = b;
    st.distortion.resize(n);
    for (int h = 0; h < n; ++h) st.distortion[h] = c1_prefix(pr[h], d, b[h], m, q).distortion;
    if (round == 0) r.uniform_distortion = st.distortion;
    st.mean_distortion = mean_of(st.distortion);
    st.step.assign(n, 0);
    st.after_step.resize(n);
    for (int h = 0; h < n; ++h) {
      if (st.mean_distortion > 0) {
        double x = opt.damping * bbar * (std::sqrt(st.distortion[h] / st.mean_distortion) - 1.0);
        st.step[h] = static_cast<int64_t>(x);  // truncation toward zero, as the reference's int()
      }
      st.after_step[h] = std::max(bmin, b[h] + st.step[h]);
      st.sum_after_step += st.after_step[h];
    }
    st.after_renorm.resize(n);
    for (int h = 0; h < n; ++h) {
      // Exact integer floor of after_step * total / sum (the reference computes it in floats).
      int64_t v = st.sum_after_step > 0 ? st.after_step[h] * total / st.sum_after_step : st.after_step[h];
      st.after_renorm[h] = std::max(bmin, v);
    }
    b = st.after_renorm;
    r.rounds.push_back(std::move(st));
  }
  r.budgets = b;
  for (int h = 0; h < n; ++h) {
    r.choice.push_back(c1_prefix(pr[h], d, b[h], m, q));
    r.objective += r.choice.back().distortion;
    r.total_assigned += b[h];
  }
  if (opt.rounds == 0) r.uniform_distortion = [&] {
    std::vector<double> u;
    for (const auto& c : r.choice) u.push_back(c.distortion);
    return u;
  }();
  return r;
}

C2Result cobra_c2_exact(const std::vector<std::vector<double>>& spectra, int64_t total,
                        const CobraModel& m, const BudgetFloor& floor, int64_t head_max) {
  int d = 0;
  thread_local Prefixes pr;
  prefixes(spectra, &d, &pr);
  validate_model(m, d);
  if (m.rounding != C1Rounding::kFloor)
    fail("c1_rounding", "exact C2 needs 'floor': with 'round' a head may spend more than its "
                        "budget, so D*(B) is not a budget curve");
  const int n = static_cast<int>(pr.size());
  const double bbar = static_cast<double>(total) / n;
  const int64_t bmin = cobra_min_head_budget(bbar, floor);
  const int64_t bmax = head_max > 0 ? head_max : static_cast<int64_t>(d) * m.b_max;
  if (bmax < bmin)
    fail("head_max", num(static_cast<long long>(bmax)) + " is below the per-head floor " +
                         num(static_cast<long long>(bmin)));
  check_total(total, n, bmin);
  auto q = q_table(m);
  // The grid depends only on (d, model, floor, cap): reuse it across calls (per thread).
  thread_local std::unique_ptr<ModelGrid> cached;
  thread_local std::tuple<int, int, int, int, int, double, int64_t, int64_t> cached_key;
  const auto key = std::make_tuple(d, m.r_min, m.r_step, m.b_min, m.b_max, m.c, bmin, bmax);
  if (!cached || cached_key != key) {
    cached = std::make_unique<ModelGrid>(d, m, q, bmin, bmax);
    cached_key = key;
  }
  const ModelGrid& grid = *cached;
  // Kept across calls (per thread): the 8B/70B panels would otherwise land on fresh pages.
  thread_local detail::Stairs curves;
  thread_local StairScratch scratch;
  thread_local detail::SolveInfo info;
  thread_local std::vector<char> full;  // per head: the extras are merged into its staircase
  scratch.fit(grid);
  // Low budgets (the mean head budget within the first half of chain 0): the extras (options
  // above chain 0, at the heavy end) are set aside and the problem is solved on chain 0 alone;
  // then, with that solve's multiplier mu, every extra o of head h is shown useless:
  //   rc(o) = D_o + mu c_o - m_h > U - LB + tol,
  // m_h and LB over all options (extras included), U = the restricted optimum. Any solution
  // better than U would use only options with rc < U - LB (see solve_stairs), so no extra, so it
  // would be a solution of the restricted problem: there is none. Heads where that fails get
  // their extras back and the problem is solved again.
  const bool lazy = grid.len[0] > 0 && 2 * total <= static_cast<int64_t>(n) * grid.cost0.back();
  full.assign(n, !lazy);
  C2Result r;
  r.total_target = total;
  r.head_floor = bmin;
  for (;;) {
    curves.clear();
    curves.has_hull = true;
    curves.has_seg = true;
    for (int h = 0; h < n; ++h) model_stairs(pr[h], grid, bmin, bmax, full[h], &scratch, &curves);
    r.exact = detail::solve_stairs(curves, total, &info);
    if (curves.ex_cost.empty()) break;
    const double mu = info.mu;
    double lb = -mu * static_cast<double>(total), m_abs = 0.0;
    for (int h = 0; h < n; ++h) {
      double mh = info.m[h];
      for (size_t o = curves.ex_start[h]; o < curves.ex_start[h + 1]; ++o)
        mh = std::min(mh, curves.ex_dist[o] + mu * static_cast<double>(curves.ex_cost[o]));
      info.m[h] = mh;
      lb += mh;
      m_abs += std::fabs(mh);
    }
    const double ub = r.exact.objective;
    const double tol = detail::rounding_tol(n, std::fabs(ub) + m_abs + mu * static_cast<double>(total));
    bool again = false;
    for (int h = 0; h < n; ++h)
      for (size_t o = curves.ex_start[h]; o < curves.ex_start[h + 1]; ++o)
        if (curves.ex_dist[o] + mu * static_cast<double>(curves.ex_cost[o]) - info.m[h] <=
            ub - lb + tol) {
          full[h] = 1;
          again = true;
          break;
        }
    if (!again) {
      r.exact.lower_bound = std::min(r.exact.lower_bound, lb);  // a bound for the full problem
      break;
    }
  }
  // D*_h(B) over all of the head's options: its staircase, and the extras set aside.
  auto dstar = [&](int h, int64_t budget) {
    double v = curves.value(h, budget);
    for (size_t o = curves.ex_start[h]; o < curves.ex_start[h + 1]; ++o)
      if (curves.ex_cost[o] <= budget) v = std::min(v, curves.ex_dist[o]);
    return v;
  };
  r.budgets = r.exact.budgets;
  r.choice.reserve(n);
  r.uniform_distortion.reserve(n);
  const std::vector<int64_t> even = even_split(total, n);
  for (int h = 0; h < n; ++h) {
    // C1 at the final budget sees every option the solver's point came from (and the slack
    // cannot buy better: the split is optimal), so its D equals the solver's.
    RankBits rb;
    if (!c1_at_target(pr[h], d, r.budgets[h], m, q, dstar(h, r.budgets[h]), &rb))
      rb = c1_prefix(pr[h], d, r.budgets[h], m, q);
    r.choice.push_back(rb);
    KVQ_ASSERT(r.choice.back().distortion <= curves.dist_of(h)[r.exact.point[h]]);
    r.objective += r.choice.back().distortion;
    r.total_assigned += r.budgets[h];
    r.uniform_distortion.push_back(dstar(h, std::min(even[h], bmax)));
  }
  return r;
}

void validate_measured(const MeasuredTable& t, int d, const std::string& field) {
  if (t.b_min < 1 || t.b_max < t.b_min || t.b_max > 16)
    fail(field, "bit range [" + num(t.b_min) + ", " + num(t.b_max) + "] is not within [1, 16]");
  if (t.ranks.empty()) fail(field, "no ranks");
  for (size_t i = 0; i < t.ranks.size(); ++i) {
    if (t.ranks[i] < 1 || t.ranks[i] > d)
      fail(field, "rank " + num(t.ranks[i]) + " outside [1, " + num(d) + "]");
    if (i > 0 && t.ranks[i] <= t.ranks[i - 1]) fail(field, "ranks not strictly ascending");
  }
  const size_t want = t.ranks.size() * static_cast<size_t>(t.b_max - t.b_min + 1);
  if (t.mse.size() != want)
    fail(field, "mse has " + num(static_cast<long long>(t.mse.size())) + " entries, expected " +
                    num(static_cast<long long>(want)) + " (ranks x widths)");
  for (size_t i = 0; i < t.mse.size(); ++i)
    if (!std::isfinite(t.mse[i]) || t.mse[i] < 0)
      fail(field, "mse entry " + num(static_cast<long long>(i)) + " must be finite and >= 0, got " +
                      num(t.mse[i]));
  if (!std::isnan(t.rank0_mse) && (!std::isfinite(t.rank0_mse) || t.rank0_mse < 0))
    fail(field, "rank0_mse must be finite and >= 0 (or NaN = not an option), got " + num(t.rank0_mse));
}

C2Result cobra_c2_exact_measured(const std::vector<MeasuredTable>& tables, int d, int64_t total,
                                 const BudgetFloor& floor, int64_t head_max) {
  if (tables.empty()) fail("tables", "no heads");
  if (d <= 0) fail("head_dim", "must be positive, got " + num(d));
  const int n = static_cast<int>(tables.size());
  const double bbar = static_cast<double>(total) / n;
  const int64_t bmin = cobra_min_head_budget(bbar, floor);
  check_total(total, n, bmin);
  std::vector<HeadCurve> curves;
  curves.reserve(n);
  for (int h = 0; h < n; ++h) {
    const MeasuredTable& t = tables[h];
    const std::string field = "tables[" + num(h) + "]";
    validate_measured(t, d, field);
    const int64_t bmax = head_max > 0 ? head_max : static_cast<int64_t>(d) * t.b_max;
    if (bmax < bmin)
      fail("head_max", num(static_cast<long long>(bmax)) + " is below the per-head floor " +
                           num(static_cast<long long>(bmin)));
    std::vector<CurveOption> opts;
    const int nb = t.b_max - t.b_min + 1;
    if (std::isfinite(t.rank0_mse)) opts.push_back({0, 0, t.rank0_mse});
    for (size_t i = 0; i < t.ranks.size(); ++i)
      for (int b = t.b_min; b <= t.b_max; ++b)
        opts.push_back({t.ranks[i], b, t.mse[i * nb + (b - t.b_min)]});
    curves.push_back(make_curve(opts, bmin, bmax));
  }
  C2Result r;
  r.total_target = total;
  r.head_floor = bmin;
  r.exact = solve_exact_budget(curves, total);
  r.budgets = r.exact.budgets;
  const std::vector<int64_t> even = even_split(total, n);
  for (int h = 0; h < n; ++h) {
    const CurvePoint& p = curves[h].points[r.exact.point[h]];
    r.choice.push_back({p.rank, p.bits, p.distortion});
    r.objective += p.distortion;
    r.total_assigned += r.budgets[h];
    r.uniform_distortion.push_back(curve_value(curves[h], std::min(even[h], curves[h].b_max)));
  }
  return r;
}

KlOrder kl_reorder(const std::vector<double>& lambda, const std::vector<double>& qv) {
  if (qv.size() != lambda.size())
    fail("query_variance", "expected " + num(static_cast<long long>(lambda.size())) +
                               " values (one per eigen-direction), got " +
                               num(static_cast<long long>(qv.size())));
  const int d = static_cast<int>(lambda.size());
  KlOrder o;
  std::vector<double> w(d);
  for (int i = 0; i < d; ++i) {
    if (!std::isfinite(qv[i]) || qv[i] < 0)
      fail("query_variance", "value " + num(i) + " must be finite and >= 0, got " + num(qv[i]));
    if (!std::isfinite(lambda[i]) || lambda[i] < 0)
      fail("eigenvalues", "value " + num(i) + " must be finite and >= 0, got " + num(lambda[i]));
    w[i] = qv[i] * lambda[i];
  }
  o.perm.resize(d);
  std::iota(o.perm.begin(), o.perm.end(), 0);
  std::stable_sort(o.perm.begin(), o.perm.end(), [&](int a, int b) { return w[a] > w[b]; });
  o.weights.resize(d);
  for (int j = 0; j < d; ++j) o.weights[j] = w[o.perm[j]];
  return o;
}

std::vector<double> query_variance_along(const Eigen::MatrixXd& sigma_q, const Eigen::MatrixXd& u) {
  if (sigma_q.rows() != sigma_q.cols() || sigma_q.rows() != u.rows())
    fail("sigma_q", "shape " + num(static_cast<long long>(sigma_q.rows())) + "x" +
                        num(static_cast<long long>(sigma_q.cols())) + " does not match basis rows " +
                        num(static_cast<long long>(u.rows())));
  Eigen::VectorXd v = (u.transpose() * sigma_q * u).diagonal();
  return std::vector<double>(v.data(), v.data() + v.size());
}

// ---------------------------------------------------------------------------------------------
// Whole-model allocation.

namespace {

std::string head_field(const char* what, const Shape& s, int index, const char* side = nullptr) {
  std::string f = std::string(what) + "[";
  if (side) f += std::string(side) + " ";
  return f + "layer " + num(s.layer_of(index)) + ", head " + num(s.head_of(index)) + "]";
}

// Spectra (possibly KL-reordered) and the permutation each head's basis follows.
void prepare(const Shape& shape, const std::vector<CobraHeadInput>& heads, bool kl,
             const char* side_name, std::vector<std::vector<double>>* spectra,
             std::vector<std::vector<int>>* perms) {
  const int n = shape.n_heads(), d = shape.head_dim;
  if (static_cast<int>(heads.size()) != n)
    fail(side_name, "expected " + num(n) + " heads (layers x kv heads), got " +
                        num(static_cast<long long>(heads.size())));
  for (int i = 0; i < n; ++i) {
    std::vector<double> lam =
        checked_spectrum(heads[i].eigenvalues, d, head_field("eigenvalues", shape, i, side_name));
    std::vector<int> perm(d);
    std::iota(perm.begin(), perm.end(), 0);
    if (kl) {
      if (heads[i].query_variance.empty())
        fail(head_field("query_variance", shape, i, side_name), "required when KL reordering is on");
      KlOrder o = kl_reorder(lam, heads[i].query_variance);
      lam = o.weights;
      perm = o.perm;
    }
    const auto& u = heads[i].eigenvectors;
    if (u.size() != 0 && (u.rows() != d || u.cols() != d))
      fail(head_field("eigenvectors", shape, i, side_name),
           "expected " + num(d) + "x" + num(d) + ", got " + num(static_cast<long long>(u.rows())) +
               "x" + num(static_cast<long long>(u.cols())));
    const auto& mu = heads[i].mean;
    if (mu.size() != 0 && mu.size() != d)
      fail(head_field("mean", shape, i, side_name),
           "expected " + num(d) + " values, got " + num(static_cast<long long>(mu.size())));
    spectra->push_back(std::move(lam));
    perms->push_back(std::move(perm));
  }
}

HeadDecision lowrank_decision(const Shape& shape, int index, Side side, int64_t budget,
                              const RankBits& rb, const CobraHeadInput* in,
                              const std::vector<int>* perm, uint64_t seed) {
  const int d = shape.head_dim;
  HeadDecision h;
  h.layer = shape.layer_of(index);
  h.kv_head = shape.head_of(index);
  h.side = side;
  h.kind = CodingKind::kLowRankHadamard;
  h.post_rope = false;
  h.rank = rb.rank;
  h.bits = rb.bits;
  h.budget_bits = static_cast<int>(budget);
  h.predicted_distortion = rb.distortion;
  h.hadamard_seed = derive_seed(seed, h.layer, h.kv_head, side, 0);
  if (in && in->eigenvectors.size() != 0) {
    h.basis.resize(static_cast<size_t>(d) * rb.rank);
    for (int i = 0; i < d; ++i)
      for (int j = 0; j < rb.rank; ++j)
        h.basis[static_cast<size_t>(i) * rb.rank + j] =
            static_cast<float>(in->eigenvectors(i, perm ? (*perm)[j] : j));
  }
  if (in && in->mean.size() != 0) {
    h.mean.resize(d);
    for (int i = 0; i < d; ++i) h.mean[i] = static_cast<float>(in->mean(i));
  }
  return h;
}

void fill_summary(const C2Result& r, const std::vector<HeadDecision>& heads, Method method,
                  double bpd, int d, const CobraOptions& opt, AllocSummary* s) {
  s->method = method;
  s->nominal_bpd = bpd;
  s->budget_total = r.total_target;
  s->budget_assigned = r.total_assigned;
  s->has_prediction = true;
  s->predicted_distortion = r.objective;
  std::vector<double> after;
  for (const auto& c : r.choice) after.push_back(c.distortion);
  s->distortion_std_before = population_std(r.uniform_distortion);
  s->distortion_std_after = population_std(after);
  for (const auto& h : heads) {
    int64_t over = static_cast<int64_t>(h.rank) * h.bits - h.budget_bits;
    if (over > 0) {
      ++s->heads_over_budget;
      s->bits_over_budget += over;
    }
  }
  summarize_bits(heads, d, opt.overhead, s);
  const CobraModel& m = opt.model;
  s->params = {{"c", num(m.c)},
               {"r_min", num(m.r_min)},
               {"r_step", num(m.r_step)},
               {"b_min", num(m.b_min)},
               {"b_max", num(m.b_max)},
               {"c1_rounding", to_string(m.rounding)},
               {"c2", to_string(opt.c2)},
               {"rounds", num(opt.damped.rounds)},
               {"damping", num(opt.damped.damping)},
               {"floor_abs", num(static_cast<long long>(opt.floor.abs))},
               {"floor_div", num(static_cast<long long>(opt.floor.div))},
               {"head_floor", num(static_cast<long long>(r.head_floor))},
               {"head_max", num(static_cast<long long>(opt.head_max))},
               {"kl", opt.kl ? "1" : "0"},
               {"budget_rule", "llround(heads * d * bpd)"},
               {"seed", num(static_cast<unsigned long long>(opt.seed))}};
}

}  // namespace

Allocation allocate_cobra(const Shape& shape, Side side, const std::vector<CobraHeadInput>& heads,
                          double bpd, const CobraOptions& opt) {
  validate_shape(shape);
  validate_model(opt.model, shape.head_dim);
  check_bpd(bpd, opt.model);
  std::vector<std::vector<double>> spectra;
  std::vector<std::vector<int>> perms;
  prepare(shape, heads, opt.kl, side == Side::kK ? "K" : "V", &spectra, &perms);
  const int64_t total = cobra_total_budget(shape.n_heads(), shape.head_dim, bpd);
  C2Result r;
  switch (opt.c2) {
    case C2Kind::kNone: r = cobra_c2_none(spectra, total, opt.model); break;
    case C2Kind::kDamped: r = cobra_c2_damped(spectra, total, opt.model, opt.damped, opt.floor); break;
    case C2Kind::kExact: r = cobra_c2_exact(spectra, total, opt.model, opt.floor, opt.head_max); break;
    default: fail("c2", "unknown value " + num(static_cast<int>(opt.c2)));
  }
  Allocation out;
  for (int i = 0; i < shape.n_heads(); ++i)
    out.heads.push_back(
        lowrank_decision(shape, i, side, r.budgets[i], r.choice[i], &heads[i], &perms[i], opt.seed));
  Method method = opt.c2 == C2Kind::kExact ? Method::kCobraDp
                  : opt.kl                 ? Method::kCobraKl
                                           : Method::kCobraMse;
  fill_summary(r, out.heads, method, bpd, shape.head_dim, opt, &out.summary);
  return out;
}

Allocation allocate_cobra_joint(const Shape& shape, const std::vector<CobraHeadInput>& k_heads,
                                const std::vector<CobraHeadInput>& v_heads, double bpd,
                                const CobraOptions& opt) {
  validate_shape(shape);
  validate_model(opt.model, shape.head_dim);
  check_bpd(bpd, opt.model);
  if (opt.c2 != C2Kind::kExact)
    fail("c2", "joint K/V needs the exact solver, got '" + std::string(to_string(opt.c2)) + "'");
  std::vector<std::vector<double>> spectra;
  std::vector<std::vector<int>> perms;
  prepare(shape, k_heads, opt.kl, "K", &spectra, &perms);
  // KL weights come from queries against keys; V keeps its MSE order.
  prepare(shape, v_heads, false, "V", &spectra, &perms);
  const int n = shape.n_heads();
  const int64_t total = cobra_total_budget(2 * n, shape.head_dim, bpd);
  C2Result r = cobra_c2_exact(spectra, total, opt.model, opt.floor, opt.head_max);
  Allocation out;
  for (int i = 0; i < 2 * n; ++i) {
    const bool is_k = i < n;
    const int idx = is_k ? i : i - n;
    out.heads.push_back(lowrank_decision(shape, idx, is_k ? Side::kK : Side::kV, r.budgets[i],
                                         r.choice[i], is_k ? &k_heads[idx] : &v_heads[idx],
                                         &perms[i], opt.seed));
  }
  fill_summary(r, out.heads, Method::kCobraDp, bpd, shape.head_dim, opt, &out.summary);
  out.summary.params.push_back({"joint_kv", "1"});
  return out;
}

Allocation allocate_cobra_measured(const Shape& shape, Side side,
                                   const std::vector<MeasuredTable>& tables,
                                   const std::vector<CobraHeadInput>& heads, double bpd,
                                   const CobraOptions& opt) {
  validate_shape(shape);
  const int n = shape.n_heads(), d = shape.head_dim;
  if (static_cast<int>(tables.size()) != n)
    fail("tables", "expected " + num(n) + " heads, got " + num(static_cast<long long>(tables.size())));
  if (!heads.empty() && static_cast<int>(heads.size()) != n)
    fail("heads", "expected " + num(n) + " heads (or none), got " +
                      num(static_cast<long long>(heads.size())));
  if (!std::isfinite(bpd) || bpd <= 0) fail("bpd", "must be a positive number, got " + num(bpd));
  for (int i = 0; i < n; ++i) {
    if (bpd > tables[i].b_max)
      fail("bpd", num(bpd) + " is above the table's b_max=" + num(tables[i].b_max));
    if (heads.empty()) continue;
    const auto& u = heads[i].eigenvectors;
    if (u.size() != 0 && (u.rows() != d || u.cols() != d))
      fail(head_field("eigenvectors", shape, i), "expected " + num(d) + "x" + num(d));
    if (heads[i].mean.size() != 0 && heads[i].mean.size() != d)
      fail(head_field("mean", shape, i), "expected " + num(d) + " values");
  }
  const int64_t total = cobra_total_budget(n, d, bpd);
  C2Result r = cobra_c2_exact_measured(tables, d, total, opt.floor, opt.head_max);
  Allocation out;
  for (int i = 0; i < n; ++i)
    out.heads.push_back(lowrank_decision(shape, i, side, r.budgets[i], r.choice[i],
                                         heads.empty() ? nullptr : &heads[i], nullptr, opt.seed));
  CobraOptions rec = opt;
  rec.c2 = C2Kind::kExact;
  rec.kl = false;
  fill_summary(r, out.heads, Method::kCobraMeasured, bpd, d, rec, &out.summary);
  out.summary.params.push_back({"distortion", "measured"});
  return out;
}

}  // namespace kvq::alloc
