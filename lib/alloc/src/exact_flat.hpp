#pragma once
// Internal: the exact solver on staircases stored back to back as parallel arrays (one allocation
// per array for every head), which keeps the 8B/70B panels out of the allocator and off fresh
// pages. Each head may come with its lower convex hull already built (the model path builds it in
// the same pass as the staircase); otherwise the solver builds it.
#include <cstddef>
#include <cstdint>
#include <vector>

#include "kvq/alloc/exact_solution.hpp"

namespace kvq::alloc::detail {

struct Stairs {
  // Points of head h: [start[h], start[h+1]); costs strictly increase, distortions strictly
  // decrease. cost and dist are sized with spare room: only start[n()] entries are in use.
  std::vector<int64_t> cost;
  std::vector<double> dist;
  std::vector<size_t> start;
  // Lower hull of head h as point indices within the head: hull[hstart[h] .. hstart[h+1]),
  // strictly convex (collinear points dropped), first and last staircase points included.
  std::vector<int32_t> hull;
  std::vector<size_t> hstart;
  bool has_hull = false;
  // Parallel to hull (when has_seg): each vertex's cost and distortion, and eff[hstart[h] + s] =
  // distortion saved per bit by hull segment s (vertex s -> s + 1); the head's last slot is
  // unused. The solver clamps a rounding wobble so that they never rise along a head.
  std::vector<int64_t> hcost;
  std::vector<double> hdist, eff;
  std::vector<char> eff_sorted;  // per head (when has_seg): its efficiencies never rise
  bool has_seg = false;
  std::vector<int64_t> budget_floor, budget_cap;  // per head
  // Options a caller kept out of head h's staircase (it proves them useless after the solve):
  // [ex_start[h], ex_start[h+1]). Empty unless the caller fills them.
  std::vector<int64_t> ex_cost;
  std::vector<double> ex_dist;
  std::vector<size_t> ex_start;

  void clear() {
    ex_cost.clear();
    ex_dist.clear();
    ex_start.assign(1, 0);
    start.assign(1, 0);
    hstart.assign(1, 0);
    budget_floor.clear();
    budget_cap.clear();
    eff_sorted.clear();
    has_hull = false;
    has_seg = false;
  }
  int n() const { return static_cast<int>(budget_floor.size()); }
  size_t used() const { return start.back(); }
  // Make room for `more` points (and hull entries) after the ones in use.
  void reserve_more(size_t more) {
    const size_t need = used() + more;
    if (cost.size() < need) {
      cost.resize(2 * need);
      dist.resize(2 * need);
    }
    const size_t hneed = hstart.back() + more;
    if (hull.size() < hneed) {
      hull.resize(2 * hneed);
      hcost.resize(2 * hneed);
      hdist.resize(2 * hneed);
      eff.resize(2 * hneed);
    }
  }
  // Close the head whose points (and hull, when has_hull) were just written.
  void close_head(size_t n_points, size_t n_hull, int64_t lo, int64_t hi, bool sorted = false) {
    eff_sorted.push_back(sorted);
    ex_start.push_back(ex_cost.size());
    start.push_back(start.back() + n_points);
    hstart.push_back(hstart.back() + n_hull);
    budget_floor.push_back(lo);
    budget_cap.push_back(hi);
  }
  const int64_t* cost_of(int h) const { return cost.data() + start[h]; }
  const double* dist_of(int h) const { return dist.data() + start[h]; }
  int size(int h) const { return static_cast<int>(start[h + 1] - start[h]); }
  const int32_t* hull_of(int h) const { return hull.data() + hstart[h]; }
  int hull_size(int h) const { return static_cast<int>(hstart[h + 1] - hstart[h]); }
  // D*_h(budget) (+inf when nothing fits); *k = the point index within the head, or -1.
  double value(int h, int64_t budget, int* k = nullptr) const;
};

// Whether b stays on the lower hull when p follows a and b (a strict left turn): the test of every
// monotone-chain step (the model path's bulk runs need none: their slopes fall strictly). Costs
// come in as doubles (exact: they are integers far below 2^53).
inline bool left_turn(double ax, double ay, double bx, double by, double px, double py) {
  return (bx - ax) * (py - ay) - (by - ay) * (px - ax) > 0;
}

// Lower hull of np staircase points as indices written to out[0..returned); collinear points are
// dropped so slopes strictly flatten along the hull.
int lower_hull(const int64_t* cost, const double* dist, int np, int32_t* out);

// Hull segment slopes of np hull vertices (costs c, distortions d) into e[0 .. np-1): distortion
// saved per bit. (The solver makes them non-increasing along the head before use.)
inline void hull_efficiencies(const int64_t* c, const double* d, int np, double* e) {
  for (int s = 0; s + 1 < np; ++s) e[s] = (d[s] - d[s + 1]) / static_cast<double>(c[s + 1] - c[s]);
}

// What the exactness argument of a solve rests on, for a caller that checks options it left out.
struct SolveInfo {
  double mu = 0.0;         // the Lagrange multiplier
  std::vector<double> m;   // per head: min over its staircase of D + mu c
};

// The exact solver (exact_solve.cpp; method and guarantees as kvq::alloc::solve_exact_budget,
// which flattens its curves and calls this). The model path of exact C2 calls it directly with
// staircases and hulls built from the (r, b) grid. Solves in place: builds the hulls (and their
// segments) first when the caller did not. *info, when given: mu and the m_h, for a caller that
// proves options it left out useless.
ExactSolution solve_exact_budget(Stairs& c, int64_t total, SolveInfo* info = nullptr);

// Rounding allowance of the exactness argument over n heads at this scale (|UB| + sum |m_h| +
// mu total): 8 (n + 4) ulps.
inline double rounding_tol(int n, double scale) {
  const double t = 8.0 * (n + 4) * 1.1102230246251565e-16 * scale;
  return t > 2.2250738585072014e-308 ? t : 2.2250738585072014e-308;
}

}  // namespace kvq::alloc::detail
