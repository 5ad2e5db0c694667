#pragma once
// Seeded Haar-random orthogonal matrices for TQ-MSE: QR (Householder) of an m x m standard
// Gaussian matrix from kvq::Rng, columns sign-fixed so that R has a positive diagonal (this
// makes Q exactly Haar distributed). The algorithm is frozen: allocation files store the seed, and
// the decoder regenerates the matrix from it. Our own Householder (not Eigen's) so an Eigen
// upgrade cannot change the matrix a recorded seed means.
#include <cstdint>
#include <memory>
#include <vector>

namespace kvq::codec {

struct Rotation {
  uint64_t seed = 0;
  int m = 0;
  std::vector<float> matrix;    // row-major m x m, Pi: u = Pi x, x = Pi^T u
  std::vector<float> transpose;  // Pi^T row-major (the encoder's right-hand side: u^T = x^T Pi^T)
};

// Generation in double (uncached); entry (i, j) at [i * m + j].
std::vector<double> haar_orthogonal(uint64_t seed, int m);

// Cached per (seed, m), thread-safe; the float matrix is the rounded double one.
std::shared_ptr<const Rotation> haar_rotation(uint64_t seed, int m);

// The m x m identity as a Rotation (seed 0), cached per m: a TQ group with TqRotation::kIdentity
// goes through the same code paths (CPU and CUDA) with this matrix; products with it are exact.
std::shared_ptr<const Rotation> identity_rotation(int m);

}  // namespace kvq::codec
