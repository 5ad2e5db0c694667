// Seeded generator and Haar rotations: frozen output, orthogonality, QR construction, sign fix.
#include <gtest/gtest.h>

#include <Eigen/Dense>
#include <cmath>

#include "kvq/util/rng.hpp"
#include "kvq/codec/rotation.hpp"

namespace kvq::codec {
namespace {

using MatD = Eigen::Matrix<double, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;

// Allocation files store seeds, not matrices: these outputs are part of the format.
// Seed 0's first outputs are also those of the published xoshiro256** seeded by splitmix64(0).
TEST(Rng, FrozenOutput) {
  Rng a(0);
  EXPECT_EQ(a.next(), 0x99ec5f36cb75f2b4ULL);
  EXPECT_EQ(a.next(), 0xbf6e1f784956452aULL);
  Rng b(42);
  EXPECT_EQ(b.next(), 0x15780b2e0c2ec716ULL);
  Rng c(42);
  EXPECT_NEAR(c.normal(), -1.6132237513849164, 1e-12);
  EXPECT_NEAR(c.normal(), 1.5344873235334187, 1e-12);
}

TEST(Rng, NormalMoments) {
  Rng r(1234);
  const int n = 200000;
  double s = 0, s2 = 0, s4 = 0;
  for (int i = 0; i < n; ++i) {
    const double v = r.normal();
    s += v, s2 += v * v, s4 += v * v * v * v;
  }
  EXPECT_NEAR(s / n, 0.0, 0.01);
  EXPECT_NEAR(s2 / n, 1.0, 0.01);
  EXPECT_NEAR(s4 / n, 3.0, 0.05);
}

TEST(Rotation, FrozenValues) {
  const std::vector<double> q = haar_orthogonal(42, 4);
  const double want[16] = {-0.916968938973, 0.278178752788,  -0.080039055885, -0.274551080837,
                           0.009021366710,  -0.115889712398, 0.904134673795,  -0.411130978089,
                           -0.363468987957, -0.875435141520, 0.035392028815,  0.316624402222,
                           -0.164246384114, 0.377888170032,  0.418188528622,  0.809531970205};
  for (int i = 0; i < 16; ++i) EXPECT_NEAR(q[static_cast<size_t>(i)], want[i], 1e-9) << i;
}

TEST(Rotation, OrthogonalForAwkwardSizes) {
  for (int m : {1, 2, 3, 7, 8, 33, 64, 96, 128, 256}) {
    const auto rot = haar_rotation(17, m);
    ASSERT_EQ(rot->matrix.size(), static_cast<size_t>(m) * m);
    Eigen::Map<const Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>> p(
        rot->matrix.data(), m, m);
    const MatD pd = p.cast<double>();
    EXPECT_LT((pd * pd.transpose() - MatD::Identity(m, m)).cwiseAbs().maxCoeff(), 2e-6) << "m=" << m;
    const std::vector<double> q = haar_orthogonal(17, m);
    Eigen::Map<const MatD> qd(q.data(), m, m);
    EXPECT_LT((qd.transpose() * qd - MatD::Identity(m, m)).cwiseAbs().maxCoeff(), 1e-12) << "m=" << m;
  }
}

// Pi is exactly the Q of the QR decomposition of the seeded Gaussian matrix with R's diagonal
// made positive: R = Pi^T A must be upper triangular with a positive diagonal.
TEST(Rotation, IsSignFixedQrOfSeededGaussian) {
  for (int m : {3, 16, 65}) {
    Rng rng(2024);
    MatD a(m, m);
    for (int i = 0; i < m; ++i)
      for (int j = 0; j < m; ++j) a(i, j) = rng.normal();
    const std::vector<double> q = haar_orthogonal(2024, m);
    Eigen::Map<const MatD> qd(q.data(), m, m);
    const MatD r = qd.transpose() * a;
    for (int i = 0; i < m; ++i) {
      EXPECT_GT(r(i, i), 0.0) << "m=" << m << " i=" << i;
      for (int j = 0; j < i; ++j) EXPECT_NEAR(r(i, j), 0.0, 1e-10) << "m=" << m;
    }
  }
}

// Without the sign fix, Householder QR makes Pi(0,0) = -sign(a00)|a00|/||a0|| < 0 always; Haar
// needs it symmetric about 0.
TEST(Rotation, FirstEntrySymmetricAcrossSeeds) {
  const int m = 8, n = 2000;
  double s = 0;
  int negative = 0;
  for (int seed = 0; seed < n; ++seed) {
    const double v = haar_orthogonal(static_cast<uint64_t>(seed), m)[0];
    s += v;
    negative += v < 0;
  }
  EXPECT_NEAR(s / n, 0.0, 4.0 / std::sqrt(double(n) * m));
  EXPECT_GT(negative, n / 2 - 150);
  EXPECT_LT(negative, n / 2 + 150);
}

TEST(Rotation, DeterministicAndCached) {
  const auto a = haar_rotation(5, 64);
  const auto b = haar_rotation(5, 64);
  EXPECT_EQ(a.get(), b.get());
  const std::vector<double> q1 = haar_orthogonal(5, 64), q2 = haar_orthogonal(5, 64);
  EXPECT_EQ(q1, q2);
  for (size_t i = 0; i < q1.size(); ++i) EXPECT_EQ(a->matrix[i], static_cast<float>(q1[i]));
  const auto c = haar_rotation(6, 64);
  EXPECT_NE(a->matrix, c->matrix);
  EXPECT_NE(haar_rotation(5, 32).get(), a.get());
}

}  // namespace
}  // namespace kvq::codec
