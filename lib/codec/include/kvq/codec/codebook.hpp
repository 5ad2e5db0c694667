#pragma once
// Scalar quantizers for a standard normal source, computed from the Gaussian density with exact
// integrals (erf/erfc), never hard-coded; each is computed once per process and cached.
//  - Lloyd-Max codebooks (TQ-MSE): 2^b centroids minimising E[(X - Q(X))^2], X ~ N(0, 1).
//    For N(0, 1/m) (a coordinate of a rotated unit vector in dim m) scale centroids by 1/sqrt(m).
//  - MSE-optimal step of the symmetric (midrise) uniform quantizer with 2^b levels (the low-rank
//    Hadamard path), same source.
#include <vector>

#include "kvq/format/decision.hpp"

namespace kvq::codec {

struct LloydMaxCodebook {
  int bits = 0;
  std::vector<double> centroids;   // ascending, 2^bits values, symmetric about 0
  std::vector<double> thresholds;  // 2^bits - 1 cell boundaries (midpoints of centroids)
  double mse = 0.0;                // E[(X - Q(X))^2] for X ~ N(0, 1), exact integral
  int iterations = 0;              // Lloyd iterations until the largest centroid move < 1e-12
};

// bits in [1, 8]; a reference into a process-wide cache (thread-safe, deterministic).
const LloydMaxCodebook& lloyd_max_gaussian(int bits);

// Lloyd-Max for the exact law of one coordinate of a uniformly random unit vector in R^m,
// density proportional to (1 - x^2)^((m-3)/2) on [-1, 1] (the arcsine law at m = 2, uniform at
// m = 3), which N(0, 1/m) only approximates: for small groups it is much better (E||u - c||^2 at
// m = 2, b = 2 about half the Gaussian codebook's). Cell moments in closed form (x = sin theta:
// the density becomes cos^(m-2) theta; integrals of cos^n by the reduction formula), Lloyd
// iteration as for the Gaussian. Centroids in the unit vector's own units (NOT scaled by
// sqrt(m)); mse = m * E[(X - Q(X))^2] = E||u - c||^2 per vector, comparable with
// lloyd_max_gaussian(bits).mse. bits in [1, 8], m in [2, kSphereExactMaxM]; cached per (m, bits).
// Computed for m <= kSphereExactMaxM only: at m = 64 the centroids (times sqrt(m)) are within 4%
// of the Gaussian table's and the MSE up to 4% lower (b = 4); agreement to 1e-6 would need
// m ~ 10^4, above every head size, and the closed forms cost O(m) per cell. Coded by TQ groups
// whose TqGroup::codebook is TqCodebook::kSphere (kvq-allocate --codebook exact), see
// group_codebook below.
constexpr int kSphereExactMaxM = 64;
static_assert(kSphereExactMaxM == kTqSphereMaxM, "the decision's sphere-codebook limit is this one");
const LloydMaxCodebook& lloyd_max_sphere(int bits, int m);

// Centroids and thresholds for N(0, 1/m): the table above times 1/sqrt(m), as float.
struct ScaledCodebook {
  std::vector<float> centroids;
  std::vector<float> thresholds;
};
ScaledCodebook scaled_codebook(int bits, int m);

// The table a TQ group of m coordinates codes its unit vector u = Pi x / rho~ with:
//  kGaussian  scaled_codebook(bits, m) (N(0, 1/m), every m >= 1);
//  kSphere    lloyd_max_sphere(bits, m) as float (already in unit-vector units: no 1/sqrt(m)),
//             2 <= m <= kSphereExactMaxM, else kvq::Error (there is no silent fallback: the
//             decision says which table decodes; kvq-allocate records kGaussian above that m).
ScaledCodebook group_codebook(TqCodebook kind, int bits, int m);

// The per-vector distortion E||u - Q(u)||^2 an allocator charges a group of width `bits` and m
// coordinates (bits 0: 1, nothing stored): kGaussian lloyd_max_gaussian(bits).mse (the m-free
// large-m value, what --exact-distortion always used); kSphere lloyd_max_sphere(bits, m).mse for
// 2 <= m <= kSphereExactMaxM and the Gaussian value above (where the group is coded Gaussian).
double group_codebook_mse(TqCodebook kind, int bits, int m);

// Index of the nearest centroid given ascending thresholds (ties go to the upper cell).
inline int nearest_index(const float* thresholds, int n_thresholds, float v) {
  int lo = 0, hi = n_thresholds;  // first threshold > v
  while (lo < hi) {
    const int mid = (lo + hi) >> 1;
    if (thresholds[mid] <= v) lo = mid + 1; else hi = mid;
  }
  return lo;
}

// Symmetric uniform quantizer with 2^bits levels at (i - 2^(bits-1) + 1/2) * step.
struct UniformGaussianQuantizer {
  int bits = 0;
  double step = 0.0;  // MSE-optimal step for N(0, 1)
  double mse = 0.0;   // its MSE for N(0, 1)
};
const UniformGaussianQuantizer& optimal_uniform_gaussian(int bits);

// Exact MSE of that quantizer with the given step for X ~ N(0, 1).
double uniform_quantizer_gaussian_mse(int bits, double step);

}  // namespace kvq::codec
