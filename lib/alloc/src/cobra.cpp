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

void check_bpd(double bpd, const CobraModel& m) {
  if (!std::isfinite(bpd) || bpd <= 0) fail("bpd", "must be a positive number, got " + num(bpd));
  if (bpd > m.b_max)
    fail("bpd", num(bpd) + " is above b_max=" + num(m.b_max) + " (no head can use it)");
}

Prefixes prefixes(const std::vector<std::vector<double>>& spectra, int* d) {
  if (spectra.empty()) fail("spectra", "no heads");
  *d = static_cast<int>(spectra[0].size());
  Prefixes out;
  out.d = *d;
  out.data.resize(spectra.size() * (*d + 1));
  for (size_t h = 0; h < spectra.size(); ++h) {
    const auto& lam = spectra[h];
    double* p = out.data.data() + h * (*d + 1);
    p[0] = 0.0;
    bool ok = static_cast<int>(lam.size()) == *d;
    // Fast path: finite, non-negative, descending; anything else goes through checked_spectrum
    // for the clamping of eigen-solver noise or the error message.
    for (int i = 0; ok && i < *d; ++i) {
      ok = std::isfinite(lam[i]) && lam[i] >= 0 && (i == 0 || lam[i] <= lam[i - 1]);
      p[i + 1] = p[i] + lam[i];
    }
    if (!ok) {
      std::vector<double> c =
          checked_spectrum(lam, *d, "spectra[" + num(static_cast<long long>(h)) + "]");
      for (int i = 0; i < *d; ++i) p[i + 1] = p[i] + c[i];
    }
  }
  return out;
}

void check_total(int64_t total, int n, int64_t floor_b) {
  if (total < static_cast<int64_t>(n) * floor_b)
    fail("bpd", "budget too small: " + num(static_cast<long long>(total)) + " bits over " +
                    num(n) + " heads is below the per-head floor B_min=" +
                    num(static_cast<long long>(floor_b)));
}

// All (r, b) options of the model grid no heavier than the head cap, lightest first (weight, then
// rank asc, bits desc: the staircase tie rule), with the cost each is charged (max(weight,
// b_min)). Shared by every head: weights do not depend on the spectrum.
struct ModelGrid {
  std::vector<int32_t> rank;
  std::vector<double> q;  // q(b) per option
  std::vector<int64_t> cost;
  std::vector<int32_t> bits;
  ModelGrid(int d, const CobraModel& m, const std::vector<double>& q, int64_t b_min, int64_t b_max) {
    struct Item {
      int64_t weight;
      int r, b;
    };
    std::vector<Item> items;
    for (int r = m.r_min; r <= d; r += m.r_step)
      for (int b = m.b_min; b <= m.b_max; ++b)
        if (int64_t{r} * b <= b_max) items.push_back({int64_t{r} * b, r, b});
    std::sort(items.begin(), items.end(), [](const Item& a, const Item& b) {
      if (a.weight != b.weight) return a.weight < b.weight;
      if (a.r != b.r) return a.r < b.r;
      return a.b > b.b;
    });
    for (const auto& it : items) {
      rank.push_back(it.r);
      bits.push_back(it.b);
      this->q.push_back(q[it.b]);
      cost.push_back(std::max(it.weight, b_min));
    }
  }
};

// The staircase of D*(B) = min over grid options with r b <= B (plus rank 0 = S), charged
// max(r b, b_min). Same result as make_curve() on the same options, in one pass: an option is a
// new step when it beats everything lighter; one that beats a step of its own cost replaces it
// (the first minimum of a cost group wins ties, as in make_curve).
void model_curve(const Prefix& pr, const ModelGrid& g, int64_t b_min, int64_t b_max,
                 detail::FlatCurves* fc) {
  const size_t n = g.rank.size();
  // Steps as (value, option index); option -1 = rank 0. n + 1 steps worst case, plus a sink.
  struct Step {
    double v;
    int64_t j;
  };
  thread_local std::vector<Step> scratch;
  if (scratch.size() < n + 2) scratch.resize(n + 2);
  Step* out = scratch.data();
  const double S = pr.total();
  const double* P = pr.p;
  const int32_t* rank = g.rank.data();
  const int64_t* cost = g.cost.data();
  const double* q = g.q.data();
  out[0] = {S, -1};
  size_t k = 1;
  int64_t last_cost = b_min;
  double best = S;
  // Branch-free: whether an option improves on everything lighter is data-dependent and would
  // mispredict; every option is written, non-improving ones to the sink slot n + 1.
  for (size_t j = 0; j < n; ++j) {
    // (S - P) + q P, written to match Prefix::dist bit for bit.
    const double pr_r = P[rank[j]];
    const double v = (S - pr_r) + q[j] * pr_r;
    const bool improves = v < best;
    best = improves ? v : best;
    const size_t slot = k - (last_cost == cost[j]);  // same cost as the last step: replace it
    out[improves ? slot : n + 1] = {v, static_cast<int64_t>(j)};
    k = improves ? slot + 1 : k;
    last_cost = improves ? cost[j] : last_cost;
  }
  for (size_t i = 0; i < k; ++i) {
    const int64_t j = out[i].j;
    fc->pts.push_back(j < 0 ? CurvePoint{b_min, S, 0, 0}
                            : CurvePoint{cost[j], out[i].v, rank[j], g.bits[j]});
  }
  fc->close_head(b_min, b_max);
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
  Prefixes pr = prefixes(spectra, &d);
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
  Prefixes pr = prefixes(spectra, &d);
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
  Prefixes pr = prefixes(spectra, &d);
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
  thread_local detail::FlatCurves curves;
  curves.clear();
  for (int h = 0; h < n; ++h) model_curve(pr[h], grid, bmin, bmax, &curves);

  C2Result r;
  r.total_target = total;
  r.head_floor = bmin;
  r.exact = detail::solve_flat(curves, total);
  r.budgets = r.exact.budgets;
  const std::vector<int64_t> even = even_split(total, n);
  for (int h = 0; h < n; ++h) {
    // C1 at the final budget sees every option the solver's point came from (and the slack
    // cannot buy better: the split is optimal), so its D equals the solver's.
    r.choice.push_back(c1_prefix(pr[h], d, r.budgets[h], m, q));
    KVQ_ASSERT(r.choice.back().distortion <= curves.of(h)[r.exact.point[h]].distortion);
    r.objective += r.choice.back().distortion;
    r.total_assigned += r.budgets[h];
    r.uniform_distortion.push_back(curves.value(h, std::min(even[h], bmax)));
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
