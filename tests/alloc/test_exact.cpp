// The generic exact budget solver on arbitrary (non-convex) staircases, against brute force.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <numeric>
#include <random>

#include "kvq/alloc/exact.hpp"
#include "kvq/util/error.hpp"

namespace kvq::alloc {
namespace {

// Random option sets: weights in [1, wmax], distortions without structure, so curves have
// arbitrary non-convex steps (plus occasional exact ties across heads).
std::vector<CurveOption> random_options(std::mt19937_64& rng, int count, int wmax) {
  std::vector<CurveOption> o;
  std::uniform_real_distribution<double> u(0, 1);
  for (int i = 0; i < count; ++i) {
    int w = 1 + static_cast<int>(rng() % wmax);
    o.push_back({w, 1, std::round(u(rng) * 8) / 8 + (i % 3 ? u(rng) : 0.0)});
  }
  return o;
}

double brute(const std::vector<HeadCurve>& c, int64_t total) {
  const int n = static_cast<int>(c.size());
  double best = INFINITY;
  std::function<void(int, int64_t, double)> rec = [&](int h, int64_t left, double acc) {
    if (h == n - 1) {
      if (left >= c[h].budget_floor && left <= c[h].budget_cap)
        best = std::min(best, acc + curve_value(c[h], left));
      return;
    }
    for (int64_t B = c[h].budget_floor; B <= c[h].budget_cap && B <= left; ++B)
      rec(h + 1, left - B, acc + curve_value(c[h], B));
  };
  rec(0, total, 0.0);
  return best;
}

TEST(ExactSolver, MatchesBruteForceOnNonConvexCurves) {
  std::mt19937_64 rng(7);
  int checked = 0, dp_used = 0, greedy_suboptimal = 0;
  for (int trial = 0; trial < 400; ++trial) {
    const int n = 1 + static_cast<int>(rng() % 4);
    std::vector<HeadCurve> curves;
    for (int h = 0; h < n; ++h) {
      int64_t bmin = static_cast<int64_t>(rng() % 4), bmax = bmin + 3 + static_cast<int64_t>(rng() % 14);
      auto opts = random_options(rng, 2 + static_cast<int>(rng() % 10), static_cast<int>(bmax));
      opts.push_back({0, 0, 5.0});  // something always fits
      if (trial % 7 == 0 && h > 0) {
        curves.push_back(curves[0]);  // identical heads
        continue;
      }
      curves.push_back(make_curve(opts, bmin, bmax));
    }
    int64_t lo = 0, hi = 0;
    for (const auto& c : curves) lo += c.points.front().cost, hi += c.budget_cap;
    for (int64_t total = lo; total <= hi; total += 1 + static_cast<int64_t>(rng() % 3)) {
      ExactSolution s = solve_exact_budget(curves, total);
      double truth = brute(curves, total);
      ASSERT_NEAR(s.objective, truth, 1e-12) << "trial " << trial << " total " << total;
      ASSERT_EQ(std::accumulate(s.budgets.begin(), s.budgets.end(), int64_t{0}), total);
      double check = 0;
      for (int h = 0; h < n; ++h) {
        EXPECT_GE(s.budgets[h], curves[h].budget_floor);
        EXPECT_LE(s.budgets[h], curves[h].budget_cap);
        EXPECT_LE(curves[h].points[s.point[h]].cost, s.budgets[h]);
        check += curves[h].points[s.point[h]].distortion;
      }
      EXPECT_NEAR(check, s.objective, 1e-12);
      EXPECT_LE(s.lower_bound, s.objective + 1e-9);
      EXPECT_GE(s.upper_bound_greedy, s.objective - 1e-9);
      dp_used += s.free_heads > 0;
      greedy_suboptimal += s.upper_bound_greedy > s.objective + 1e-9;
      ++checked;
    }
  }
  EXPECT_GT(checked, 1000);
  // The gap-closing step is exercised, and needed: the hull greedy alone is often not optimal.
  EXPECT_GT(dp_used, 100);
  EXPECT_GT(greedy_suboptimal, 5);
}

TEST(ExactSolver, ManyIdenticalHeadsStayExact) {
  // 40 identical 3-point heads: the LP splits ties arbitrarily; the DP must still be exact.
  std::vector<CurveOption> opts = {{1, 4, 10.0}, {1, 7, 6.0}, {1, 9, 5.1}, {1, 12, 2.0}};
  HeadCurve c = make_curve(opts, 4, 12);
  std::vector<HeadCurve> curves(40, c);
  for (int64_t total : {160, 170, 200, 233, 300, 417, 480}) {
    ExactSolution s = solve_exact_budget(curves, total);
    // Truth by DP over the number of heads at each point (identical heads commute).
    double best = INFINITY;
    for (int a = 0; a <= 40; ++a)
      for (int b = 0; a + b <= 40; ++b)
        for (int d = 0; a + b + d <= 40; ++d) {
          int e = 40 - a - b - d;  // a at 4, b at 7, d at 9, e at 12
          int64_t cost = 4LL * a + 7LL * b + 9LL * d + 12LL * e;
          if (cost > total) continue;
          best = std::min(best, 10.0 * a + 6.0 * b + 5.1 * d + 2.0 * e);
        }
    EXPECT_NEAR(s.objective, best, 1e-9) << total;
    EXPECT_EQ(std::accumulate(s.budgets.begin(), s.budgets.end(), int64_t{0}), total);
  }
}

TEST(ExactSolver, CurveTiesAndValues) {
  // Equal distortion: the lighter option wins; same weight: the smaller rank, then larger bits.
  HeadCurve c = make_curve({{4, 2, 1.0}, {2, 4, 1.0}, {8, 1, 1.0}, {2, 2, 3.0}, {1, 2, 3.0}}, 0, 100);
  ASSERT_EQ(c.points.size(), 2u);
  EXPECT_EQ(c.points[0].cost, 2);
  EXPECT_EQ(c.points[0].rank, 1);
  EXPECT_EQ(c.points[1].cost, 8);
  EXPECT_EQ(c.points[1].rank, 2);
  EXPECT_EQ(c.points[1].bits, 4);
  EXPECT_EQ(curve_value(c, 1), INFINITY);
  EXPECT_EQ(curve_value(c, 7), 3.0);
  int k = -2;
  EXPECT_EQ(curve_value(c, 8, &k), 1.0);
  EXPECT_EQ(k, 1);
  // The floor charges light options the floor: both collapse to cost 5, the better one stays.
  c = make_curve({{1, 2, 3.0}, {1, 4, 2.0}, {1, 9, 1.0}}, 5, 8);
  ASSERT_EQ(c.points.size(), 1u);
  EXPECT_EQ(c.points[0].cost, 5);
  EXPECT_EQ(c.points[0].distortion, 2.0);
}

TEST(ExactSolver, InfeasibleBudgetsThrow) {
  HeadCurve c = make_curve({{1, 4, 1.0}, {1, 8, 0.5}}, 4, 10);
  auto expect_error = [&](int64_t total, const std::string& sub) {
    try {
      solve_exact_budget({c, c}, total);
      ADD_FAILURE() << total;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(sub), std::string::npos) << e.what();
    }
  };
  expect_error(7, "total 7 bits is below the sum of per-head minimum budgets 8");
  expect_error(21, "exceeds what the heads can hold (sum of caps 20)");
  EXPECT_THROW(make_curve({{1, 30, 1.0}}, 4, 10), Error);
  EXPECT_THROW(make_curve({{1, 3, NAN}}, 4, 10), Error);
  EXPECT_THROW(make_curve({{1, 3, 1.0}}, 5, 4), Error);
  EXPECT_THROW(solve_exact_budget({}, 4), Error);
}

}  // namespace
}  // namespace kvq::alloc
