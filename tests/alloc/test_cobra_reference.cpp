// KV-COBRA reference mode (C2Kind::kReference): the library against a second, plain transcription
// of the reference code's C1 + damped C2 written here (Python semantics spelled out: // floors,
// int() truncates toward zero, round() halves to even, numpy sums pairwise), on random spectra;
// plus a 3-head case worked by hand.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "kvq/alloc/cobra.hpp"
#include "kvq/util/error.hpp"

namespace kvq::alloc {
namespace {

// ---- Python / numpy semantics ----

int64_t py_floordiv(int64_t a, int64_t b) {  // a // b
  int64_t q = a / b;
  if ((a % b != 0) && ((a < 0) != (b < 0))) q -= 1;
  return q;
}

int64_t py_int(double x) { return static_cast<int64_t>(std::trunc(x)); }  // int(x)

// int(round(a / b)) for integers, a >= 0, b > 0: nearest, halves to the even neighbour.
int64_t py_round_div(int64_t a, int64_t b) {
  int64_t q = a / b, twice_rem = 2 * (a % b);
  if (twice_rem > b || (twice_rem == b && q % 2 == 1)) q += 1;
  return q;
}

// numpy's float64 add.reduce on a contiguous array: 0.0 + pairwise(x), pairwise as in numpy's
// loops_utils.h (plain loop under 8; 8 lanes up to 128; halves, the first a multiple of 8, above).
double np_pairwise(const double* x, long n) {
  if (n < 8) {
    double acc = 0.0;
    for (long i = 0; i < n; ++i) acc = acc + x[i];
    return acc;
  }
  if (n > 128) {
    long half = (n / 2) - (n / 2) % 8;
    double left = np_pairwise(x, half);
    double right = np_pairwise(x + half, n - half);
    return left + right;
  }
  double lane[8];
  for (int j = 0; j < 8; ++j) lane[j] = x[j];
  long full = n - n % 8;
  long i = 8;
  while (i < full) {
    for (int j = 0; j < 8; ++j) lane[j] = lane[j] + x[i + j];
    i += 8;
  }
  double a = lane[0] + lane[1], b = lane[2] + lane[3], c = lane[4] + lane[5], e = lane[6] + lane[7];
  double acc = (a + b) + (c + e);
  while (i < n) acc = acc + x[i++];
  return acc;
}
double np_sum(const std::vector<double>& v, long from, long to) {  // v[from:to].sum()
  if (to <= from) return 0.0;
  return 0.0 + np_pairwise(v.data() + from, to - from);
}

double bennett(int b) { return (1.0 / 12.0) * std::pow(2.0, -2.0 * b); }  // 2^-2b / 12

struct Pick {
  int64_t r, b;
};

// optimal_rank_bits(ev, B, d, min_rank=2, min_bits=2, rounding) of the reference.
Pick ref_optimal_rank_bits(const std::vector<double>& lam, int64_t B, int64_t d, bool floor_mode) {
  const int64_t min_rank = 2, min_bits = 2, max_bits = 8;
  if (np_sum(lam, 0, static_cast<long>(lam.size())) < 1e-30) {
    int64_t r = std::max(min_rank, py_floordiv(B, std::max<int64_t>(min_bits, 1)));
    return {r, std::max(min_bits, py_floordiv(B, std::max<int64_t>(r, 1)))};
  }
  int64_t r_max = std::min(d, std::max(min_rank, py_floordiv(B, std::max<int64_t>(min_bits, 1))));
  std::vector<int64_t> rs;
  for (int64_t r = std::max<int64_t>(min_rank, 2); r < r_max + 1; r += 2) rs.push_back(r);
  if (rs.empty()) rs.push_back(min_rank);
  int64_t best_r = rs[0], best_b = min_bits;
  double best_D = INFINITY;
  for (int64_t r : rs) {
    int64_t b_int = floor_mode ? py_floordiv(B, r) : py_round_div(B, r);
    if (b_int < min_bits) continue;
    b_int = std::min(b_int, max_bits);
    const long n = static_cast<long>(lam.size());
    double proj_loss = r < n ? np_sum(lam, static_cast<long>(r), n) : 0.0;
    double quant_loss = bennett(static_cast<int>(b_int)) * np_sum(lam, 0, static_cast<long>(r));
    double D = proj_loss + quant_loss;
    if (D < best_D) best_D = D, best_r = r, best_b = b_int;
  }
  return {best_r, best_b};
}

double ref_head_distortion(const std::vector<double>& ev, int64_t r, int64_t b) {
  const long n = static_cast<long>(ev.size());
  double proj_loss = r < n ? np_sum(ev, static_cast<long>(r), n) : 0.0;
  double quant = bennett(static_cast<int>(b)) * np_sum(ev, 0, static_cast<long>(r));
  return proj_loss + quant;
}

// What water_filling_budgets and _rank_bit_configs do with C1's answer.
Pick ref_configured(const std::vector<double>& ev, int64_t B, int64_t d, bool floor_mode) {
  Pick p = ref_optimal_rank_bits(ev, B, d, floor_mode);
  int64_t b = std::max<int64_t>(2, std::min<int64_t>(8, p.b));
  int64_t r = std::max<int64_t>(2, std::min<int64_t>(d, py_floordiv(B, b)));
  return {r, b};
}

struct RefResult {
  std::vector<int64_t> budgets;
  std::vector<Pick> picks;
};

// water_filling_budgets(eigvals, avg_B, ..., d, iterations=5, damping=0.3, rounding), then the
// per-head configs; avg_B = int(bpd * d).
RefResult ref_allocate(const std::vector<std::vector<double>>& eig, double bpd, int64_t d,
                       bool floor_mode, int iterations = 5, double damping = 0.3) {
  const int64_t avg_B = py_int(bpd * static_cast<double>(d));
  const int64_t n = static_cast<int64_t>(eig.size());
  std::vector<int64_t> budgets(n, avg_B);
  const int64_t total_B = avg_B * n;
  const int64_t B_min = std::max<int64_t>(4, py_floordiv(avg_B, 4));
  for (int it = 0; it < iterations; ++it) {
    std::vector<double> distortions(n);
    for (int64_t k = 0; k < n; ++k) {
      Pick p = ref_configured(eig[k], budgets[k], d, floor_mode);
      distortions[k] = ref_head_distortion(eig[k], p.r, p.b);
    }
    double mean_D = std::max(np_sum(distortions, 0, static_cast<long>(n)) / static_cast<double>(n), 1e-30);
    for (int64_t k = 0; k < n; ++k) {
      double ratio = distortions[k] / mean_D;
      int64_t adj = py_int(static_cast<double>(avg_B) * (std::sqrt(ratio) - 1) * damping);
      budgets[k] = std::max(B_min, budgets[k] + adj);
    }
    int64_t current = 0;
    for (int64_t v : budgets) current += v;
    if (current > 0)
      for (int64_t k = 0; k < n; ++k)
        // Python: int * int is exact, / is one correctly rounded division (exact operands here).
        budgets[k] = std::max(B_min, py_int(static_cast<double>(budgets[k] * total_B) /
                                            static_cast<double>(current)));
  }
  RefResult out;
  out.budgets = budgets;
  for (int64_t k = 0; k < n; ++k) out.picks.push_back(ref_configured(eig[k], budgets[k], d, floor_mode));
  return out;
}

// ---- Spectra ----

std::vector<double> random_spectrum(std::mt19937_64& rng, int d) {
  std::uniform_real_distribution<double> u(0, 1);
  std::vector<double> v(d);
  switch (rng() % 5) {
    case 0: {  // power law, random scale and slope
      double scale = std::exp(6 * u(rng) - 3), alpha = 0.2 + 2.5 * u(rng);
      for (int i = 0; i < d; ++i) v[i] = scale * std::pow(1.0 + i, -alpha);
      break;
    }
    case 1:  // log-uniform, sorted
      for (auto& x : v) x = std::exp(8 * u(rng) - 4);
      std::sort(v.rbegin(), v.rend());
      break;
    case 2: {  // a few outlier directions on a flat floor (RoPE-like keys)
      int k = 1 + static_cast<int>(rng() % 6);
      for (int i = 0; i < d; ++i) v[i] = i < k ? 20 + 200 * u(rng) : 0.05 + 0.1 * u(rng);
      std::sort(v.rbegin(), v.rend());
      break;
    }
    case 3:  // plateaus and exact zeros
      for (int i = 0; i < d; ++i) v[i] = i < d / 4 ? 3.0 : (i < d / 2 ? 0.25 : 0.0);
      break;
    default: {  // exponential decay
      const double rate = 0.02 + 0.3 * u(rng);
      for (int i = 0; i < d; ++i) v[i] = std::exp(-i * rate);
    }
  }
  return v;
}

void expect_same(const RefResult& want, const C2Result& got, const std::string& what) {
  ASSERT_EQ(got.budgets.size(), want.budgets.size()) << what;
  for (size_t h = 0; h < want.budgets.size(); ++h) {
    EXPECT_EQ(got.budgets[h], want.budgets[h]) << what << " head " << h;
    EXPECT_EQ(got.choice[h].rank, want.picks[h].r) << what << " head " << h;
    EXPECT_EQ(got.choice[h].bits, want.picks[h].b) << what << " head " << h;
  }
}

// ---- Tests ----

TEST(CobraReference, OracleSumsAsNumpy) {
  // The oracle's own sums, checked by hand where the order shows. 1e16 has ulp 2 and the even
  // mantissa, so 1e16 + 1 -> 1e16 (tie to even), 1e16 + 7 -> 1e16 + 8.
  // Nine values [1e16, 1 x 8]: lanes hold the first 8, no full stride follows (9 - 9 % 8 = 8), so
  // ((1e16 + 1) + (1 + 1)) + ((1 + 1) + (1 + 1)) = (1e16 + 2) + 4 = 1e16 + 6, then + 1 -> 1e16 + 8.
  // A left-to-right sum stays at 1e16.
  std::vector<double> v(9, 1.0);
  v[0] = 1e16;
  EXPECT_EQ(np_sum(v, 0, 9), 1e16 + 8);
  double seq = 0;
  for (double x : v) seq += x;
  EXPECT_EQ(seq, 1e16);
  // Under 8 values: left to right.
  EXPECT_EQ(np_sum(v, 0, 7), 1e16);
  // 17 values [1e16, 1 x 16]: lane 0 = 1e16 + 1 -> 1e16, lanes 1..7 = 2; ((1e16 + 2) + 4) + 8 =
  // 1e16 + 14, then + 1 (the 17th) -> 1e16 + 16 (tie: 1e16+14 has odd mantissa).
  std::vector<double> w(17, 1.0);
  w[0] = 1e16;
  EXPECT_EQ(np_sum(w, 0, 17), 1e16 + 16);
  // Python's round: halves to even.
  EXPECT_EQ(py_round_div(5, 2), 2);
  EXPECT_EQ(py_round_div(7, 2), 4);
  EXPECT_EQ(py_round_div(10, 4), 2);
  EXPECT_EQ(py_round_div(14, 4), 4);
  EXPECT_EQ(py_int(-1.9), -1);
  EXPECT_EQ(py_floordiv(-3, 2), -2);
}

// d = 6, bpd = 2: avg_B = 12, total 36, B_min = max(4, 12 // 4) = 4. q(b) = 2^-2b / 12:
// q(2) = 1/192, q(3) = 1/768, q(4) = 1/3072. Heads (sums under 8 values run left to right):
//   H0 = [8, 4, 2, 1, 1, 0] (sum 16), H1 = [2, 1, 1, 0, 0, 0] (sum 4), H2 = [1 x 6] (sum 6).
// Round 0, B = (12, 12, 12): ranks 2, 4, 6 with b = 6, 3, 2.
//   H0: D(2,6) = 4 + 12/49152, D(4,3) = 1 + 15/768, D(6,2) = 16/192 = 1/12 -> (6, 2); re-derived
//       r = 12 // 2 = 6. D = 1/12.
//   H1: D(4,3) = 0 + 4/768 = 1/192 beats D(6,2) = 1/48 and D(2,6) > 1 -> (4, 3), r = 12 // 3 = 4.
//   H2: D(6,2) = 6/192 = 1/32 (the others leave a tail >= 2) -> (6, 2).
//   mean = (16 + 1 + 6)/192 / 3 = 23/576.
//   steps: int(12 (sqrt(48/23) - 1) 0.3) = int(1.60) = 1; int(12 (sqrt(3/23) - 1) 0.3) =
//   int(-2.30) = -2; int(12 (sqrt(18/23) - 1) 0.3) = int(-0.415) = 0 (toward zero; a floor
//   would give -1). -> (13, 10, 12), sum 35; renormalised int(13 * 36/35 = 13.37) = 13,
//   int(10.29) = 10, int(12.34) = 12: the lost bit is never given back (drift -1).
// Round 1, B = (13, 10, 12):
//   H0 at 13: b = 6, 3, 2 for ranks 2, 4, 6 -> (6, 2), 13 // 2 = 6 -> r = 6, D = 1/12.
//   H1 at 10: ranks 2, 4 (10 // 2 = 5 caps the grid): D(2,5) = 1 + 3/12288, D(4,2) = 1/48 ->
//       C1 says (4, 2), but r is re-derived as 10 // 2 = 5: D(5,2) = 0 + 4/192 = 1/48.
//   H2 at 12: 1/32. mean = (8 + 2 + 3)/96 / 3 = 13/288.
//   steps: int(12 (sqrt(24/13) - 1) 0.3) = int(1.29) = 1; int(12 (sqrt(6/13) - 1) 0.3) =
//   int(-1.15) = -1; int(12 (sqrt(9/13) - 1) 0.3) = int(-0.60) = 0 -> (14, 9, 12), sum 35;
//   renormalised int(14.4) = 14, int(9.26) = 9, 12.
// Round 2, B = (14, 9, 12): H0 (6, 2) [14 // 2 = 7, capped at d = 6]; H1 at 9: ranks 2, 4 ->
//   (4, 2), 9 // 2 = 4; H2 (6, 2). Same D as round 1 -> steps (1, -1, 0) -> (15, 8, 12), kept by
//   the renormalisation (15.43, 8.23, 12.34).
// Round 3, B = (15, 8, 12): H0 (6, 2); H1 at 8: (4, 2), 8 // 2 = 4; same D, same steps ->
//   (16, 7, 12), renormalised (16.46, 7.2, 12.34) -> (16, 7, 12).
// Round 4, B = (16, 7, 12): H0 (6, 2), D = 1/12; H1 at 7: the grid is rank 2 only (7 // 2 = 3),
//   b = 7 // 2 = 3: D(2,3) = 1 + 3/768 = 1.00390625, r = 7 // 3 = 2; H2 1/32.
//   mean = (1/12 + 1.00390625 + 1/32) / 3 = 0.372830.
//   steps: int(12 (sqrt(0.22351) - 1) 0.3) = int(-1.898) = -1; int(12 (sqrt(2.69267) - 1) 0.3)
//   = int(2.307) = 2; int(12 (sqrt(0.083819) - 1) 0.3) = int(-2.558) = -2 -> (15, 9, 10), sum 34;
//   renormalised int(15.88) = 15, int(9.53) = 9, int(10.59) = 10 (drift -2).
// Final, B = (15, 9, 10): H0 (6, 2); H1 (4, 2) [9 // 2 = 4]; H2 at 10: ranks 2, 4: D(2,5) =
//   4 + 2/12288, D(4,2) = 2 + 4/192 -> (4, 2), re-derived r = 10 // 2 = 5 (an odd rank).
TEST(CobraReference, ThreeHeadsByHand) {
  std::vector<std::vector<double>> spec = {
      {8, 4, 2, 1, 1, 0}, {2, 1, 1, 0, 0, 0}, {1, 1, 1, 1, 1, 1}};
  EXPECT_EQ(cobra_reference_head_budget(6, 2.0), 12);
  C2Result r = cobra_c2_reference(spec, 12, CobraModel{});
  EXPECT_EQ(r.total_target, 36);
  EXPECT_EQ(r.head_floor, 4);
  ASSERT_EQ(r.rounds.size(), 5u);
  EXPECT_EQ(r.rounds[0].step, (std::vector<int64_t>{1, -2, 0}));
  EXPECT_EQ(r.rounds[0].after_renorm, (std::vector<int64_t>{13, 10, 12}));
  EXPECT_DOUBLE_EQ(r.rounds[0].mean_distortion, 23.0 / 576.0);
  EXPECT_DOUBLE_EQ(r.rounds[1].distortion[1], 1.0 / 48.0);  // at the re-derived rank 5
  EXPECT_EQ(r.rounds[1].after_renorm, (std::vector<int64_t>{14, 9, 12}));
  EXPECT_EQ(r.rounds[2].after_renorm, (std::vector<int64_t>{15, 8, 12}));
  EXPECT_EQ(r.rounds[3].after_renorm, (std::vector<int64_t>{16, 7, 12}));
  EXPECT_DOUBLE_EQ(r.rounds[4].distortion[1], 1.00390625);
  EXPECT_EQ(r.rounds[4].step, (std::vector<int64_t>{-1, 2, -2}));
  EXPECT_EQ(r.rounds[4].sum_after_step, 34);
  EXPECT_EQ(r.budgets, (std::vector<int64_t>{15, 9, 10}));
  EXPECT_EQ(r.total_assigned, 34);
  ASSERT_EQ(r.choice.size(), 3u);
  EXPECT_EQ(r.choice[0].rank, 6);
  EXPECT_EQ(r.choice[0].bits, 2);
  EXPECT_EQ(r.choice[1].rank, 4);
  EXPECT_EQ(r.choice[1].bits, 2);
  EXPECT_EQ(r.choice[2].rank, 5);
  EXPECT_EQ(r.choice[2].bits, 2);
  EXPECT_DOUBLE_EQ(r.choice[2].distortion, 1.0 + 5.0 / 192.0);
  // The oracle agrees with the hand figures.
  RefResult o = ref_allocate(spec, 2.0, 6, true);
  EXPECT_EQ(o.budgets, (std::vector<int64_t>{15, 9, 10}));
  EXPECT_EQ(o.picks[2].r, 5);
}

TEST(CobraReference, SingleHeadChoiceMatchesOracle) {
  std::mt19937_64 rng(11);
  for (int d : {8, 64, 96, 128, 256})
    for (int trial = 0; trial < 6; ++trial) {
      auto lam = random_spectrum(rng, d);
      for (bool floor_mode : {true, false}) {
        CobraModel m;
        m.rounding = floor_mode ? C1Rounding::kFloor : C1Rounding::kRound;
        for (int64_t B = 0; B <= int64_t{d} * 9; B += (d >= 64 ? 5 : 1)) {
          Pick want = ref_configured(lam, B, d, floor_mode);
          RankBits got = cobra_c1_reference(lam, B, m);
          ASSERT_EQ(got.rank, want.r) << "d " << d << " B " << B << " floor " << floor_mode;
          ASSERT_EQ(got.bits, want.b) << "d " << d << " B " << B << " floor " << floor_mode;
          EXPECT_EQ(got.distortion, ref_head_distortion(lam, want.r, want.b));
        }
      }
    }
  // An all-zero head (sum below 1e-30): r = max(2, B // 2), b = max(2, B // r), then b <= 8 and
  // r = B // b re-derived: B = 40 -> r 20, b 2 -> r = min(d, 20).
  RankBits z = cobra_c1_reference(std::vector<double>(16, 0.0), 40, CobraModel{});
  EXPECT_EQ(z.rank, 16);
  EXPECT_EQ(z.bits, 2);
  EXPECT_EQ(z.distortion, 0.0);
}

TEST(CobraReference, RandomPanelsMatchOracle) {
  std::mt19937_64 rng(2026);
  int cases = 0;
  for (int d : {64, 128, 96, 256})
    for (int n_heads : {3, 24, 200}) {
      if (d == 256 && n_heads == 200) continue;  // keeps the test quick
      std::vector<std::vector<double>> spec;
      for (int h = 0; h < n_heads; ++h) spec.push_back(random_spectrum(rng, d));
      if (n_heads > 3) spec[1].assign(d, 0.0);  // a dead head
      for (double bpd : {1.5, 2.0, 3.0, 4.0, 2.3})
        for (bool floor_mode : {true, false}) {
          CobraModel m;
          m.rounding = floor_mode ? C1Rounding::kFloor : C1Rounding::kRound;
          RefResult want = ref_allocate(spec, bpd, d, floor_mode);
          C2Result got = cobra_c2_reference(spec, cobra_reference_head_budget(d, bpd), m);
          expect_same(want, got,
                      "d " + std::to_string(d) + " heads " + std::to_string(n_heads) + " bpd " +
                          std::to_string(bpd) + (floor_mode ? " floor" : " round"));
          ++cases;
        }
    }
  EXPECT_EQ(cases, 110);
}

TEST(CobraReference, RoundsAndDampingAreHonoured) {
  std::mt19937_64 rng(99);
  std::vector<std::vector<double>> spec;
  for (int h = 0; h < 40; ++h) spec.push_back(random_spectrum(rng, 128));
  for (int rounds : {0, 1, 3, 8})
    for (double damping : {0.1, 0.3, 0.75}) {
      DampedOptions o;
      o.rounds = rounds;
      o.damping = damping;
      RefResult want = ref_allocate(spec, 2.0, 128, true, rounds, damping);
      C2Result got = cobra_c2_reference(spec, 256, CobraModel{}, o);
      expect_same(want, got, "rounds " + std::to_string(rounds) + " damping " + std::to_string(damping));
    }
  // No rounds: the reference's V side (uniform budgets, C1 at int(bpd * d) each).
  DampedOptions none;
  none.rounds = 0;
  C2Result v = cobra_c2_reference(spec, 256, CobraModel{}, none);
  EXPECT_EQ(v.budgets, std::vector<int64_t>(40, 256));
}

TEST(CobraReference, AllocateRecordsTheMode) {
  std::mt19937_64 rng(7);
  Shape s{3, 2, 64};
  std::vector<CobraHeadInput> in;
  std::vector<std::vector<double>> spec;
  for (int i = 0; i < s.n_heads(); ++i) {
    CobraHeadInput h;
    h.eigenvalues = random_spectrum(rng, s.head_dim);
    spec.push_back(h.eigenvalues);
    in.push_back(h);
  }
  for (bool floor_mode : {true, false}) {
    CobraOptions opt;
    opt.c2 = C2Kind::kReference;
    opt.model.rounding = floor_mode ? C1Rounding::kFloor : C1Rounding::kRound;
    Allocation a = allocate_cobra(s, Side::kK, in, 1.5, opt);
    RefResult want = ref_allocate(spec, 1.5, 64, floor_mode);
    ASSERT_EQ(a.heads.size(), 6u);
    for (int i = 0; i < 6; ++i) {
      EXPECT_EQ(a.heads[i].budget_bits, want.budgets[i]) << i;
      EXPECT_EQ(a.heads[i].rank, want.picks[i].r) << i;
      EXPECT_EQ(a.heads[i].bits, want.picks[i].b) << i;
    }
    EXPECT_EQ(a.summary.method, Method::kCobraMse);
    EXPECT_EQ(a.summary.budget_total, 6 * 96);
    std::map<std::string, std::string> p(a.summary.params.begin(), a.summary.params.end());
    EXPECT_EQ(p["c2"], "reference");
    EXPECT_EQ(p["budget_rule"], "int(d * bpd) * heads");
    EXPECT_EQ(p["c1_rounding"], floor_mode ? "floor" : "round");
    EXPECT_EQ(p["head_floor"], "24");
  }
  // The default stays kvq's own damped C2 and its budget rule.
  Allocation k = allocate_cobra(s, Side::kK, in, 1.5, CobraOptions{});
  std::map<std::string, std::string> p(k.summary.params.begin(), k.summary.params.end());
  EXPECT_EQ(p["c2"], "damped");
  EXPECT_EQ(p["budget_rule"], "llround(heads * d * bpd)");
}

TEST(CobraReference, NameAndBadInput) {
  EXPECT_EQ(c2_kind_from_string("reference"), C2Kind::kReference);
  EXPECT_STREQ(to_string(C2Kind::kReference), "reference");
  // int(bpd * d): 0.3 * 10 = 3.0000000000000004 -> 3; 2.3 * 64 = 147.2 -> 147.
  EXPECT_EQ(cobra_reference_head_budget(10, 0.3), 3);
  EXPECT_EQ(cobra_reference_head_budget(64, 2.3), 147);
  auto expect_error = [](auto f, const std::string& field) {
    try {
      f();
      ADD_FAILURE() << "no error, wanted " << field;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(field), std::string::npos) << e.what();
    }
  };
  expect_error([] { cobra_reference_head_budget(64, -1.0); }, "bpd");
  expect_error([] { cobra_c2_reference({}, 8, CobraModel{}); }, "spectra");
  expect_error([] { cobra_c2_reference({{1, 2}}, 8, CobraModel{}); }, "not descending");
  expect_error([] { cobra_c2_reference({{2, 1}}, -1, CobraModel{}); }, "budget");
  DampedOptions bad;
  bad.rounds = -1;
  expect_error([&] { cobra_c2_reference({{2, 1}}, 8, CobraModel{}, bad); }, "rounds");
}

}  // namespace
}  // namespace kvq::alloc
