// The exact unit-sphere codebook as HeadCodec codes it (TqGroup::codebook = kSphere): the coded
// table is the Lloyd-Max quantizer of the density (1 - x^2)^((m-3)/2), checked against a Lloyd
// iteration done here by quadrature in double (x = sin t on a fine midpoint grid, prefix sums),
// not the library's closed forms; the per-vector MSE of uniformly random unit vectors coded by
// HeadCodec (Monte-Carlo) matches the quadrature value of the coded table and is never above the
// Gaussian codebook's, for m in {2, 4, 6, 8, 12, 16} and b = 1..4. Also the decision's validation
// of the field and the Gaussian tables left unchanged.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <numeric>
#include <vector>

#include "kvq/codec/codebook.hpp"
#include "kvq/codec/codec.hpp"
#include "kvq/format/decision_layout.hpp"
#include "kvq/util/error.hpp"
#include "kvq/util/rng.hpp"

namespace kvq::codec {
namespace {

// The law of one coordinate of a uniform unit vector in R^m on a grid: x_i = sin t_i, t_i the
// midpoints of N cells of [-pi/2, pi/2], weight cos^(m-2) t_i (the density in t), normalised.
struct SphereLawGrid {
  std::vector<double> x, W, WX, WXX;  // x ascending; prefix sums (size N + 1) of w, w x, w x^2
  SphereLawGrid(int m, int n) : x(static_cast<size_t>(n)), W(n + 1, 0.0), WX(n + 1, 0.0), WXX(n + 1, 0.0) {
    const double h = M_PI / n;
    std::vector<double> w(static_cast<size_t>(n));
    double tot = 0;
    for (int i = 0; i < n; ++i) {
      const double t = -M_PI / 2 + (i + 0.5) * h;
      x[size_t(i)] = std::sin(t);
      w[size_t(i)] = std::pow(std::cos(t), m - 2);
      tot += w[size_t(i)];
    }
    for (int i = 0; i < n; ++i) {
      const double wi = w[size_t(i)] / tot, xi = x[size_t(i)];
      W[size_t(i) + 1] = W[size_t(i)] + wi;
      WX[size_t(i) + 1] = WX[size_t(i)] + wi * xi;
      WXX[size_t(i) + 1] = WXX[size_t(i)] + wi * xi * xi;
    }
  }
  size_t index_of(double threshold) const {  // first grid point >= threshold
    return static_cast<size_t>(std::lower_bound(x.begin(), x.end(), threshold) - x.begin());
  }
  // E[(X - Q(X))^2] per coordinate, Q = nearest of the ascending centroids (cells split at the
  // midpoints, which is what nearest-centroid coding does).
  double mse(const std::vector<double>& c) const {
    double e = 0;
    size_t lo = 0;
    for (size_t k = 0; k < c.size(); ++k) {
      const size_t hi = k + 1 < c.size() ? index_of(0.5 * (c[k] + c[k + 1])) : x.size();
      const double w = W[hi] - W[lo], wx = WX[hi] - WX[lo], wxx = WXX[hi] - WXX[lo];
      e += wxx - 2 * c[k] * wx + c[k] * c[k] * w;
      lo = hi;
    }
    return e;
  }
  // Lloyd-Max by iteration from a uniform start. The law is symmetric: only the cells of the
  // negative half are computed (from the left prefix sums, accurate in the far tail where a
  // difference of sums near 1 would cancel) and mirrored.
  std::vector<double> lloyd(int bits) const {
    const int K = 1 << bits;
    std::vector<double> c(static_cast<size_t>(K));
    for (int k = 0; k < K; ++k) c[size_t(k)] = -1 + (2.0 * k + 1) / K;
    for (int it = 0; it < 1000000; ++it) {
      double moved = 0;
      size_t lo = 0;
      std::vector<double> nc(c.size());
      for (size_t k = 0; k < c.size() / 2; ++k) {
        const size_t hi = index_of(0.5 * (c[k] + c[k + 1]));  // the last one is 0
        const double w = W[hi] - W[lo];
        nc[k] = w > 1e-250 ? (WX[hi] - WX[lo]) / w : c[k];
        nc[c.size() - 1 - k] = -nc[k];
        moved = std::max(moved, std::fabs(nc[k] - c[k]));
        lo = hi;
      }
      c = nc;
      if (moved < 1e-13) break;
    }
    return c;
  }
};

HeadDecision one_group(int m, int bits, TqCodebook cb, uint64_t seed) {
  HeadDecision dec;
  dec.kind = CodingKind::kTqGroups;
  TqGroup g;
  g.bits = bits;
  g.dims.resize(static_cast<size_t>(m));
  std::iota(g.dims.begin(), g.dims.end(), 0);
  g.rotation_seed = seed;
  g.codebook = cb;
  dec.groups.push_back(g);
  return dec;
}

std::vector<double> as_double(const std::vector<float>& v) { return {v.begin(), v.end()}; }

// E[X | a <= X < b] for the sphere law at m, by composite Simpson in t (x = sin t, density
// cos^(m-2) t dt) between the exact cell bounds.
double cell_mean(int m, double a, double b) {
  const double ta = std::asin(std::clamp(a, -1.0, 1.0)), tb = std::asin(std::clamp(b, -1.0, 1.0));
  const int n = 4000;
  const double h = (tb - ta) / n;
  double w = 0, wx = 0;
  for (int i = 0; i <= n; ++i) {
    const double t = ta + i * h, f = (i == 0 || i == n) ? 1 : (i % 2 ? 4 : 2);
    const double d = std::pow(std::cos(t), m - 2);
    w += f * d, wx += f * d * std::sin(t);
  }
  return wx / w;
}

// The coded table is Lloyd-Max for the sphere law (independent quadrature Lloyd), in unit-vector
// units (no 1/sqrt(m)); the Gaussian kind still codes N(0, 1/m)'s table.
TEST(SphereCodebookCoded, TableIsLloydMaxOfTheSphereLaw) {
  for (int m : {2, 3, 4, 6, 8, 12, 16, 33, 64}) {
    const SphereLawGrid grid(m, 1000000);
    for (int b = 1; b <= 4; ++b) {
      const HeadCodec ex(one_group(m, b, TqCodebook::kSphere, 7), m);
      const HeadCodec ga(one_group(m, b, TqCodebook::kGaussian, 7), m);
      const auto& c = ex.tq_groups()[0].centroids;
      const std::vector<double> ref = grid.lloyd(b);
      ASSERT_EQ(c.size(), ref.size());
      // The Lloyd iteration on the grid stalls within ~3e-5 of its fixed point at b = 4 (slow
      // convergence, a piecewise-constant map): it locates the optimum (another stationary point
      // would be far away); the conditions below pin it.
      for (size_t k = 0; k < c.size(); ++k) EXPECT_NEAR(c[k], ref[k], 5e-5) << "m=" << m << " b=" << b << " k=" << k;
      // Lloyd-Max's two conditions on the coded table: thresholds the midpoints of the centroids
      // (nearest-neighbour cells), each centroid its cell's conditional mean (exact cell bounds).
      const auto& th = ex.tq_groups()[0].thresholds;
      for (size_t k = 0; k + 1 < c.size(); ++k) EXPECT_NEAR(th[k], 0.5 * (double(c[k]) + c[k + 1]), 1e-7);
      for (size_t k = 0; k < c.size(); ++k) {
        const double lo = k == 0 ? -1.0 : double(th[k - 1]), hi = k + 1 == c.size() ? 1.0 : double(th[k]);
        EXPECT_NEAR(c[k], cell_mean(m, lo, hi), 1e-6) << "centroid condition m=" << m << " b=" << b << " k=" << k;
      }
      // Gaussian groups: the N(0, 1) Lloyd-Max table / sqrt(m), as before this field existed.
      const auto& g = ga.tq_groups()[0].centroids;
      const auto& gl = lloyd_max_gaussian(b).centroids;
      for (size_t k = 0; k < g.size(); ++k) EXPECT_EQ(g[k], static_cast<float>(gl[k] / std::sqrt(double(m))));
    }
  }
}

// Uniformly random unit vectors (normalised Gaussian vectors, drawn here), coded by HeadCodec
// with a Haar group (the codec's rotation keeps them uniform). rho~ = fp16(1) = 1 and no norm
// correction, so ||x - x^||^2 = ||u - c||^2: the codebook's per-vector MSE.
TEST(SphereCodebookCoded, MonteCarloNeverAboveGaussianAndMatchesQuadrature) {
  std::printf("   m b | E||u-u^||^2 exact: quadrature  HeadCodec MC | gaussian: quadrature  MC | exact/gaussian\n");
  for (int m : {2, 4, 6, 8, 12, 16}) {
    const SphereLawGrid grid(m, 1000000);
    for (int b = 1; b <= 4; ++b) {
      const HeadCodec ex(one_group(m, b, TqCodebook::kSphere, 1000 + m), m);
      const HeadCodec ga(one_group(m, b, TqCodebook::kGaussian, 1000 + m), m);
      const double q_ex = m * grid.mse(as_double(ex.tq_groups()[0].centroids));
      const double q_ga = m * grid.mse(as_double(ga.tq_groups()[0].centroids));
      // The law's own Lloyd-Max optimum is below any other table: a strict, deterministic check.
      EXPECT_LE(q_ex, q_ga * (1 + 1e-9)) << "m=" << m << " b=" << b;

      const int n = 20000;
      Rng rng(31 + 100 * m + b);
      std::vector<float> x(static_cast<size_t>(n) * m);
      for (int t = 0; t < n; ++t) {
        double nrm = 0;
        for (int i = 0; i < m; ++i) {
          const double v = rng.normal();
          x[size_t(t) * m + i] = static_cast<float>(v);
          nrm += v * v;
        }
        double n2 = 0;
        for (int i = 0; i < m; ++i) {
          x[size_t(t) * m + i] = static_cast<float>(x[size_t(t) * m + i] / std::sqrt(nrm));
          n2 += double(x[size_t(t) * m + i]) * x[size_t(t) * m + i];
        }
        ASSERT_NEAR(n2, 1.0, 1e-6);
      }
      std::vector<float> ye(x.size()), yg(x.size());
      ex.round_trip(x.data(), n, ye.data());
      ga.round_trip(x.data(), n, yg.data());
      double se = 0, se2 = 0, sg = 0, sd = 0, sd2 = 0;
      for (int t = 0; t < n; ++t) {
        double ee = 0, eg = 0;
        for (int i = 0; i < m; ++i) {
          const size_t k = size_t(t) * m + i;
          ee += (double(x[k]) - ye[k]) * (double(x[k]) - ye[k]);
          eg += (double(x[k]) - yg[k]) * (double(x[k]) - yg[k]);
        }
        se += ee, se2 += ee * ee, sg += eg, sd += eg - ee, sd2 += (eg - ee) * (eg - ee);
      }
      const double me = se / n, sem_e = std::sqrt(std::max(0.0, se2 / n - me * me) / n);
      const double md = sd / n, sem_d = std::sqrt(std::max(0.0, sd2 / n - md * md) / n);
      std::printf("  %2d %d |          %.5f     %.5f |            %.5f  %.5f | %.3f\n", m, b, q_ex, me, q_ga, sg / n,
                  me / (sg / n));
      EXPECT_NEAR(me, q_ex, 4 * sem_e + 1e-5) << "m=" << m << " b=" << b;
      EXPECT_NEAR(sg / n, q_ga, 4 * sem_e + 4 * sem_d + 1e-5) << "m=" << m << " b=" << b;
      EXPECT_GE(md, -4 * sem_d) << "exact codebook raises the MSE at m=" << m << " b=" << b;
      EXPECT_LE(me, sg / n + 4 * sem_d) << "m=" << m << " b=" << b;
    }
  }
}

// group_codebook_mse: the sphere value up to kSphereExactMaxM (= the quadrature of the coded table),
// the Gaussian one above and for the Gaussian kind; 1 at zero bits.
TEST(SphereCodebookCoded, GroupMseIsTheCodedTablesMse) {
  for (int m : {2, 6, 16, 64}) {
    const SphereLawGrid grid(m, 1000000);
    for (int b = 1; b <= 4; ++b) {
      const HeadCodec ex(one_group(m, b, TqCodebook::kSphere, 3), m);
      EXPECT_NEAR(group_codebook_mse(TqCodebook::kSphere, b, m), m * grid.mse(as_double(ex.tq_groups()[0].centroids)),
                  1e-6)
          << m << " " << b;
    }
  }
  for (int b = 1; b <= 4; ++b) {
    EXPECT_EQ(group_codebook_mse(TqCodebook::kSphere, b, 65), lloyd_max_gaussian(b).mse);
    EXPECT_EQ(group_codebook_mse(TqCodebook::kGaussian, b, 4), lloyd_max_gaussian(b).mse);
  }
  EXPECT_EQ(group_codebook_mse(TqCodebook::kSphere, 0, 4), 1.0);
}

TEST(SphereCodebookCoded, DecisionValidation) {
  // Above kTqSphereMaxM, below 2 coordinates, or an unknown kind: refused naming the field.
  auto msg = [](const HeadDecision& dec, int d) {
    try {
      HeadCodec c(dec, d);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  const std::string big = msg(one_group(kTqSphereMaxM + 2, 3, TqCodebook::kSphere, 1), kTqSphereMaxM + 2);
  EXPECT_NE(big.find("groups[0].codebook"), std::string::npos) << big;
  EXPECT_EQ(big.find('\n'), std::string::npos);
  EXPECT_NE(msg(one_group(1, 3, TqCodebook::kSphere, 1), 1).find("groups[0].codebook"), std::string::npos);
  const std::string bad = msg(one_group(4, 3, static_cast<TqCodebook>(7), 1), 4);
  EXPECT_NE(bad.find("groups[0].codebook"), std::string::npos) << bad;
  EXPECT_NE(bad.find("unknown value 7"), std::string::npos) << bad;
  // Gaussian above the limit and sphere at it are fine; the packed layout (bits) does not depend
  // on the codebook: same bytes per token, same effective bpd.
  const HeadCodec a(one_group(kTqSphereMaxM, 3, TqCodebook::kSphere, 1), kTqSphereMaxM);
  const HeadCodec g(one_group(kTqSphereMaxM, 3, TqCodebook::kGaussian, 1), kTqSphereMaxM);
  EXPECT_EQ(a.packed_bytes(10), g.packed_bytes(10));
  EXPECT_EQ(a.effective_bpd(), g.effective_bpd());
  EXPECT_NO_THROW(HeadCodec(one_group(kTqSphereMaxM + 2, 3, TqCodebook::kGaussian, 1), kTqSphereMaxM + 2));
}

// Identity-rotation groups take the recorded codebook too (the sphere law is exact for a lone
// RoPE pair whose phase is spread): for unit vectors uniform on the circle, m = 2, the exact
// codebook unrotated codes within MC error of its quadrature MSE.
TEST(SphereCodebookCoded, IdentityRotationGroupUsesTheRecordedTable) {
  for (int b = 1; b <= 3; ++b) {
    HeadDecision dec = one_group(2, b, TqCodebook::kSphere, 1);
    dec.groups[0].rotation = TqRotation::kIdentity;
    const HeadCodec c(dec, 2);
    const SphereLawGrid grid(2, 1000000);
    const int n = 20000;
    std::vector<float> x(2 * n), y(2 * n);
    for (int t = 0; t < n; ++t) {
      const double th = 2 * M_PI * (t + 0.5) / n;
      x[2 * size_t(t)] = static_cast<float>(std::cos(th));
      x[2 * size_t(t) + 1] = static_cast<float>(std::sin(th));
    }
    c.round_trip(x.data(), n, y.data());
    double e = 0;
    for (size_t i = 0; i < x.size(); ++i) e += (double(x[i]) - y[i]) * (double(x[i]) - y[i]);
    EXPECT_NEAR(e / n, 2 * grid.mse(as_double(c.tq_groups()[0].centroids)), 1e-4) << b;
  }
}

}  // namespace
}  // namespace kvq::codec
