#pragma once
// What the exact budget split returns (solve_exact_budget, kvq/alloc/exact.hpp; the flat solver
// of exact C2 returns it too, src/exact_flat.hpp).
#include <cstdint>
#include <vector>

namespace kvq::alloc {

struct ExactSolution {
  std::vector<int64_t> budgets;  // B_h; sum == total exactly
  std::vector<int> point;        // curve point each head is coded with (cost <= B_h)
  double objective = 0.0;        // sum_h D*_h(B_h), the true integer optimum
  // Diagnostics: Lagrangian lower bound, heads left to the DP after reduced-cost fixing, DP states.
  double lower_bound = 0.0;
  double upper_bound_greedy = 0.0;
  int free_heads = 0;
  int64_t dp_states = 0;
};

}  // namespace kvq::alloc
