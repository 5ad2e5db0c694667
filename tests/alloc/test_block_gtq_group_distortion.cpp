// Block-GTQ with a distortion that depends on the group size (BlockGtqOptions::group_distortion,
// kvq-allocate --exact-distortion --codebook exact): all blocks of one width are one group of
// m = 2 x their count, so the table is found per head by fixed-point iteration. Checked against
// brute force over every allocation of small heads, with the distortion model written here:
//  - the head's predicted_distortion is the self-consistent objective of its own bits (each width
//    charged at the size of the group it forms), counted here;
//  - it is never above the self-consistent objective of the allocation that is optimal for the
//    whole-head table D(b, head_dim) (the first iterate, found here by brute force);
//  - with a distortion that does not depend on m it is the plain table greedy;
//  - bits within [b_min, b_max], summing to the budget.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <functional>
#include <limits>
#include <random>
#include <vector>

#include "kvq/alloc/block_gtq.hpp"
#include "kvq/util/error.hpp"

namespace kvq::alloc {
namespace {

// A model with the sphere codebook's shape: smaller groups code better (the exact law's
// Lloyd-Max MSE falls with m at a fixed width), convex and decreasing in b at any fixed m.
double model_d(int b, int m) { return b == 0 ? 1.0 : std::pow(4.0, -b) * (1.0 - 1.0 / (m + 1.0)); }

double self_consistent(const std::vector<double>& s, const std::vector<int>& bits,
                       const std::function<double(int, int)>& D) {
  std::vector<int> count(17, 0);
  for (int b : bits) ++count[static_cast<size_t>(b)];
  double j = 0;
  for (size_t i = 0; i < s.size(); ++i) j += s[i] * D(bits[i], 2 * count[static_cast<size_t>(bits[i])]);
  return j;
}

// Every allocation of n blocks in [b_min, b_max] summing to budget, calling f on each.
void for_each_allocation(int n, int b_min, int b_max, int budget, const std::function<void(const std::vector<int>&)>& f) {
  std::vector<int> bits(static_cast<size_t>(n), b_min);
  std::function<void(int, int)> rec = [&](int i, int left) {
    if (i == n) {
      if (left == 0) f(bits);
      return;
    }
    for (int b = b_min; b <= b_max; ++b) {
      if (b > left) break;
      bits[static_cast<size_t>(i)] = b;
      rec(i + 1, left - b);
    }
  };
  rec(0, budget);
}

TEST(BlockGtqGroupDistortion, SelfConsistentAndNeverWorseThanTheWholeHeadTable) {
  std::mt19937_64 gen(5);
  std::lognormal_distribution<double> energy(0.0, 1.5);
  BlockGtqInput in;
  const int d = 12, nb = d / 2;
  in.shape = {3, 4, d};
  in.pairing = RopePairing::kSplitHalf;
  for (int h = 0; h < in.shape.n_heads(); ++h) {
    std::vector<double> e(static_cast<size_t>(nb));
    for (double& v : e) v = energy(gen);
    in.energies.push_back(e);
  }
  for (double bpd : {1.5, 2.0, 2.5, 3.0}) {
    BlockGtqOptions o;
    o.greedy.b_min = 1;
    o.greedy.b_max = 4;
    o.group_distortion = model_d;
    const Allocation a = allocate_block_gtq(in, bpd, o);
    const int budget = static_cast<int>(std::floor(nb * bpd + 1e-9));
    double gap = 0;
    int optimal = 0;
    for (int i = 0; i < in.shape.n_heads(); ++i) {
      const auto& s = in.energies[static_cast<size_t>(i)];
      const auto& bits = a.heads[static_cast<size_t>(i)].block_bits;
      int sum = 0;
      for (int b : bits) {
        EXPECT_GE(b, 1);
        EXPECT_LE(b, 4);
        sum += b;
      }
      EXPECT_EQ(sum, budget);
      const double j = self_consistent(s, bits, model_d);
      EXPECT_NEAR(a.heads[static_cast<size_t>(i)].predicted_distortion, j, 1e-12 * (1 + j));
      // Brute force: the optimum under the whole-head table, and the self-consistent optimum.
      double best_t0 = std::numeric_limits<double>::infinity(), j_of_t0 = 0;
      double best_sc = std::numeric_limits<double>::infinity();
      for_each_allocation(nb, 1, 4, budget, [&](const std::vector<int>& b) {
        double t0 = 0;
        for (size_t k = 0; k < s.size(); ++k) t0 += s[k] * model_d(b[k], d);
        if (t0 < best_t0 - 1e-15) best_t0 = t0, j_of_t0 = self_consistent(s, b, model_d);
        best_sc = std::min(best_sc, self_consistent(s, b, model_d));
      });
      EXPECT_LE(j, j_of_t0 * (1 + 1e-12)) << "head " << i << " bpd " << bpd;
      EXPECT_GE(j, best_sc * (1 - 1e-12));
      gap = std::max(gap, j / best_sc - 1);
      optimal += j <= best_sc * (1 + 1e-12);
    }
    std::printf("bpd %.1f: %d of %d heads at the brute-force self-consistent optimum, largest gap %.3f%%\n", bpd,
                optimal, in.shape.n_heads(), 100 * gap);
  }
}

TEST(BlockGtqGroupDistortion, SizeFreeDistortionIsThePlainTableGreedy) {
  BlockGtqInput in;
  in.shape = {1, 3, 16};
  in.energies = {{8, 4, 2, 1, 0.5, 9, 3, 1}, {1, 1, 1, 1, 1, 1, 1, 1}, {0, 0, 5, 0, 2, 7, 1, 3}};
  BlockGtqOptions plain, grouped;
  for (int b = 0; b <= 8; ++b) plain.greedy.distortion_table.push_back(b == 0 ? 1.0 : 0.9 * std::pow(4.0, -b));
  grouped.group_distortion = [](int b, int) { return b == 0 ? 1.0 : 0.9 * std::pow(4.0, -b); };
  const Allocation p = allocate_block_gtq(in, 2.5, plain), g = allocate_block_gtq(in, 2.5, grouped);
  for (size_t i = 0; i < p.heads.size(); ++i) {
    EXPECT_EQ(p.heads[i].block_bits, g.heads[i].block_bits);
    EXPECT_DOUBLE_EQ(p.heads[i].predicted_distortion, g.heads[i].predicted_distortion);
  }
  // A first table that is not decreasing is refused naming the table.
  BlockGtqOptions bad;
  bad.group_distortion = [](int, int) { return 0.5; };
  EXPECT_THROW(allocate_block_gtq(in, 2.5, bad), Error);
}

}  // namespace
}  // namespace kvq::alloc
