// The exact budget split's curves (make_curve, curve_value), the flat staircases' lookups and
// hulls, and the public entry point, which flattens the curves for the solver (exact_solve.cpp).
#include "kvq/alloc/exact.hpp"

#include <algorithm>
#include <cmath>
#include <limits>

#include "exact_flat.hpp"
#include "internal.hpp"

namespace kvq::alloc {

using detail::fail;
using detail::num;

HeadCurve make_curve(const std::vector<CurveOption>& options, int64_t budget_floor,
                     int64_t budget_cap) {
  if (budget_floor < 0)
    fail("budget_floor",
         "head budget floor must be >= 0, got " + num(static_cast<long long>(budget_floor)));
  if (budget_cap < budget_floor)
    fail("budget_cap", "head budget cap " + num(static_cast<long long>(budget_cap)) +
                           " is below the floor " + num(static_cast<long long>(budget_floor)));
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
    if (w > budget_cap) continue;
    items.push_back({std::max(w, budget_floor), w, o.distortion, o.rank, o.bits});
  }
  std::sort(items.begin(), items.end(), [](const Item& a, const Item& b) {
    if (a.cost != b.cost) return a.cost < b.cost;
    if (a.v != b.v) return a.v < b.v;
    if (a.weight != b.weight) return a.weight < b.weight;
    if (a.rank != b.rank) return a.rank < b.rank;
    return a.bits > b.bits;
  });
  HeadCurve c;
  c.budget_floor = budget_floor;
  c.budget_cap = budget_cap;
  for (const auto& it : items)
    if (c.points.empty() || it.v < c.points.back().distortion)
      c.points.push_back({it.cost, it.v, it.rank, it.bits});
  if (c.points.empty())
    fail("budget_cap",
         "no option fits under the head cap " + num(static_cast<long long>(budget_cap)));
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
    flat.close_head(hc.points.size(), 0, hc.budget_floor, hc.budget_cap);
  }
  return detail::solve_exact_budget(flat, total);
}

}  // namespace kvq::alloc
