// Walsh-Hadamard: block decomposition for non-powers of two, orthogonality, inverse, signs,
// variance equalisation.
#include <gtest/gtest.h>

#include <Eigen/Dense>
#include <cmath>

#include "kvq/codec/hadamard.hpp"
#include "kvq/util/rng.hpp"

namespace kvq::codec {
namespace {

using MatD = Eigen::MatrixXd;

TEST(Hadamard, BlocksAreBinaryDigitsLargestFirst) {
  auto eq = [](const std::vector<HadamardBlock>& b, std::vector<std::pair<int, int>> want) {
    ASSERT_EQ(b.size(), want.size());
    for (size_t i = 0; i < b.size(); ++i) {
      EXPECT_EQ(b[i].offset, want[i].first);
      EXPECT_EQ(b[i].size, want[i].second);
    }
  };
  eq(hadamard_blocks(96), {{0, 64}, {64, 32}});
  eq(hadamard_blocks(7), {{0, 4}, {4, 2}, {6, 1}});
  eq(hadamard_blocks(128), {{0, 128}});
  eq(hadamard_blocks(1), {{0, 1}});
  for (int r = 1; r <= 300; ++r) {
    int total = 0;
    for (const HadamardBlock& b : hadamard_blocks(r)) {
      EXPECT_EQ(b.offset % b.size, 0) << "r=" << r;  // aligned: butterflies never cross blocks
      total += b.size;
    }
    EXPECT_EQ(total, r);
  }
}

MatD matrix_of(int r, bool inverse, const std::vector<float>& signs) {
  const std::vector<int> perm = hadamard_interleave(r);
  MatD m(r, r);
  std::vector<float> e(static_cast<size_t>(r)), out(static_cast<size_t>(r));
  for (int j = 0; j < r; ++j) {
    std::fill(e.begin(), e.end(), 0.f);
    e[static_cast<size_t>(j)] = 1.f;
    if (inverse) rht_inverse(signs.data(), perm.data(), e.data(), out.data(), r);
    else rht_forward(signs.data(), perm.data(), e.data(), out.data(), r);
    for (int i = 0; i < r; ++i) m(i, j) = out[static_cast<size_t>(i)];
  }
  return m;
}

MatD wht_matrix(int r) {
  MatD m(r, r);
  std::vector<float> e(static_cast<size_t>(r));
  for (int j = 0; j < r; ++j) {
    std::fill(e.begin(), e.end(), 0.f);
    e[static_cast<size_t>(j)] = 1.f;
    wht_inplace(e.data(), r);
    for (int i = 0; i < r; ++i) m(i, j) = e[static_cast<size_t>(i)];
  }
  return m;
}

TEST(Hadamard, InterleaveIsABalancedPermutation) {
  for (int r = 1; r <= 300; ++r) {
    const std::vector<int> p = hadamard_interleave(r);
    std::vector<int> seen(static_cast<size_t>(r), 0);
    for (int v : p) {
      ASSERT_GE(v, 0);
      ASSERT_LT(v, r);
      ++seen[static_cast<size_t>(v)];
    }
    for (int c : seen) EXPECT_EQ(c, 1) << "r=" << r;
    if ((r & (r - 1)) == 0) {
      for (int k = 0; k < r; ++k) EXPECT_EQ(p[static_cast<size_t>(k)], k) << "identity for r=" << r;
    }
    // Within each block, the dealt coordinates keep their order; any prefix of y is spread over
    // the blocks in proportion to their sizes (within one coordinate).
    const auto blocks = hadamard_blocks(r);
    std::vector<int> count(blocks.size(), 0);
    for (int k = 0; k < r; ++k) {
      for (size_t j = 0; j < blocks.size(); ++j)
        if (p[static_cast<size_t>(k)] >= blocks[j].offset && p[static_cast<size_t>(k)] < blocks[j].offset + blocks[j].size) {
          EXPECT_EQ(p[static_cast<size_t>(k)], blocks[j].offset + count[j]);
          ++count[j];
        }
      for (size_t j = 0; j < blocks.size(); ++j)
        EXPECT_LE(std::fabs(count[j] - double(k + 1) * blocks[j].size / r), 1.0) << "r=" << r << " k=" << k;
    }
  }
}

TEST(Hadamard, OrthogonalIncludingNonPowersOfTwo) {
  for (int r : {1, 2, 3, 5, 6, 7, 8, 12, 16, 18, 33, 64, 66, 96, 100, 128, 256}) {
    const std::vector<float> signs = hadamard_signs(11, r);
    const MatD f = matrix_of(r, false, signs);
    const MatD inv = matrix_of(r, true, signs);
    EXPECT_LT((f.transpose() * f - MatD::Identity(r, r)).cwiseAbs().maxCoeff(), 1e-6) << "r=" << r;
    EXPECT_LT((inv * f - MatD::Identity(r, r)).cwiseAbs().maxCoeff(), 1e-6) << "r=" << r;
    // The block WHT is symmetric and its own inverse.
    const MatD h = wht_matrix(r);
    EXPECT_LT((h - h.transpose()).cwiseAbs().maxCoeff(), 1e-7) << "r=" << r;
    EXPECT_LT((h * h - MatD::Identity(r, r)).cwiseAbs().maxCoeff(), 1e-6) << "r=" << r;
  }
}

TEST(Hadamard, PowerOfTwoIsSylvester) {
  const int n = 8;
  const MatD h = wht_matrix(n);
  for (int i = 0; i < n; ++i)
    for (int j = 0; j < n; ++j) {
      const double want = (__builtin_popcount(i & j) % 2 ? -1.0 : 1.0) / std::sqrt(double(n));
      EXPECT_NEAR(h(i, j), want, 1e-7);
    }
}

TEST(Hadamard, SignsDeterministicAndBalanced) {
  EXPECT_EQ(hadamard_signs(3, 64), hadamard_signs(3, 64));
  EXPECT_NE(hadamard_signs(3, 64), hadamard_signs(4, 64));
  const std::vector<float> s = hadamard_signs(9, 4096);
  int plus = 0;
  for (float v : s) {
    ASSERT_TRUE(v == 1.f || v == -1.f);
    plus += v > 0;
  }
  EXPECT_NEAR(plus, 2048, 150);
  // A prefix of a longer draw: rank changes keep the leading signs.
  const std::vector<float> s10 = hadamard_signs(9, 10);
  for (int i = 0; i < 10; ++i) EXPECT_EQ(s10[static_cast<size_t>(i)], s[static_cast<size_t>(i)]);
}

// Coordinates with variances spread 1000x come out of the randomized WHT with equal variance
// (the mean of the input variances in each block).
TEST(Hadamard, EqualisesVariance) {
 for (int r : {64, 96, 66}) {
  const int n = 20000;
  std::vector<double> lambda(static_cast<size_t>(r));
  for (int i = 0; i < r; ++i) lambda[static_cast<size_t>(i)] = std::pow(1000.0, -double(i) / (r - 1));
  double mean_lambda = 0;
  for (double l : lambda) mean_lambda += l / r;
  const std::vector<float> signs = hadamard_signs(1, r);
  const std::vector<int> perm = hadamard_interleave(r);
  Rng rng(8);
  std::vector<double> var(static_cast<size_t>(r), 0.0);
  std::vector<float> y(static_cast<size_t>(r)), z(static_cast<size_t>(r));
  for (int t = 0; t < n; ++t) {
    for (int i = 0; i < r; ++i) y[static_cast<size_t>(i)] = static_cast<float>(std::sqrt(lambda[static_cast<size_t>(i)]) * rng.normal());
    rht_forward(signs.data(), perm.data(), y.data(), z.data(), r);
    for (int i = 0; i < r; ++i) var[static_cast<size_t>(i)] += double(z[static_cast<size_t>(i)]) * z[static_cast<size_t>(i)] / n;
  }
  // Power of two: exact equalisation in expectation. Otherwise each block of 16 or more holds
  // nearly the overall mean variance thanks to the interleave (contiguous blocks: 1.5x apart at
  // r = 96); a block of 1 or 2 is only a couple of samples of the spectrum (r = 66: 0.62x).
  for (const HadamardBlock& b : hadamard_blocks(r))
    for (int i = b.offset; i < b.offset + b.size; ++i) {
      const double ratio = var[static_cast<size_t>(i)] / mean_lambda;
      if (b.size >= 16) EXPECT_NEAR(ratio, 1.0, (r & (r - 1)) == 0 ? 0.06 : 0.12) << "r=" << r << " i=" << i;
      else EXPECT_NEAR(ratio, 1.0, 0.5) << "r=" << r << " i=" << i;
    }
 }
}

}  // namespace
}  // namespace kvq::codec
