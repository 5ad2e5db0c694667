// KV-COBRA C1: prefix sums of the spectra and the per-head rank/bit choice on them.
#include <algorithm>
#include <cmath>
#include <limits>

#include "cobra_internal.hpp"
#include "internal.hpp"
#include "kvq/alloc/cobra.hpp"

namespace kvq::alloc {

using detail::c1_prefix;
using detail::fail;
using detail::make_prefix;
using detail::num;
using detail::Prefixes;
using detail::q_table;

namespace detail {

namespace {

int64_t round_half_even(int64_t num_, int64_t den) {
  int64_t q = num_ / den, rem = num_ % den;
  if (2 * rem > den || (2 * rem == den && (q & 1))) ++q;
  return q;
}

}  // namespace

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

namespace {

// numpy's pairwise_sum (loops_utils.h): below 8 values a plain loop; up to 128, eight running
// sums over strides of 8 combined as ((0+1)+(2+3))+((4+5)+(6+7)), then the leftovers one by one;
// above 128, the two halves (the first a multiple of 8 long) summed separately and added.
double pairwise(const double* a, int64_t n) {
  if (n < 8) {
    double s = 0.0;
    for (int64_t i = 0; i < n; ++i) s += a[i];
    return s;
  }
  if (n <= 128) {
    double r[8];
    for (int j = 0; j < 8; ++j) r[j] = a[j];
    int64_t i = 8;
    for (; i < n - (n % 8); i += 8)
      for (int j = 0; j < 8; ++j) r[j] += a[i + j];
    double s = ((r[0] + r[1]) + (r[2] + r[3])) + ((r[4] + r[5]) + (r[6] + r[7]));
    for (; i < n; ++i) s += a[i];
    return s;
  }
  int64_t n2 = n / 2;
  n2 -= n2 % 8;
  return pairwise(a, n2) + pairwise(a + n2, n - n2);
}

// a + b * c with two roundings, as numpy computes it: the volatile keeps a compiler allowed to
// contract (-ffp-contract=fast with FMA enabled) from fusing them.
double add_product(double a, double b, double c) {
  volatile double p = b * c;
  return a + p;
}

}  // namespace

double numpy_sum(const double* a, int64_t n) { return 0.0 + pairwise(a, n); }

// The reference's optimal_rank_bits followed by the clip and rank re-derivation its callers
// (water_filling_budgets, _rank_bit_configs) apply to the result:
//  a. spectrum sum (numpy) < 1e-30: r = max(r_min, B div b_min), b = max(b_min, B div max(r, 1));
//  b. otherwise ranks r_min, r_min + r_step, ... <= r_max = min(d, max(r_min, B div b_min)), or
//     just r_min when that range is empty; b = B div r (floor) or Python's round(B / r) (half to
//     even); b < b_min skipped, then b capped at b_max; D = sum(lam[r:]) + q(b) sum(lam[:r]),
//     the tail 0 at r = d; a strictly smaller D replaces the best; the start is (first rank,
//     b_min), kept if no rank is feasible;
//  c. b clamped to [b_min, b_max], r = max(r_min, min(d, B div b)) (may be odd, may differ from
//     b.'s rank), and D recomputed at that (r, b) the same way.
RankBits c1_reference(const double* lam, int d, int64_t budget, const CobraModel& m,
                      const std::vector<double>& q) {
  const int64_t B = budget;
  // Python's // on the non-negative values here; a negative budget (not reachable from the
  // damped C2, whose floor is >= 0) floors toward -inf like Python.
  auto fdiv = [](int64_t a, int64_t b) {
    int64_t t = a / b;
    return (a % b != 0 && ((a < 0) != (b < 0))) ? t - 1 : t;
  };
  auto dist = [&](int64_t r, int b) {
    const double tail = r < d ? numpy_sum(lam + r, d - r) : 0.0;
    return add_product(tail, q[b], numpy_sum(lam, r));
  };
  int64_t r = 0, b = 0;
  if (numpy_sum(lam, d) < 1e-30) {
    r = std::max<int64_t>(m.r_min, fdiv(B, std::max(m.b_min, 1)));
    b = std::max<int64_t>(m.b_min, fdiv(B, std::max<int64_t>(r, 1)));
  } else {
    const int64_t r_max = std::min<int64_t>(d, std::max<int64_t>(m.r_min, fdiv(B, m.b_min)));
    const int64_t r_first = m.r_min;  // the range is never empty here: r_min <= d, r_min <= r_max
    r = r_first;
    b = m.b_min;
    double best = std::numeric_limits<double>::infinity();
    for (int64_t rr = r_first; rr <= r_max; rr += m.r_step) {
      int64_t bb = m.rounding == C1Rounding::kFloor
                       ? fdiv(B, rr)
                       : static_cast<int64_t>(std::nearbyint(static_cast<double>(B) /
                                                             static_cast<double>(rr)));
      if (bb < m.b_min) continue;
      bb = std::min<int64_t>(bb, m.b_max);
      const double D = dist(rr, static_cast<int>(bb));
      if (D < best) best = D, r = rr, b = bb;
    }
  }
  b = std::max<int64_t>(m.b_min, std::min<int64_t>(m.b_max, b));
  r = std::max<int64_t>(m.r_min, std::min<int64_t>(d, fdiv(B, b)));
  return {static_cast<int>(r), static_cast<int>(b), dist(r, static_cast<int>(b))};
}

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

}  // namespace detail

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

RankBits cobra_c1_reference(const std::vector<double>& lambda, int64_t budget, const CobraModel& m) {
  const int d = static_cast<int>(lambda.size());
  validate_model(m, d);
  const std::vector<double> lam = checked_spectrum(lambda, d, "eigenvalues");
  return detail::c1_reference(lam.data(), d, budget, m, q_table(m));
}

}  // namespace kvq::alloc
