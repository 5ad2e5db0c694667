#pragma once
// Exact cross-head budget split (KV-COBRA C2 exact): minimise sum_h D*_h(B_h) subject to
// sum_h B_h = total, B_h integer in [B_min, B_max_h], where each D*_h is a non-increasing step
// function of the head's budget (a multiple-choice knapsack over per-head curves).
#include <cstdint>
#include <vector>

#include "kvq/alloc/exact_solution.hpp"

namespace kvq::alloc {

// One way to code a head: `rank` kept directions at `bits` each; weight = rank * bits bits/token.
struct CurveOption {
  int rank = 0;
  int bits = 0;
  double distortion = 0.0;
};

// D*(B) as a staircase: D*(B) = points[k].distortion for the largest k with points[k].cost <= B.
// cost is what the head is charged: max(rank * bits, budget_floor). Costs strictly increase,
// distortions strictly decrease, so every point is worth its extra bits.
struct CurvePoint {
  int64_t cost = 0;
  double distortion = 0.0;
  int rank = 0;
  int bits = 0;
};

struct HeadCurve {
  std::vector<CurvePoint> points;
  int64_t budget_floor = 0;  // the head's budget floor
  int64_t budget_cap = 0;    // the head's budget cap (heavier options are not on the curve)
};

// Staircase of a set of options (any order). Ties in distortion go to the lighter option, then
// the smaller rank, then the larger bits. Options heavier than budget_cap are dropped. Throws
// kvq::Error when no option fits under budget_cap or an option's distortion is not finite.
HeadCurve make_curve(const std::vector<CurveOption>& options, int64_t budget_floor,
                     int64_t budget_cap);

// D*(budget) on a curve; +infinity when no point fits.
double curve_value(const HeadCurve& c, int64_t budget, int* point_index = nullptr);


// Exact optimum. Method: lower convex hull per head -> LP relaxation by greedy over hull segments
// (critical slope mu, found by cost histograms over the efficiencies' bits, no sort) ->
// Lagrangian lower bound LB (m_h = min over every step of D + mu c) -> integer incumbent UB ->
// options whose reduced cost exceeds g cannot be in any solution within LB + g and are dropped
// (heads with one survivor are fixed) -> Pareto DP over the remaining heads; g grows x4 from
// (UB - LB)/256 until the DP's best is within LB + g (then it is the optimum) or g reaches U - LB
// (U = the best solution seen; then U is). Survivors and DP states are kept up to g plus a bound
// on the accumulated rounding, so the result is optimal up to floating-point rounding of the
// sums. Leftover budget (the curves are flat there) is spread evenly over heads below their cap
// so the sum is met exactly. Ties between equally good splits resolve deterministically (the DP
// keeps the cheapest).
// The one exact budget solver: cobra_c2_exact and cobra_c2_exact_measured run it too.
// Throws kvq::Error if sum of floors > total or sum of caps < total.
ExactSolution solve_exact_budget(const std::vector<HeadCurve>& curves, int64_t total);

}  // namespace kvq::alloc
