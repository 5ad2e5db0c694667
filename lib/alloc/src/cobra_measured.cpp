// KV-COBRA exact C2 over measured distortion: the caller's per-head (rank, bits) tables, turned
// into curves and solved by the exact solver.
#include <algorithm>
#include <cmath>
#include <string>

#include "cobra_internal.hpp"
#include "internal.hpp"
#include "kvq/alloc/cobra.hpp"

namespace kvq::alloc {

using detail::check_total;
using detail::fail;
using detail::num;

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
  const int64_t budget_floor = cobra_min_head_budget(bbar, floor);
  check_total(total, n, budget_floor);
  std::vector<HeadCurve> curves;
  curves.reserve(n);
  for (int h = 0; h < n; ++h) {
    const MeasuredTable& t = tables[h];
    const std::string field = "tables[" + num(h) + "]";
    validate_measured(t, d, field);
    const int64_t budget_cap = head_max > 0 ? head_max : static_cast<int64_t>(d) * t.b_max;
    if (budget_cap < budget_floor)
      fail("head_max", num(static_cast<long long>(budget_cap)) +
                           " is below the per-head floor " +
                           num(static_cast<long long>(budget_floor)));
    std::vector<CurveOption> opts;
    const int nb = t.b_max - t.b_min + 1;
    if (std::isfinite(t.rank0_mse)) opts.push_back({0, 0, t.rank0_mse});
    for (size_t i = 0; i < t.ranks.size(); ++i)
      for (int b = t.b_min; b <= t.b_max; ++b)
        opts.push_back({t.ranks[i], b, t.mse[i * nb + (b - t.b_min)]});
    curves.push_back(make_curve(opts, budget_floor, budget_cap));
  }
  C2Result r;
  r.total_target = total;
  r.head_floor = budget_floor;
  r.exact = solve_exact_budget(curves, total);
  r.budgets = r.exact.budgets;
  const std::vector<int64_t> even = even_split(total, n);
  for (int h = 0; h < n; ++h) {
    const CurvePoint& p = curves[h].points[r.exact.point[h]];
    r.choice.push_back({p.rank, p.bits, p.distortion});
    r.objective += p.distortion;
    r.total_assigned += r.budgets[h];
    r.uniform_distortion.push_back(
        curve_value(curves[h], std::min(even[h], curves[h].budget_cap)));
  }
  return r;
}

}  // namespace kvq::alloc
