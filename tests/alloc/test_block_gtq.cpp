// Block-GTQ greedy against independent truth: exhaustive search over all allocations and a literal
// step-by-step greedy (the paper's loop, one bit at a time).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <random>
#include <set>

#include "kvq/alloc/block_gtq.hpp"
#include "kvq/util/error.hpp"

namespace kvq::alloc {
namespace {

double dist(int b, const std::vector<double>& table) {
  return table.empty() ? std::pow(4.0, -b) : table[b];
}

// The paper's loop verbatim: start at b_min, give one bit at a time to the block with the largest
// marginal gain among those below b_max, ties to the lower index.
std::vector<int> literal_greedy(const std::vector<double>& s, int64_t budget, int b_min, int b_max,
                                const std::vector<double>& table = {}) {
  std::vector<int> b(s.size(), b_min);
  int64_t used = static_cast<int64_t>(s.size()) * b_min;
  while (used < budget) {
    int best = -1;
    double best_gain = -1;
    for (size_t i = 0; i < s.size(); ++i) {
      if (b[i] >= b_max) continue;
      // For 4^-b the rule is argmax s_i 4^-b_i (gain = 3/4 of it: same order).
      double gain = table.empty() ? s[i] * std::ldexp(1.0, -2 * b[i])
                                  : s[i] * (table[b[i]] - table[b[i] + 1]);
      if (gain > best_gain) {
        best_gain = gain;
        best = static_cast<int>(i);
      }
    }
    EXPECT_GE(best, 0);
    ++b[best];
    ++used;
  }
  return b;
}

// Minimum of J over every allocation in [b_min, b_max]^n with sum == budget.
double exhaustive_min(const std::vector<double>& s, int64_t budget, int b_min, int b_max,
                      const std::vector<double>& table = {}) {
  const int n = static_cast<int>(s.size());
  std::vector<int> b(n, b_min);
  double best = INFINITY;
  std::function<void(int, int64_t)> rec = [&](int i, int64_t left) {
    if (i == n - 1) {
      if (left < b_min || left > b_max) return;
      b[i] = static_cast<int>(left);
      double j = 0;
      for (int k = 0; k < n; ++k) j += s[k] * dist(b[k], table);
      best = std::min(best, j);
      return;
    }
    for (int w = b_min; w <= b_max && w <= left; ++w) {
      b[i] = w;
      rec(i + 1, left - w);
    }
  };
  rec(0, budget);
  return best;
}

// Energies with many exact ties: equal values, zeros and ratios that are powers of 4.
double tie_prone_energy(std::mt19937_64& rng) {
  static const double pool[] = {0.0, 1.0, 4.0, 16.0, 0.25, 2.0, 8.0, 3.0, 12.0, 0.75};
  std::uniform_int_distribution<int> pick(0, 12);
  int k = pick(rng);
  if (k < 10) return pool[k];
  return std::exp(std::uniform_real_distribution<double>(-4, 4)(rng));
}

TEST(BlockGtqGreedy, MatchesExhaustiveAndLiteralGreedyOnAllSmallBudgets) {
  std::mt19937_64 rng(1234);
  int cases = 0;
  for (int trial = 0; trial < 300; ++trial) {
    const int n = 1 + static_cast<int>(rng() % 6);
    const int b_min = 1 + static_cast<int>(rng() % 2);
    const int b_max = b_min + static_cast<int>(rng() % 4);
    std::vector<double> s(n);
    for (auto& x : s) x = tie_prone_energy(rng);
    for (int64_t B = int64_t{n} * b_min; B <= int64_t{n} * b_max; ++B) {
      GreedyOptions opt;
      opt.b_min = b_min;
      opt.b_max = b_max;
      GreedyResult r = block_gtq_greedy(s, static_cast<double>(B) / n, opt);
      ASSERT_EQ(r.budget, B);
      ASSERT_EQ(r.used, B);
      EXPECT_EQ(r.bits, literal_greedy(s, B, b_min, b_max)) << "trial " << trial << " B " << B;
      double truth = exhaustive_min(s, B, b_min, b_max);
      EXPECT_NEAR(r.objective, truth, 1e-12 * std::max(1.0, truth)) << "trial " << trial;
      ++cases;
    }
  }
  EXPECT_GT(cases, 1000);
}

TEST(BlockGtqGreedy, MatchesLiteralGreedyAtHeadScaleAndExtremeRanges) {
  std::mt19937_64 rng(99);
  for (int trial = 0; trial < 40; ++trial) {
    const int n = 64;
    std::vector<double> s(n);
    for (int i = 0; i < n; ++i) {
      if (trial % 4 == 0) s[i] = tie_prone_energy(rng);
      else if (trial % 4 == 1) s[i] = std::exp(std::uniform_real_distribution<double>(-600, 600)(rng));
      else s[i] = std::pow(1.0 + i, -1.5) * std::exp(std::normal_distribution<double>(0, 1)(rng));
    }
    for (int k = 64; k <= 8 * 64; k += 7) {
      double bpd = k / 64.0;
      GreedyResult r = block_gtq_greedy(s, bpd, {});
      ASSERT_EQ(r.bits, literal_greedy(s, k, 1, 8)) << "trial " << trial << " k " << k;
    }
  }
}

TEST(BlockGtqGreedy, MatchesLiteralGreedyWhenGainsCrowdOneLevel) {
  // The last level taken is settled by bins on the top bits of the mantissa, then an exact rank
  // inside the cut bin. Crowd it: many energies 4^k (1 + j 2^-40) (same bin, near-ties, exact
  // ties), values at the bin and binade edges (mantissa 0.5, 1 - ulp, 1, 2 - ulp), zeros, and
  // subnormals, at every budget.
  std::mt19937_64 rng(7);
  for (int trial = 0; trial < 30; ++trial) {
    const int n = 64;
    std::vector<double> s(n);
    for (int i = 0; i < n; ++i) {
      const int k = static_cast<int>(rng() % 3) - 1;
      switch (trial % 3) {
        case 0: s[i] = std::ldexp(1.0 + static_cast<double>(rng() % 4) * 0x1p-40, 2 * k); break;
        case 1: {
          static const double edge[] = {0.5, 1.0 - 0x1p-53, 1.0, 2.0 - 0x1p-52, 0.75, 0.0};
          s[i] = std::ldexp(edge[rng() % 6], 2 * k + static_cast<int>(rng() % 2));
          break;
        }
        default:
          s[i] = (rng() % 4 == 0) ? 0.0 : 4.9e-324 * static_cast<double>(1 + rng() % 8);
          break;
      }
    }
    GreedyOptions opt;
    opt.b_min = 1 + trial % 2;
    opt.b_max = 8;
    // The literal loop multiplies s by 4^-b in doubles: for subnormal s that would round, so it
    // runs on s 2^600 (exact, and the same order).
    std::vector<double> scaled(s);
    for (double& x : scaled) x = std::ldexp(x, 600);
    for (int64_t B = int64_t{n} * opt.b_min; B <= int64_t{n} * opt.b_max; B += 5) {
      GreedyResult r = block_gtq_greedy(s, static_cast<double>(B) / n, opt);
      ASSERT_EQ(r.bits, literal_greedy(scaled, B, opt.b_min, opt.b_max))
          << "trial " << trial << " B " << B;
    }
  }
}

TEST(BlockGtqGreedy, TiesGoToTheLowerIndex) {
  // Equal energies: the single extra bit goes to block 0.
  EXPECT_EQ(block_gtq_greedy({1, 1, 1}, 4.0 / 3).bits, (std::vector<int>{2, 1, 1}));
  // s = (1, 4, 1): block 1 first (gain 4/4); then 4/16 == 1/4 ties blocks 0, 1, 2 -> block 0.
  EXPECT_EQ(block_gtq_greedy({1, 4, 1}, 5.0 / 3).bits, (std::vector<int>{2, 2, 1}));
  EXPECT_EQ(block_gtq_greedy({1, 4, 1}, 6.0 / 3).bits, (std::vector<int>{2, 3, 1}));
  // Heavy block last: it takes the first bit, then the three-way tie at 1/4 goes to block 0.
  EXPECT_EQ(block_gtq_greedy({1, 1, 4}, 5.0 / 3).bits, (std::vector<int>{2, 1, 2}));
  EXPECT_EQ(block_gtq_greedy({1, 1, 4}, 6.0 / 3).bits, (std::vector<int>{2, 2, 2}));
}

TEST(BlockGtqGreedy, ZeroEnergyBlocksFillLastInIndexOrder) {
  GreedyOptions opt;
  opt.b_max = 3;
  // Block 1 takes its two extra bits first; then zero blocks in index order, each to b_max.
  GreedyResult r = block_gtq_greedy({0, 3, 0}, 7.0 / 3, opt);
  EXPECT_EQ(r.bits, (std::vector<int>{3, 3, 1}));
  EXPECT_EQ(r.bits, literal_greedy({0, 3, 0}, 7, 1, 3));
  // All zero: the same rule; objective 0.
  r = block_gtq_greedy({0, 0, 0, 0}, 2.0, opt);
  EXPECT_EQ(r.bits, (std::vector<int>{3, 3, 1, 1}));
  EXPECT_EQ(r.objective, 0.0);
}

TEST(BlockGtqGreedy, HigherEnergyGetsMoreBits) {
  std::vector<double> s;
  for (int i = 0; i < 64; ++i) s.push_back(100.0 * std::pow(1.0 + i, -2.0));
  std::shuffle(s.begin(), s.end(), std::mt19937_64(5));
  GreedyResult r = block_gtq_greedy(s, 3.0);
  for (int i = 0; i < 64; ++i)
    for (int j = 0; j < 64; ++j)
      if (s[i] > s[j]) {
        EXPECT_GE(r.bits[i], r.bits[j]);
      }
  EXPECT_EQ(*std::max_element(r.bits.begin(), r.bits.end()), 8);
  EXPECT_LT(*std::min_element(r.bits.begin(), r.bits.end()), 3);
  // Away from the clamps, 16x the energy buys exactly 2 more bits (the 4^-b law).
  GreedyResult two = block_gtq_greedy({16.0, 1.0}, 4.0);
  EXPECT_EQ(two.bits, (std::vector<int>{5, 3}));
}

TEST(BlockGtqGreedy, BudgetFloorsAndIsReported) {
  GreedyResult r = block_gtq_greedy({1, 2, 3}, 2.5);
  EXPECT_EQ(r.budget, 7);  // floor(3 * 2.5)
  EXPECT_EQ(r.used, 7);
  EXPECT_DOUBLE_EQ(r.effective_bits_per_dim, 7.0 / 3);
  // Decimal inputs are not lost to binary rounding: 10 * 2.3 -> 23.
  std::vector<double> ten(10, 1.0);
  EXPECT_EQ(block_gtq_greedy(ten, 2.3).budget, 23);
  EXPECT_EQ(block_gtq_greedy(ten, 2.29).budget, 22);
}

std::vector<double> lloyd_table() {
  // D(0) = 1 (unit variance, nothing stored); 1..4 = Lloyd-Max N(0,1) MSEs; 5..8 extended by the
  // high-rate ratio (convex, decreasing) for the test.
  std::vector<double> t = {1.0, 0.3634, 0.1175, 0.03455, 0.009501};
  for (int b = 5; b <= 8; ++b) t.push_back(t.back() * 0.26);
  return t;
}

TEST(BlockGtqGreedy, ExactDistortionTableIsOptimal) {
  const auto table = lloyd_table();
  ASSERT_NO_THROW(check_distortion_table(table, 1, 8));
  std::mt19937_64 rng(77);
  for (int trial = 0; trial < 200; ++trial) {
    const int n = 1 + static_cast<int>(rng() % 6);
    const int b_min = 1 + static_cast<int>(rng() % 2);
    const int b_max = std::min(8, b_min + static_cast<int>(rng() % 4));
    std::vector<double> s(n);
    for (auto& x : s) x = tie_prone_energy(rng);
    GreedyOptions opt;
    opt.b_min = b_min;
    opt.b_max = b_max;
    opt.distortion_table = table;
    for (int64_t B = int64_t{n} * b_min; B <= int64_t{n} * b_max; ++B) {
      GreedyResult r = block_gtq_greedy(s, static_cast<double>(B) / n, opt);
      EXPECT_EQ(r.bits, literal_greedy(s, B, b_min, b_max, table));
      double truth = exhaustive_min(s, B, b_min, b_max, table);
      EXPECT_NEAR(r.objective, truth, 1e-12 * std::max(1.0, truth));
    }
  }
}

TEST(BlockGtqGreedy, TableMustBeDecreasingAndConvex) {
  auto expect_error = [](const std::vector<double>& t, const std::string& sub) {
    GreedyOptions opt;
    opt.distortion_table = t;
    try {
      block_gtq_greedy({1, 2}, 2.0, opt);
      ADD_FAILURE() << "no error for " << sub;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(sub), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("distortion_table"), std::string::npos) << e.what();
    }
  };
  auto t = lloyd_table();
  expect_error(std::vector<double>(t.begin(), t.begin() + 5), "needs entries for widths 0..8");
  auto flat = t;
  flat[3] = flat[2];
  expect_error(flat, "not strictly decreasing at b=2");
  // Decreasing, but D(1)-D(2) = 0.05 < D(2)-D(3) = 0.25.
  expect_error({1.0, 0.5, 0.45, 0.2, 0.1, 0.05, 0.025, 0.0125, 0.00625}, "not convex at b=2");
  auto nan = t;
  nan[4] = NAN;
  expect_error(nan, "D(4) must be finite");
}

TEST(BlockGtqGreedy, BadInputsNameFieldAndValue) {
  auto expect_error = [](std::function<void()> f, const std::string& a, const std::string& b) {
    try {
      f();
      ADD_FAILURE() << "no error, wanted " << a;
    } catch (const Error& e) {
      std::string m = e.what();
      EXPECT_NE(m.find(a), std::string::npos) << m;
      EXPECT_NE(m.find(b), std::string::npos) << m;
    }
  };
  std::vector<double> s = {1, 2, 3};
  expect_error([&] { block_gtq_greedy(s, 0.0); }, "bits_per_dim", "got 0");
  expect_error([&] { block_gtq_greedy(s, -1.5); }, "bits_per_dim", "-1.5");
  expect_error([&] { block_gtq_greedy(s, 8.5); }, "bits_per_dim", "8.5 is above b_max=8");
  GreedyOptions two;
  two.b_min = 2;
  expect_error([&] { block_gtq_greedy(s, 1.5, two); }, "bits_per_dim", "1.5 is below b_min=2");
  expect_error([&] { block_gtq_greedy(s, NAN); }, "bits_per_dim", "nan");
  expect_error([&] { block_gtq_greedy({1, -2, 3}, 2.0); }, "energies", "block 1");
  expect_error([&] { block_gtq_greedy({1, INFINITY}, 2.0); }, "energies", "inf");
  expect_error([&] { block_gtq_greedy({}, 2.0); }, "energies", "empty");
  GreedyOptions bad;
  bad.b_min = 0;
  expect_error([&] { block_gtq_greedy(s, 2.0, bad); }, "b_min", "got 0");
  bad.b_min = 3;
  bad.b_max = 2;
  expect_error([&] { block_gtq_greedy(s, 2.0, bad); }, "b_max", "got 2");
}

TEST(BlockGtqGroups, PostRopeCoordinatesInBlockOrder) {
  // Split-half, d = 8: block i = (i, i + 4).
  auto g = groups_from_block_bits({3, 1, 3, 2}, RopePairing::kSplitHalf, 8, 8);
  ASSERT_EQ(g.size(), 3u);
  EXPECT_EQ(g[0].bits, 1);
  EXPECT_EQ(g[0].dims, (std::vector<int>{1, 5}));
  EXPECT_EQ(g[1].bits, 2);
  EXPECT_EQ(g[1].dims, (std::vector<int>{3, 7}));
  EXPECT_EQ(g[2].bits, 3);
  EXPECT_EQ(g[2].dims, (std::vector<int>{0, 4, 2, 6}));
  // Interleaved: block i = (2i, 2i + 1).
  g = groups_from_block_bits({3, 1, 3, 2}, RopePairing::kInterleaved, 8, 8);
  EXPECT_EQ(g[2].dims, (std::vector<int>{0, 1, 4, 5}));
  // Partial rotary d = 8, d_r = 4, split-half: rotated (0,2), (1,3); tail pairs (4,6), (5,7).
  g = groups_from_block_bits({2, 2, 2, 2}, RopePairing::kSplitHalf, 8, 4);
  ASSERT_EQ(g.size(), 1u);
  EXPECT_EQ(g[0].dims, (std::vector<int>{0, 2, 1, 3, 4, 6, 5, 7}));
  // Every coordinate exactly once, for awkward shapes.
  for (int d : {8, 64, 96, 128, 256})
    for (int dr : {d, d / 2, 2})
      for (auto p : {RopePairing::kSplitHalf, RopePairing::kInterleaved}) {
        std::vector<int> bits(d / 2);
        for (int i = 0; i < d / 2; ++i) bits[i] = 1 + (i * 7) % 8;
        std::multiset<int> seen;
        for (const auto& grp : groups_from_block_bits(bits, p, d, dr))
          seen.insert(grp.dims.begin(), grp.dims.end());
        ASSERT_EQ(static_cast<int>(seen.size()), d);
        for (int x = 0; x < d; ++x) EXPECT_EQ(seen.count(x), 1u) << d << " " << dr;
      }
}

TEST(BlockGtqAllocate, DecisionsAndSummary) {
  BlockGtqInput in;
  in.shape = {2, 2, 8};
  in.pairing = RopePairing::kInterleaved;
  in.energies = {{8, 4, 2, 1}, {1, 1, 1, 1}, {0, 0, 5, 0}, {64, 16, 4, 1}};
  Allocation a = allocate_block_gtq(in, 2.5);
  ASSERT_EQ(a.heads.size(), 4u);
  double sum_j = 0;
  for (size_t i = 0; i < 4; ++i) {
    const auto& h = a.heads[i];
    EXPECT_EQ(h.layer, static_cast<int>(i) / 2);
    EXPECT_EQ(h.kv_head, static_cast<int>(i) % 2);
    EXPECT_EQ(h.side, Side::kK);
    EXPECT_TRUE(h.post_rope);
    EXPECT_EQ(h.kind, CodingKind::kTqGroups);
    EXPECT_EQ(h.block_bits, block_gtq_greedy(in.energies[i], 2.5).bits);
    EXPECT_EQ(h.budget_bits, 2 * 10);
    std::set<uint64_t> seeds;
    for (const auto& g : h.groups) seeds.insert(g.rotation_seed);
    EXPECT_EQ(seeds.size(), h.groups.size());
    sum_j += h.predicted_distortion;
  }
  EXPECT_EQ(a.heads[3].block_bits, (std::vector<int>{4, 3, 2, 1}));
  EXPECT_EQ(a.summary.method, Method::kBlockGtq);
  EXPECT_EQ(a.summary.budget_total, 4 * 20);
  EXPECT_EQ(a.summary.code_bits_used, 4 * 20);
  EXPECT_DOUBLE_EQ(a.summary.code_bits_per_dim, 2.5);
  EXPECT_DOUBLE_EQ(a.summary.predicted_distortion, sum_j);
  EXPECT_GT(a.summary.effective_bpd, a.summary.code_bits_per_dim);  // + fp16 norm per group
  // Same inputs, same decisions (seeds included).
  Allocation b = allocate_block_gtq(in, 2.5);
  for (size_t i = 0; i < 4; ++i)
    for (size_t g = 0; g < a.heads[i].groups.size(); ++g)
      EXPECT_EQ(a.heads[i].groups[g].rotation_seed, b.heads[i].groups[g].rotation_seed);

  in.energies[2] = {1, 2, 3};
  try {
    allocate_block_gtq(in, 2.5);
    ADD_FAILURE();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("energies[layer 1, head 0]"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("expected 4 RoPE blocks, got 3"), std::string::npos);
  }
  in.energies.pop_back();
  EXPECT_THROW(allocate_block_gtq(in, 2.5), Error);
}

}  // namespace
}  // namespace kvq::alloc
