// KV-COBRA C2, the cross-head budget split over the model's D(r, b): none (the even split),
// damped (the proportional update) and exact (the integer optimum, on staircases built by
// cobra_stairs.cpp and solved by the exact solver).
#include <algorithm>
#include <cmath>
#include <memory>
#include <tuple>

#include "cobra_internal.hpp"
#include "internal.hpp"
#include "kvq/alloc/cobra.hpp"

namespace kvq::alloc {

using detail::c1_at_target;
using detail::c1_prefix;
using detail::check_total;
using detail::fail;
using detail::ModelGrid;
using detail::model_stairs;
using detail::num;
using detail::prefixes;
using detail::Prefixes;
using detail::q_table;
using detail::StairScratch;

namespace {

double mean_of(const std::vector<double>& v) {
  double s = 0.0;
  for (double x : v) s += x;
  return v.empty() ? 0.0 : s / static_cast<double>(v.size());
}

}  // namespace

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
  const int64_t budget_floor = cobra_min_head_budget(bbar, floor);
  check_total(total, n, budget_floor);
  auto q = q_table(m);

  C2Result r;
  r.total_target = total;
  r.head_floor = budget_floor;
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
      st.after_step[h] = std::max(budget_floor, b[h] + st.step[h]);
      st.sum_after_step += st.after_step[h];
    }
    st.after_renorm.resize(n);
    for (int h = 0; h < n; ++h) {
      // Exact integer floor of after_step * total / sum (the reference computes it in floats).
      int64_t v = st.sum_after_step > 0 ? st.after_step[h] * total / st.sum_after_step : st.after_step[h];
      st.after_renorm[h] = std::max(budget_floor, v);
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

// The reference's water_filling_budgets, in order (kvq's damped C2 above differs at the marked
// points):
//  1. Every head starts at Bbar = the integer per-head budget (kvq: an even split of
//     llround(n d bpd)); total = Bbar * n; floor B_min = max(floor_abs, Bbar div floor_div).
//  2. Each of `rounds` rounds, heads in order (layer-major, as the reference's dict):
//     a. D_h = D at the head's reference choice (C1, then b clipped, r = max(r_min, min(d,
//        B_h div b))): the re-derived rank, not C1's own (kvq: C1's D*).
//     b. mean = max(numpy mean of D, 1e-30) (kvq: no step when the mean is 0).
//     c. step_h = trunc((Bbar * (sqrt(D_h / mean) - 1)) * damping), multiplied in that order
//        (kvq: damping * Bbar first); B_h = max(B_min, B_h + step_h).
//     d. current = sum B_h; if current > 0, B_h = max(B_min, trunc(B_h * total / current)) with
//        the product an exact integer and the quotient one double division.
//  3. The final heads: the reference choice (2a's rule) at the final B_h.
C2Result cobra_c2_reference(const std::vector<std::vector<double>>& spectra, int64_t head_budget,
                            const CobraModel& m, const DampedOptions& opt, const BudgetFloor& floor) {
  if (spectra.empty()) fail("spectra", "no heads");
  const int d = static_cast<int>(spectra[0].size());
  validate_model(m, d);
  if (opt.rounds < 0) fail("rounds", "must be >= 0, got " + num(opt.rounds));
  if (!std::isfinite(opt.damping) || opt.damping < 0)
    fail("damping", "must be finite and >= 0, got " + num(opt.damping));
  if (head_budget < 0)
    fail("budget", "per-head budget must be >= 0, got " + num(static_cast<long long>(head_budget)));
  if (floor.abs < 0) fail("floor_abs", "must be >= 0, got " + num(static_cast<long long>(floor.abs)));
  if (floor.div < 1) fail("floor_div", "must be >= 1, got " + num(static_cast<long long>(floor.div)));
  const int n = static_cast<int>(spectra.size());
  std::vector<std::vector<double>> lam(n);
  for (int h = 0; h < n; ++h)
    lam[h] = checked_spectrum(spectra[h], d, "spectra[" + num(h) + "]");
  const auto q = q_table(m);
  const int64_t bbar = head_budget;
  const int64_t total = bbar * n;
  const int64_t budget_floor = std::max(floor.abs, bbar / floor.div);
  C2Result r;
  r.total_target = total;
  r.head_floor = budget_floor;
  std::vector<int64_t> b(n, bbar);
  r.rounds.reserve(opt.rounds);
  for (int round = 0; round < opt.rounds; ++round) {
    DampedRound st;
    st.start = b;
    st.distortion.resize(n);
    for (int h = 0; h < n; ++h) st.distortion[h] = detail::c1_reference(lam[h].data(), d, b[h], m, q).distortion;
    if (round == 0) r.uniform_distortion = st.distortion;
    st.mean_distortion = std::max(detail::numpy_sum(st.distortion.data(), n) / n, 1e-30);
    st.step.resize(n);
    st.after_step.resize(n);
    for (int h = 0; h < n; ++h) {
      const double ratio = st.distortion[h] / st.mean_distortion;
      const double moved = static_cast<double>(bbar) * (std::sqrt(ratio) - 1.0);
      st.step[h] = static_cast<int64_t>(moved * opt.damping);  // int(): toward zero
      st.after_step[h] = std::max(budget_floor, b[h] + st.step[h]);
      st.sum_after_step += st.after_step[h];
    }
    st.after_renorm = st.after_step;
    if (st.sum_after_step > 0)
      for (int h = 0; h < n; ++h) {
        // Below 2^53 the product is exact as a double and one division rounds the exact
        // quotient, as Python's int / int does.
        if (total > 0 && st.after_step[h] > (int64_t{1} << 53) / total)
          fail("budget", "B_h * total above 2^53 (B_h " +
                             num(static_cast<long long>(st.after_step[h])) + ", total " +
                             num(static_cast<long long>(total)) +
                             "): the reference's arithmetic is not reproduced there");
        const double v = static_cast<double>(st.after_step[h] * total) /
                         static_cast<double>(st.sum_after_step);
        st.after_renorm[h] = std::max(budget_floor, static_cast<int64_t>(v));
      }
    b = st.after_renorm;
    r.rounds.push_back(std::move(st));
  }
  r.budgets = b;
  for (int h = 0; h < n; ++h) {
    r.choice.push_back(detail::c1_reference(lam[h].data(), d, b[h], m, q));
    r.objective += r.choice.back().distortion;
    r.total_assigned += b[h];
  }
  if (opt.rounds == 0)
    for (const auto& c : r.choice) r.uniform_distortion.push_back(c.distortion);
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
  const int64_t budget_floor = cobra_min_head_budget(bbar, floor);
  const int64_t budget_cap = head_max > 0 ? head_max : static_cast<int64_t>(d) * m.b_max;
  if (budget_cap < budget_floor)
    fail("head_max", num(static_cast<long long>(budget_cap)) +
                         " is below the per-head floor " +
                         num(static_cast<long long>(budget_floor)));
  check_total(total, n, budget_floor);
  auto q = q_table(m);
  // The grid depends only on (d, model, floor, cap): reuse it across calls (per thread).
  thread_local std::unique_ptr<ModelGrid> cached;
  thread_local std::tuple<int, int, int, int, int, double, int64_t, int64_t> cached_key;
  const auto key =
      std::make_tuple(d, m.r_min, m.r_step, m.b_min, m.b_max, m.c, budget_floor, budget_cap);
  if (!cached || cached_key != key) {
    cached = std::make_unique<ModelGrid>(d, m, q, budget_floor, budget_cap);
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
  // better than U would use only options with rc < U - LB (see exact_solve.cpp), so no extra, so
  // it would be a solution of the restricted problem: there is none. Heads where that fails get
  // their extras back and the problem is solved again.
  const bool lazy = grid.len[0] > 0 && 2 * total <= static_cast<int64_t>(n) * grid.cost0.back();
  full.assign(n, !lazy);
  C2Result r;
  r.total_target = total;
  r.head_floor = budget_floor;
  for (;;) {
    curves.clear();
    curves.has_hull = true;
    curves.has_seg = true;
    for (int h = 0; h < n; ++h)
      model_stairs(pr[h], grid, budget_floor, budget_cap, full[h], &scratch, &curves);
    r.exact = detail::solve_exact_budget(curves, total, &info);
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
    r.uniform_distortion.push_back(dstar(h, std::min(even[h], budget_cap)));
  }
  return r;
}

}  // namespace kvq::alloc
