// KV-COBRA: C1 against direct enumeration, damped C2 against a re-derivation of the update, exact
// C2 against brute force and a plain DP, KL reordering, joint K/V, measured tables, bad inputs.
#include <gtest/gtest.h>

#include <algorithm>
#include <cfenv>
#include <cmath>
#include <functional>
#include <numeric>
#include <random>

#include "kvq/alloc/cobra.hpp"
#include "kvq/util/error.hpp"

namespace kvq::alloc {
namespace {

// D(r, b) summed directly (no prefix sums).
double direct_d(const std::vector<double>& lam, int r, int b, double c) {
  double tail = 0, head = 0;
  for (int i = 0; i < static_cast<int>(lam.size()); ++i) (i < r ? head : tail) += lam[i];
  return tail + c * std::pow(2.0, -2.0 * b) * head;
}

// C1 by enumerating every (r, b) on the grid with r*b <= B: min D, ties to the smaller r, then
// the larger b. No feasible pair: rank 0, D = sum(lambda).
RankBits direct_c1(const std::vector<double>& lam, int64_t B, const CobraModel& m) {
  const int d = static_cast<int>(lam.size());
  RankBits best{0, 0, std::accumulate(lam.begin(), lam.end(), 0.0)};
  bool found = false;
  for (int r = m.r_min; r <= d; r += m.r_step)
    for (int b = m.b_max; b >= m.b_min; --b) {
      if (int64_t{r} * b > B) continue;
      double D = direct_d(lam, r, b, m.c);
      if (!found || D < best.distortion * (1 - 1e-13)) {
        best = {r, b, D};
        found = true;
      }
    }
  return best;
}

// Round mode per the documented rule, with rounding done by the FPU (ties to even).
RankBits direct_c1_round(const std::vector<double>& lam, int64_t B, const CobraModel& m) {
  const int d = static_cast<int>(lam.size());
  RankBits best{0, 0, std::accumulate(lam.begin(), lam.end(), 0.0)};
  bool found = false;
  std::fesetround(FE_TONEAREST);
  for (int r = m.r_min; r <= d && int64_t{r} * m.b_min <= B; r += m.r_step) {
    int b = static_cast<int>(std::nearbyint(static_cast<double>(B) / r));
    if (b < m.b_min) continue;
    b = std::min(b, m.b_max);
    double D = direct_d(lam, r, b, m.c);
    if (!found || D < best.distortion * (1 - 1e-13)) {
      best = {r, b, D};
      found = true;
    }
  }
  return best;
}

std::vector<double> power_law(int d, double scale, double alpha) {
  std::vector<double> v(d);
  for (int i = 0; i < d; ++i) v[i] = scale * std::pow(1.0 + i, -alpha);
  return v;
}

std::vector<double> random_spectrum(std::mt19937_64& rng, int d) {
  std::uniform_real_distribution<double> u(0, 1);
  int kind = static_cast<int>(rng() % 4);
  std::vector<double> v(d);
  if (kind == 0) {
    v = power_law(d, std::exp(4 * u(rng) - 2), 0.3 + 2.5 * u(rng));
  } else if (kind == 1) {
    for (auto& x : v) x = std::exp(6 * u(rng) - 3);
    std::sort(v.rbegin(), v.rend());
  } else if (kind == 2) {  // plateaus (ties) and zeros
    for (int i = 0; i < d; ++i) v[i] = i < d / 3 ? 2.0 : (i < 2 * d / 3 ? 0.5 : 0.0);
  } else {
    v = power_law(d, 1.0, 1.0);
    v[0] *= 50;  // one dominant direction
  }
  return v;
}

template <class F>
void expect_error(F f, const std::string& a, const std::string& b = "") {
  try {
    f();
    ADD_FAILURE() << "no error, wanted " << a;
  } catch (const Error& e) {
    std::string m = e.what();
    EXPECT_NE(m.find(a), std::string::npos) << m;
    EXPECT_NE(m.find(b), std::string::npos) << m;
  }
}

TEST(CobraModel, DistortionUsesCOneTwelfthByDefault) {
  CobraModel m;
  EXPECT_DOUBLE_EQ(m.c, 1.0 / 12);
  std::vector<double> lam = {4, 2, 1, 1};
  // r = 2, b = 3: tail 2 + (1/12) 2^-6 (4 + 2).
  EXPECT_DOUBLE_EQ(cobra_distortion(lam, 2, 3, m), 2.0 + 6.0 / (12.0 * 64.0));
  EXPECT_DOUBLE_EQ(cobra_distortion(lam, 0, 0, m), 8.0);
  m.c = 2.0;
  EXPECT_DOUBLE_EQ(cobra_distortion(lam, 4, 1, m), 8.0 * 2.0 / 4.0);
}

TEST(CobraC1, FloorModeMatchesDirectEnumeration) {
  std::mt19937_64 rng(3);
  for (int d : {4, 8, 16, 64, 96, 128}) {
    for (int trial = 0; trial < 12; ++trial) {
      auto lam = random_spectrum(rng, d);
      CobraModel m;
      if (trial % 3 == 1) m.r_min = 1, m.r_step = 1, m.b_min = 1;
      if (trial % 3 == 2) m.c = 2.0;
      for (int64_t B = 0; B <= int64_t{d} * m.b_max + 9; B += (d >= 64 ? 3 : 1)) {
        RankBits got = cobra_c1(lam, B, m);
        RankBits want = direct_c1(lam, B, m);
        ASSERT_NEAR(got.distortion, want.distortion, 1e-12 * std::max(1.0, want.distortion))
            << "d " << d << " B " << B;
        EXPECT_EQ(got.rank, want.rank) << "d " << d << " B " << B;
        EXPECT_EQ(got.bits, want.bits) << "d " << d << " B " << B;
        EXPECT_LE(int64_t{got.rank} * got.bits, B);
      }
    }
  }
}

TEST(CobraC1, RoundModeMatchesDirectEnumerationAndCanExceedBudget) {
  std::mt19937_64 rng(4);
  CobraModel m;
  m.rounding = C1Rounding::kRound;
  for (int d : {8, 32, 128})
    for (int trial = 0; trial < 8; ++trial) {
      auto lam = random_spectrum(rng, d);
      for (int64_t B = 0; B <= int64_t{d} * 9; ++B) {
        RankBits got = cobra_c1(lam, B, m);
        RankBits want = direct_c1_round(lam, B, m);
        ASSERT_NEAR(got.distortion, want.distortion, 1e-12 * std::max(1.0, want.distortion));
        EXPECT_EQ(got.rank, want.rank) << B;
        EXPECT_EQ(got.bits, want.bits) << B;
      }
    }
  // 34 equal directions, rest zero, B = 256: floor gives (34, 7); round gives round(7.53) = 8, so
  // 272 bits for a 256-bit budget (the reference's own example).
  std::vector<double> lam(128, 0.0);
  for (int i = 0; i < 34; ++i) lam[i] = 1.0;
  RankBits fl = cobra_c1(lam, 256, CobraModel{});
  EXPECT_EQ(fl.rank, 34);
  EXPECT_EQ(fl.bits, 7);
  RankBits rd = cobra_c1(lam, 256, m);
  EXPECT_EQ(rd.rank, 34);
  EXPECT_EQ(rd.bits, 8);
  // Halves round to even: B = 10, r = 4 -> 2.5 -> 2; B = 14, r = 4 -> 3.5 -> 4.
  std::vector<double> flat4 = {1, 1, 1, 1};
  CobraModel m4 = m;
  m4.r_min = 4;
  EXPECT_EQ(cobra_c1(flat4, 10, m4).bits, 2);
  EXPECT_EQ(cobra_c1(flat4, 14, m4).bits, 4);
}

TEST(CobraC1, InfeasibleBudgetKeepsNothing) {
  std::vector<double> lam = {3, 2, 1, 0};
  RankBits r = cobra_c1(lam, 3, CobraModel{});  // r_min * b_min = 4 > 3
  EXPECT_EQ(r.rank, 0);
  EXPECT_EQ(r.bits, 0);
  EXPECT_DOUBLE_EQ(r.distortion, 6.0);
  EXPECT_EQ(cobra_c1(lam, 4, CobraModel{}).rank, 2);
}

TEST(CobraC2Damped, StepByStepMatchesIndependentRederivation) {
  // Three heads, d = 8, 2 bits per dim: Bbar = 16, total 48, B_min = max(4, 16/4) = 4.
  std::vector<std::vector<double>> spectra = {
      {100, 50, 20, 10, 5, 2, 1, 0.5},
      {1, 0.9, 0.8, 0.7, 0.6, 0.5, 0.4, 0.3},
      {10, 1, 0.1, 0.01, 0.001, 0.0001, 0.00001, 0.000001}};
  CobraModel m;
  const int64_t total = 48;
  C2Result r = cobra_c2_damped(spectra, total, m);
  ASSERT_EQ(r.rounds.size(), 5u);
  EXPECT_EQ(r.head_floor, 4);

  // The update written out independently.
  std::vector<int64_t> b = {16, 16, 16};
  for (int round = 0; round < 5; ++round) {
    const DampedRound& st = r.rounds[round];
    EXPECT_EQ(st.start, b) << "round " << round;
    double D[3], mean = 0;
    for (int h = 0; h < 3; ++h) {
      D[h] = direct_c1(spectra[h], b[h], m).distortion;
      mean += D[h] / 3;
      EXPECT_NEAR(st.distortion[h], D[h], 1e-12 * D[h]) << "round " << round;
    }
    EXPECT_NEAR(st.mean_distortion, mean, 1e-12 * mean);
    int64_t after[3], sum = 0;
    for (int h = 0; h < 3; ++h) {
      double x = 0.3 * 16.0 * (std::sqrt(D[h] / mean) - 1.0);
      int64_t step = x < 0 ? -static_cast<int64_t>(std::floor(-x)) : static_cast<int64_t>(std::floor(x));
      EXPECT_EQ(st.step[h], step) << "round " << round << " head " << h;
      after[h] = std::max<int64_t>(4, b[h] + step);
      EXPECT_EQ(st.after_step[h], after[h]);
      sum += after[h];
    }
    EXPECT_EQ(st.sum_after_step, sum);
    for (int h = 0; h < 3; ++h) {
      int64_t renorm = std::max<int64_t>(4, static_cast<int64_t>(std::floor(
                                                static_cast<long double>(after[h]) * 48 / sum)));
      EXPECT_EQ(st.after_renorm[h], renorm) << "round " << round << " head " << h;
      b[h] = renorm;
    }
  }
  EXPECT_EQ(r.budgets, b);
  // The redistribution is visible: the heavy head gained, the light head lost.
  EXPECT_GT(r.budgets[0], 16);
  EXPECT_LT(r.budgets[2], 16);
  // Round 0 by hand: D*(16) per head, then steps.
  EXPECT_EQ(r.rounds[0].start, (std::vector<int64_t>{16, 16, 16}));
  int64_t assigned = std::accumulate(r.budgets.begin(), r.budgets.end(), int64_t{0});
  EXPECT_EQ(r.total_assigned, assigned);
  EXPECT_LE(assigned, total);  // the floors did not bind here: the renorm floor loses bits
  double obj = 0;
  for (int h = 0; h < 3; ++h) obj += direct_c1(spectra[h], r.budgets[h], m).distortion;
  EXPECT_NEAR(r.objective, obj, 1e-12 * obj);
}

// Brute force of the exact C2 problem with direct C1 curves.
double brute_force_c2(const std::vector<std::vector<double>>& spectra, int64_t total, int64_t bmin,
                      int64_t bmax, const CobraModel& m) {
  const int n = static_cast<int>(spectra.size());
  std::vector<std::vector<double>> curve(n, std::vector<double>(bmax + 1));
  for (int h = 0; h < n; ++h)
    for (int64_t B = bmin; B <= bmax; ++B) curve[h][B] = direct_c1(spectra[h], B, m).distortion;
  double best = INFINITY;
  std::function<void(int, int64_t, double)> rec = [&](int h, int64_t left, double acc) {
    if (h == n - 1) {
      if (left >= bmin && left <= bmax) best = std::min(best, acc + curve[h][left]);
      return;
    }
    for (int64_t B = bmin; B <= bmax && B <= left; ++B) rec(h + 1, left - B, acc + curve[h][B]);
  };
  rec(0, total, 0.0);
  return best;
}

TEST(CobraC2Exact, MatchesBruteForce) {
  std::mt19937_64 rng(11);
  int checked = 0;
  for (int trial = 0; trial < 150; ++trial) {
    const int d = 4 + 2 * static_cast<int>(rng() % 3);  // 4, 6, 8
    const int n = 2 + static_cast<int>(rng() % 3);      // 2..4 heads
    CobraModel m;
    m.b_max = 3 + static_cast<int>(rng() % 3);          // small caps keep the search small
    if (trial % 4 == 3) m.r_min = 1, m.r_step = 1, m.b_min = 1;
    std::vector<std::vector<double>> spectra;
    for (int h = 0; h < n; ++h) spectra.push_back(random_spectrum(rng, d));
    if (trial % 5 == 0) spectra[1] = spectra[0];  // identical heads: ties everywhere
    const double bpd = 0.5 * (1 + static_cast<int>(rng() % (2 * m.b_max)));
    const int64_t total = cobra_total_budget(n, d, bpd);
    BudgetFloor fl;
    const int64_t bmin = cobra_min_head_budget(static_cast<double>(total) / n, fl);
    const int64_t bmax = int64_t{d} * m.b_max;
    if (total < n * bmin || total > n * bmax) continue;
    C2Result r = cobra_c2_exact(spectra, total, m, fl);
    double truth = brute_force_c2(spectra, total, bmin, bmax, m);
    ASSERT_NEAR(r.objective, truth, 1e-11 * std::max(1.0, truth)) << "trial " << trial;
    EXPECT_EQ(std::accumulate(r.budgets.begin(), r.budgets.end(), int64_t{0}), total);
    EXPECT_EQ(r.total_assigned, total);
    for (int h = 0; h < n; ++h) {
      EXPECT_GE(r.budgets[h], bmin);
      EXPECT_LE(r.budgets[h], bmax);
      EXPECT_LE(int64_t{r.choice[h].rank} * r.choice[h].bits, r.budgets[h]);
      EXPECT_NEAR(r.choice[h].distortion, direct_c1(spectra[h], r.budgets[h], m).distortion,
                  1e-12 * std::max(1.0, r.choice[h].distortion));
      const RankBits c1 = cobra_c1(spectra[h], r.budgets[h], m);
      EXPECT_EQ(r.choice[h].rank, c1.rank);
      EXPECT_EQ(r.choice[h].bits, c1.bits);
    }
    EXPECT_LE(r.exact.lower_bound, r.objective + 1e-9 * std::max(1.0, r.objective));
    ++checked;
  }
  EXPECT_GT(checked, 100);
}

// Plain DP over heads x budget with direct C1 curves: the fallback the fast solver must agree with.
double plain_dp(const std::vector<std::vector<double>>& spectra, int64_t total, int64_t bmin,
                int64_t bmax, const CobraModel& m) {
  std::vector<double> f(total + 1, INFINITY), g;
  f[0] = 0;
  for (const auto& lam : spectra) {
    std::vector<double> curve(bmax + 1);
    for (int64_t B = bmin; B <= bmax; ++B) curve[B] = cobra_c1(lam, B, m).distortion;
    g.assign(total + 1, INFINITY);
    for (int64_t used = 0; used <= total; ++used) {
      if (!std::isfinite(f[used])) continue;
      for (int64_t B = bmin; B <= bmax && used + B <= total; ++B)
        g[used + B] = std::min(g[used + B], f[used] + curve[B]);
    }
    f.swap(g);
  }
  return f[total];
}

TEST(CobraC2Exact, MatchesPlainDpAtMediumScale) {
  std::mt19937_64 rng(12);
  for (int trial = 0; trial < 16; ++trial) {
    const int d = trial % 2 ? 16 : 32;
    const int n = 12;
    CobraModel m;
    std::vector<std::vector<double>> spectra;
    for (int h = 0; h < n; ++h) spectra.push_back(random_spectrum(rng, d));
    const double bpd = std::vector<double>{0.5, 1.0, 1.5, 2.0, 3.0, 5.0}[trial % 6];
    const int64_t total = cobra_total_budget(n, d, bpd);
    const int64_t bmin = cobra_min_head_budget(static_cast<double>(total) / n, {});
    C2Result r = cobra_c2_exact(spectra, total, m);
    double truth = plain_dp(spectra, total, bmin, int64_t{d} * m.b_max, m);
    ASSERT_NEAR(r.objective, truth, 1e-11 * std::max(1.0, truth)) << "trial " << trial;
    EXPECT_EQ(r.total_assigned, total);
  }
}

// The model path builds each head's staircase and hull directly from the (r, b) grid, skipping
// dominated options and pushing runs of convex chain-0 points in bulk. Independent check: the
// generic path, make_curve() over every grid option (plus rank 0), at full head size, with steep
// spectra (options of wider b interleave with chain 0), plateaus and zeros (no bulk runs), models
// where the dominance skip is off (q(b_min) > 1/4), odd rank steps and head caps.
TEST(CobraC2Exact, ModelStaircasesMatchGenericCurvesOverAllOptions) {
  std::mt19937_64 rng(15);
  std::uniform_real_distribution<double> u(0, 1);
  int checked = 0, with_dp = 0;
  for (int trial = 0; trial < 36; ++trial) {
    const int d = std::vector<int>{32, 64, 128}[trial % 3];
    const int n = 16 + static_cast<int>(rng() % 24);
    CobraModel m;
    if (trial % 4 == 1) m.c = 2.0, m.b_min = 1;  // q(b_min) = 1/2: no dominance skip
    if (trial % 4 == 2) m.r_min = 1, m.r_step = 3, m.b_max = 6;
    if (trial % 4 == 3) m.b_min = 1;
    std::vector<std::vector<double>> spectra;
    for (int h = 0; h < n; ++h) {
      if (h > 0 && rng() % 6 == 0) {
        spectra.push_back(spectra[rng() % h]);  // identical heads
        continue;
      }
      if (rng() % 4 == 0) {
        spectra.push_back(random_spectrum(rng, d));
      } else {
        spectra.push_back(power_law(d, std::exp(4 * u(rng) - 2), 0.3 + 2.7 * u(rng)));
      }
    }
    const int64_t head_max = trial % 5 == 4 ? int64_t{d} * m.b_max / 2 : 0;
    for (double bpd : {0.5, 1.0, 2.0, 3.0, 4.0}) {
      if (bpd > m.b_max) continue;
      const int64_t total = cobra_total_budget(n, d, bpd);
      BudgetFloor fl;
      const int64_t bmin = cobra_min_head_budget(static_cast<double>(total) / n, fl);
      const int64_t bmax = head_max > 0 ? head_max : int64_t{d} * m.b_max;
      if (total < n * bmin || total > n * bmax || bmax < bmin) continue;
      C2Result r = cobra_c2_exact(spectra, total, m, fl, head_max);
      std::vector<HeadCurve> curves;
      for (const auto& lam : spectra) {
        std::vector<CurveOption> opts = {{0, 0, std::accumulate(lam.begin(), lam.end(), 0.0)}};
        for (int rank = m.r_min; rank <= d; rank += m.r_step)
          for (int b = m.b_min; b <= m.b_max; ++b)
            opts.push_back({rank, b, cobra_distortion(lam, rank, b, m)});
        curves.push_back(make_curve(opts, bmin, bmax));
      }
      ExactSolution g = solve_exact_budget(curves, total);
      ASSERT_NEAR(r.objective, g.objective, 1e-12 * std::max(1.0, g.objective))
          << "trial " << trial << " bpd " << bpd;
      EXPECT_EQ(r.total_assigned, total);
      for (int h = 0; h < n; ++h) {
        EXPECT_EQ(r.choice[h].distortion, curve_value(curves[h], r.budgets[h])) << h;
        // The decision is C1 at the final budget, to the bit (rank, bits and D).
        const RankBits c1 = cobra_c1(spectra[h], r.budgets[h], m);
        EXPECT_EQ(r.choice[h].rank, c1.rank) << h;
        EXPECT_EQ(r.choice[h].bits, c1.bits) << h;
        EXPECT_EQ(r.choice[h].distortion, c1.distortion) << h;
      }
      with_dp += r.exact.free_heads > 0;
      ++checked;
    }
  }
  EXPECT_GT(checked, 120);
  EXPECT_GT(with_dp, 10);  // the gap-closing DP ran on these too
}

TEST(CobraC2Exact, NeverWorseThanDampedAndMeetsBudgetExactly) {
  std::mt19937_64 rng(13);
  int compared = 0;
  for (int trial = 0; trial < 60; ++trial) {
    const int d = 32, n = 16;
    std::vector<std::vector<double>> spectra;
    for (int h = 0; h < n; ++h) spectra.push_back(random_spectrum(rng, d));
    const double bpd = 0.5 + 0.25 * static_cast<double>(trial % 12);
    const int64_t total = cobra_total_budget(n, d, bpd);
    C2Result damped = cobra_c2_damped(spectra, total, CobraModel{});
    C2Result exact = cobra_c2_exact(spectra, total, CobraModel{});
    EXPECT_EQ(exact.total_assigned, total);
    // The damped result may overshoot the total (only through the B_min floor); then it had
    // more bits than the exact solver and the comparison says nothing.
    if (damped.total_assigned <= total) {
      EXPECT_LE(exact.objective, damped.objective * (1 + 1e-12));
      ++compared;
    }
    EXPECT_LE(exact.objective, 1e-12 + (1 + 1e-12) * [&] {
      double u = 0;
      for (double x : exact.uniform_distortion) u += x;
      return u;
    }());
  }
  EXPECT_GT(compared, 30);
}

TEST(CobraC2Exact, DeterministicAndScaleFree) {
  std::mt19937_64 rng(14);
  std::vector<std::vector<double>> spectra;
  for (int h = 0; h < 64; ++h) spectra.push_back(random_spectrum(rng, 32));
  for (int h = 1; h < 64; h += 3) spectra[h] = spectra[0];  // many exact ties
  const int64_t total = cobra_total_budget(64, 32, 1.5);
  C2Result a = cobra_c2_exact(spectra, total, CobraModel{});
  C2Result b = cobra_c2_exact(spectra, total, CobraModel{});
  EXPECT_EQ(a.budgets, b.budgets);
  // Scaling every spectrum scales the objective and changes nothing else (tolerances relative).
  auto tiny = spectra;
  for (auto& s : tiny)
    for (auto& x : s) x *= 1e-12;
  C2Result t = cobra_c2_exact(tiny, total, CobraModel{});
  EXPECT_NEAR(t.objective, 1e-12 * a.objective, 1e-9 * t.objective);
}

TEST(CobraC2, PowerLawPanelDampedLowersDistortionSpread) {
  // 32 layers x 8 heads, d = 128, power-law spectra with spread scales and decays.
  std::mt19937_64 rng(21);
  std::uniform_real_distribution<double> u(0, 1);
  std::vector<std::vector<double>> spectra;
  for (int h = 0; h < 256; ++h) spectra.push_back(power_law(128, std::exp(3 * u(rng)), 0.6 + 1.4 * u(rng)));
  const int64_t total = cobra_total_budget(256, 128, 1.0);
  C2Result none = cobra_c2_none(spectra, total, CobraModel{});
  C2Result damped = cobra_c2_damped(spectra, total, CobraModel{});
  C2Result exact = cobra_c2_exact(spectra, total, CobraModel{});
  auto stdev = [](const C2Result& r) {
    std::vector<double> v;
    for (const auto& c : r.choice) v.push_back(c.distortion);
    return population_std(v);
  };
  EXPECT_DOUBLE_EQ(population_std(damped.uniform_distortion), stdev(none));
  EXPECT_LT(stdev(damped), 0.8 * stdev(none));
  EXPECT_LT(exact.objective, none.objective);
  ASSERT_LE(damped.total_assigned, total);
  EXPECT_LE(exact.objective, damped.objective);
  EXPECT_EQ(exact.total_assigned, total);
}

TEST(CobraKl, ReorderingPermutationAndWeights) {
  KlOrder o = kl_reorder({4, 3, 2, 1}, {0.1, 1, 10, 0.5});
  EXPECT_EQ(o.perm, (std::vector<int>{2, 1, 3, 0}));
  EXPECT_EQ(o.weights, (std::vector<double>{20, 3, 0.5, 0.4}));
  // Ties keep the original order.
  o = kl_reorder({2, 1, 1}, {1, 2, 2});
  EXPECT_EQ(o.perm, (std::vector<int>{0, 1, 2}));
  expect_error([] { kl_reorder({1, 1}, {1}); }, "query_variance", "got 1");
  expect_error([] { kl_reorder({1, 1}, {1, -1}); }, "query_variance", "value 1");

  // q_var_i = u_i^T Sigma_Q u_i.
  Eigen::MatrixXd sq = Eigen::MatrixXd::Zero(3, 3);
  sq.diagonal() << 1, 2, 3;
  Eigen::MatrixXd U = Eigen::MatrixXd::Identity(3, 3);
  EXPECT_EQ(query_variance_along(sq, U), (std::vector<double>{1, 2, 3}));
  Eigen::MatrixXd R(3, 3);
  R << 0, 1, 0, 1, 0, 0, 0, 0, 1;  // swap first two directions
  EXPECT_EQ(query_variance_along(sq, R), (std::vector<double>{2, 1, 3}));
}

std::vector<CobraHeadInput> panel_inputs(const Shape& s, std::mt19937_64& rng, bool with_basis) {
  std::vector<CobraHeadInput> in;
  for (int i = 0; i < s.n_heads(); ++i) {
    CobraHeadInput h;
    h.eigenvalues = random_spectrum(rng, s.head_dim);
    if (with_basis) {
      Eigen::MatrixXd g = Eigen::MatrixXd::Random(s.head_dim, s.head_dim);
      h.eigenvectors = Eigen::HouseholderQR<Eigen::MatrixXd>(g).householderQ();
      h.mean = Eigen::VectorXd::Random(s.head_dim);
    }
    h.query_variance.resize(s.head_dim);
    for (auto& q : h.query_variance) q = std::exp(std::normal_distribution<double>(0, 1)(rng));
    in.push_back(std::move(h));
  }
  return in;
}

TEST(CobraAllocate, DecisionsCarryBasisMeanAndBudgets) {
  std::mt19937_64 rng(31);
  Shape s{2, 2, 16};
  auto in = panel_inputs(s, rng, true);
  for (C2Kind c2 : {C2Kind::kNone, C2Kind::kDamped, C2Kind::kExact})
    for (bool kl : {false, true}) {
      CobraOptions opt;
      opt.c2 = c2;
      opt.kl = kl;
      Allocation a = allocate_cobra(s, Side::kK, in, 1.5, opt);
      ASSERT_EQ(a.heads.size(), 4u);
      EXPECT_EQ(a.summary.budget_total, 4 * 16 * 3 / 2);
      if (c2 == C2Kind::kExact) {
        EXPECT_EQ(a.summary.method, Method::kCobraDp);
        EXPECT_EQ(a.summary.budget_assigned, a.summary.budget_total);
      } else {
        EXPECT_EQ(a.summary.method, kl ? Method::kCobraKl : Method::kCobraMse);
      }
      int64_t code = 0;
      double pred = 0;
      for (int i = 0; i < 4; ++i) {
        const HeadDecision& h = a.heads[i];
        EXPECT_EQ(h.kind, CodingKind::kLowRankHadamard);
        EXPECT_FALSE(h.post_rope);
        EXPECT_LE(h.rank * h.bits, h.budget_bits);
        ASSERT_EQ(h.basis.size(), static_cast<size_t>(16 * h.rank));
        ASSERT_EQ(h.mean.size(), 16u);
        std::vector<int> perm(16);
        std::iota(perm.begin(), perm.end(), 0);
        if (kl) perm = kl_reorder(in[i].eigenvalues, in[i].query_variance).perm;
        for (int r = 0; r < 16; ++r)
          for (int j = 0; j < h.rank; ++j)
            EXPECT_EQ(h.basis[r * h.rank + j], static_cast<float>(in[i].eigenvectors(r, perm[j])));
        EXPECT_EQ(h.mean[3], static_cast<float>(in[i].mean(3)));
        code += h.rank * h.bits;
        pred += h.predicted_distortion;
      }
      EXPECT_EQ(a.summary.code_bits_used, code);
      EXPECT_DOUBLE_EQ(a.summary.code_bits_per_dim, code / 64.0);
      EXPECT_NEAR(a.summary.predicted_distortion, pred, 1e-12 * pred);
      EXPECT_EQ(a.summary.heads_over_budget, 0);
    }
}

TEST(CobraAllocate, RoundModeRecordsOverBudgetHeads) {
  Shape s{1, 1, 128};
  std::vector<CobraHeadInput> in(1);
  in[0].eigenvalues.assign(128, 0.0);
  for (int i = 0; i < 34; ++i) in[0].eigenvalues[i] = 1.0;
  CobraOptions opt;
  opt.c2 = C2Kind::kNone;
  opt.model.rounding = C1Rounding::kRound;
  Allocation a = allocate_cobra(s, Side::kK, in, 2.0, opt);
  EXPECT_EQ(a.heads[0].rank * a.heads[0].bits, 272);
  EXPECT_EQ(a.summary.heads_over_budget, 1);
  EXPECT_EQ(a.summary.bits_over_budget, 16);
  opt.c2 = C2Kind::kExact;
  expect_error([&] { allocate_cobra(s, Side::kK, in, 2.0, opt); }, "c1_rounding", "needs 'floor'");
}

TEST(CobraAllocate, NonIntegerBpdBudgets) {
  std::mt19937_64 rng(41);
  Shape s{3, 2, 10};
  auto in = panel_inputs(s, rng, false);
  CobraOptions opt;
  opt.c2 = C2Kind::kExact;
  for (double bpd : {0.5, 1.5, 0.45}) {
    Allocation a = allocate_cobra(s, Side::kV, in, bpd, opt);
    EXPECT_EQ(a.summary.budget_total, std::llround(60 * bpd)) << bpd;
    EXPECT_EQ(a.summary.budget_assigned, a.summary.budget_total);
    EXPECT_TRUE(a.heads[0].basis.empty());
    EXPECT_EQ(a.heads[0].side, Side::kV);
  }
}

TEST(CobraAllocate, JointKvSplitsOneBudgetExactly) {
  std::mt19937_64 rng(51);
  Shape s{1, 2, 6};
  CobraModel m;
  m.b_max = 4;
  for (int trial = 0; trial < 20; ++trial) {
    auto k = panel_inputs(s, rng, false), v = panel_inputs(s, rng, false);
    for (auto& h : v) h.eigenvalues = power_law(6, 5.0, 0.2);  // flat V spectra
    CobraOptions opt;
    opt.c2 = C2Kind::kExact;
    opt.model = m;
    const double bpd = 1.0 + 0.5 * (trial % 4);
    Allocation a = allocate_cobra_joint(s, k, v, bpd, opt);
    ASSERT_EQ(a.heads.size(), 4u);
    EXPECT_EQ(a.heads[0].side, Side::kK);
    EXPECT_EQ(a.heads[3].side, Side::kV);
    const int64_t total = std::llround(2 * 2 * 6 * bpd);
    EXPECT_EQ(a.summary.budget_total, total);
    int64_t sum = 0;
    for (const auto& h : a.heads) sum += h.budget_bits;
    EXPECT_EQ(sum, total);
    std::vector<std::vector<double>> all = {k[0].eigenvalues, k[1].eigenvalues, v[0].eigenvalues,
                                            v[1].eigenvalues};
    const int64_t bmin = cobra_min_head_budget(6 * bpd, {});
    double truth = brute_force_c2(all, total, bmin, 6 * m.b_max, m);
    EXPECT_NEAR(a.summary.predicted_distortion, truth, 1e-11 * std::max(1.0, truth));
  }
  CobraOptions damped;
  auto k = panel_inputs(s, rng, false);
  expect_error([&] { allocate_cobra_joint(s, k, k, 1.0, damped); }, "c2",
               "joint K/V needs the exact solver");
}

// Brute force over measured tables: D*_h(B) = min over entries with r*b <= B.
TEST(CobraMeasured, ExactOverMeasuredTablesMatchesBruteForce) {
  std::mt19937_64 rng(61);
  std::uniform_real_distribution<double> u(0, 1);
  for (int trial = 0; trial < 60; ++trial) {
    const int d = 6, n = 3;
    std::vector<MeasuredTable> tables(n);
    for (auto& t : tables) {
      t.ranks = {2, 4, 6};
      t.b_min = 1;
      t.b_max = 4;
      for (int i = 0; i < 3 * 4; ++i) t.mse.push_back(u(rng));  // no structure at all
      if (trial % 2) t.rank0_mse = 1.0 + u(rng);
    }
    const double bpd = 1.0 + 0.5 * (trial % 4);
    const int64_t total = cobra_total_budget(n, d, bpd);
    BudgetFloor fl;
    const int64_t bmin = cobra_min_head_budget(d * bpd, fl), bmax = d * 4;
    C2Result r = cobra_c2_exact_measured(tables, d, total, fl);
    auto dstar = [&](const MeasuredTable& t, int64_t B) {
      double best = std::isnan(t.rank0_mse) ? INFINITY : t.rank0_mse;
      for (int i = 0; i < 3; ++i)
        for (int b = 1; b <= 4; ++b)
          if (int64_t{t.ranks[i]} * b <= B) best = std::min(best, t.mse[i * 4 + (b - 1)]);
      return best;
    };
    double truth = INFINITY;
    for (int64_t b0 = bmin; b0 <= bmax; ++b0)
      for (int64_t b1 = bmin; b1 <= bmax; ++b1) {
        int64_t b2 = total - b0 - b1;
        if (b2 < bmin || b2 > bmax) continue;
        truth = std::min(truth, dstar(tables[0], b0) + dstar(tables[1], b1) + dstar(tables[2], b2));
      }
    ASSERT_NEAR(r.objective, truth, 1e-12) << "trial " << trial;
    EXPECT_EQ(r.total_assigned, total);
    for (int h = 0; h < n; ++h) {
      EXPECT_LE(int64_t{r.choice[h].rank} * r.choice[h].bits, r.budgets[h]);
      EXPECT_EQ(r.choice[h].distortion, dstar(tables[h], r.budgets[h]));
    }
  }
  Shape s{1, 1, 6};
  MeasuredTable bad;
  bad.ranks = {2, 4};
  bad.mse = {1, 2, 3};
  expect_error([&] { allocate_cobra_measured(s, Side::kK, {bad}, {}, 1.0); }, "tables[0]",
               "mse has 3 entries, expected 14");
}

TEST(CobraInputs, BadInputsThrowWithFieldAndValue) {
  Shape s{1, 2, 4};
  std::vector<CobraHeadInput> in(2);
  in[0].eigenvalues = {4, 3, 2, 1};
  in[1].eigenvalues = {4, 3, 2, 1};
  CobraOptions opt;
  expect_error([&] { allocate_cobra(s, Side::kK, in, 0.0, opt); }, "bpd", "got 0");
  expect_error([&] { allocate_cobra(s, Side::kK, in, -1.0, opt); }, "bpd", "-1");
  expect_error([&] { allocate_cobra(s, Side::kK, in, 9.0, opt); }, "bpd", "above b_max=8");
  expect_error([&] { allocate_cobra(s, Side::kK, in, 0.5, opt); }, "bpd", "below the per-head floor B_min=4");
  auto bad = in;
  bad[1].eigenvalues = {1, 2, 3, 4};
  expect_error([&] { allocate_cobra(s, Side::kK, bad, 1.0, opt); }, "eigenvalues[K layer 0, head 1]",
               "not descending at index 1");
  bad[1].eigenvalues = {4, 3, 2, -1};
  expect_error([&] { allocate_cobra(s, Side::kK, bad, 1.0, opt); }, "eigenvalues", "negative: -1");
  bad[1].eigenvalues = {4, 3, NAN, 1};
  expect_error([&] { allocate_cobra(s, Side::kK, bad, 1.0, opt); }, "eigenvalues", "not finite");
  bad[1].eigenvalues = {4, 3, 2};
  expect_error([&] { allocate_cobra(s, Side::kK, bad, 1.0, opt); }, "eigenvalues", "expected 4 values, got 3");
  bad[1].eigenvalues = {4, 3, 2, -1e-20};  // eigen-solver noise is accepted as 0
  EXPECT_NO_THROW(allocate_cobra(s, Side::kK, bad, 1.0, opt));
  bad = in;
  bad.pop_back();
  expect_error([&] { allocate_cobra(s, Side::kK, bad, 1.0, opt); }, "K", "expected 2 heads");
  CobraOptions kl = opt;
  kl.kl = true;
  expect_error([&] { allocate_cobra(s, Side::kK, in, 1.0, kl); }, "query_variance", "required");
  bad = in;
  bad[0].eigenvectors = Eigen::MatrixXd::Identity(3, 3);
  expect_error([&] { allocate_cobra(s, Side::kK, bad, 1.0, opt); }, "eigenvectors", "expected 4x4");
  CobraOptions badc = opt;
  badc.model.c = 0;
  expect_error([&] { allocate_cobra(s, Side::kK, in, 1.0, badc); }, "c", "c > 0");
  badc = opt;
  badc.damped.damping = -1;
  expect_error([&] { allocate_cobra(s, Side::kK, in, 1.0, badc); }, "damping", "-1");
  expect_error([] { c1_rounding_from_string("ceil"); }, "c1_rounding", "valid: floor, round");
  expect_error([] { c2_kind_from_string("dp"); }, "c2", "valid: none, damped, exact");
  EXPECT_EQ(c1_rounding_from_string(to_string(C1Rounding::kRound)), C1Rounding::kRound);
  EXPECT_EQ(c2_kind_from_string(to_string(C2Kind::kExact)), C2Kind::kExact);
}

}  // namespace
}  // namespace kvq::alloc
