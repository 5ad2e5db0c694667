#include "kvq/codec/codebook.hpp"

#include <algorithm>
#include <array>
#include <memory>
#include <string>
#include <cmath>
#include <map>
#include <mutex>

#include "kvq/util/error.hpp"

namespace kvq::codec {
namespace {

constexpr double kInvSqrt2 = 0.70710678118654752440;
constexpr double kInvSqrt2Pi = 0.39894228040143267794;

double pdf(double x) { return std::isinf(x) ? 0.0 : kInvSqrt2Pi * std::exp(-0.5 * x * x); }
// Upper tail P(X > x), accurate far into the tail (erfc, not 1 - erf).
double upper_tail(double x) { return 0.5 * std::erfc(x * kInvSqrt2); }

// Moments of N(0,1) on the interval [a, b] (a < b, either may be infinite):
// I0 = P(a < X < b), I1 = E[X; a < X < b], I2 = E[X^2; a < X < b].
struct Moments {
  double i0, i1, i2;
};
Moments moments(double a, double b) {
  // Work on the side away from the mean for accuracy: P(a<X<b) = Q(a) - Q(b) for a >= 0.
  double i0;
  if (a >= 0) i0 = upper_tail(a) - upper_tail(b);
  else if (b <= 0) i0 = upper_tail(-b) - upper_tail(-a);
  else i0 = 1.0 - upper_tail(b) - upper_tail(-a);
  const double pa = pdf(a), pb = pdf(b);
  const double i1 = pa - pb;
  const double apa = std::isinf(a) ? 0.0 : a * pa;
  const double bpb = std::isinf(b) ? 0.0 : b * pb;
  const double i2 = i0 + apa - bpb;
  return {i0, i1, i2};
}

double cell_mse(double a, double b, double c) {
  const Moments m = moments(a, b);
  return m.i2 - 2.0 * c * m.i1 + c * c * m.i0;
}

// Inverse standard normal CDF by bisection on erfc: only used to seed Lloyd, so simple beats fast.
double inverse_cdf(double p) {
  double lo = -40.0, hi = 40.0;
  for (int i = 0; i < 200; ++i) {
    const double mid = 0.5 * (lo + hi);
    if (1.0 - upper_tail(mid) < p) lo = mid; else hi = mid;
  }
  return 0.5 * (lo + hi);
}

// Positive half of the codebook (the source is symmetric, so is the optimum; solving one half keeps
// the codebook exactly symmetric). c[i] is the centroid of cell [t_i, t_{i+1}), t_0 = 0, t_n = inf.
void lloyd_step(const std::vector<double>& c, std::vector<double>& out) {
  const size_t n = c.size();
  for (size_t i = 0; i < n; ++i) {
    const double a = i == 0 ? 0.0 : 0.5 * (c[i - 1] + c[i]);
    const double b = i + 1 == n ? INFINITY : 0.5 * (c[i] + c[i + 1]);
    const Moments m = moments(a, b);
    out[i] = m.i1 / m.i0;
  }
}

LloydMaxCodebook compute_lloyd_max(int bits) {
  const size_t n = size_t{1} << (bits - 1);
  // Start at the high-resolution optimum (point density ~ pdf^(1/3), i.e. N(0, 3) quantiles).
  std::vector<double> c(n), next(n), step(n);
  for (size_t i = 0; i < n; ++i)
    c[i] = std::sqrt(3.0) * inverse_cdf(0.5 + 0.5 * (static_cast<double>(i) + 0.5) / n);

  // Lloyd iteration. Its slowest mode contracts by a nearly constant ratio r close to 1 at high
  // rates (b = 8 needs ~10^5 plain steps), so every 8 steps the last step is extrapolated along
  // itself by r / (1 - r) (Aitken); the fixed point is the same, reached in ~10^4 steps.
  int it = 0;
  double prev = 0.0;
  for (; it < 2000000; ++it) {
    lloyd_step(c, next);
    double delta = 0.0;
    for (size_t i = 0; i < n; ++i) {
      step[i] = next[i] - c[i];
      delta = std::max(delta, std::fabs(step[i]));
    }
    c.swap(next);
    if (delta < 1e-12) break;
    if (it % 8 == 7 && prev > 0.0) {
      const double r = delta / prev;
      if (r > 0.0 && r < 0.9999) {
        const double f = r / (1.0 - r);
        for (size_t i = 0; i < n; ++i) c[i] += f * step[i];
      }
    }
    prev = delta;
  }
  KVQ_ASSERT(it < 2000000);

  LloydMaxCodebook cb;
  cb.bits = bits;
  cb.iterations = it + 1;
  cb.centroids.resize(2 * n);
  for (size_t i = 0; i < n; ++i) {
    cb.centroids[n + i] = c[i];
    cb.centroids[n - 1 - i] = -c[i];
  }
  cb.thresholds.resize(2 * n - 1);
  for (size_t i = 0; i + 1 < 2 * n; ++i)
    cb.thresholds[i] = 0.5 * (cb.centroids[i] + cb.centroids[i + 1]);
  double mse = 0.0;
  for (size_t i = 0; i < n; ++i) {
    const double a = i == 0 ? 0.0 : 0.5 * (c[i - 1] + c[i]);
    const double b = i + 1 == n ? INFINITY : 0.5 * (c[i] + c[i + 1]);
    mse += cell_mse(a, b, c[i]);
  }
  cb.mse = 2.0 * mse;
  return cb;
}

void check_bits(int bits, const char* what) {
  if (bits < 1 || bits > 8)
    throw Error("", what, "bits must be in 1..8, got " + std::to_string(bits));
}

// ---- the unit-sphere coordinate law (lloyd_max_sphere) ----------------------------------------
// With x = sin(theta), (1 - x^2)^((m-3)/2) dx = cos^n(theta) dtheta, n = m - 2 >= 0.

// C_n(t) = integral of cos^n over [0, t], |t| <= pi/2 (odd in t), by the reduction formula
// C_k = cos^(k-1) sin / k + (k-1)/k C_(k-2) from C_0 = t, C_1 = sin t (all terms >= 0: stable).
double cos_pow_integral(int n, double t) {
  const double sign = t < 0 ? -1.0 : 1.0;
  t = std::fabs(t);
  const double c = std::cos(t), s = std::sin(t);
  double f = n % 2 == 0 ? t : s;
  double cpow = n % 2 == 0 ? c : c * c;  // cos^(k-1) for the first k
  for (int k = n % 2 == 0 ? 2 : 3; k <= n; k += 2) {
    f = cpow * s / k + (k - 1.0) / k * f;
    cpow *= c * c;
  }
  return sign * f;
}

// Unnormalised moments of the law on [a, b] (-1 <= a < b <= 1), as Moments above.
Moments sphere_moments(int n, double a, double b) {
  const double ta = std::asin(std::clamp(a, -1.0, 1.0)), tb = std::asin(std::clamp(b, -1.0, 1.0));
  const double i0 = cos_pow_integral(n, tb) - cos_pow_integral(n, ta);
  const double i1 = (std::pow(std::cos(ta), n + 1) - std::pow(std::cos(tb), n + 1)) / (n + 1);
  const double i2 = i0 - (cos_pow_integral(n + 2, tb) - cos_pow_integral(n + 2, ta));  // sin^2 = 1 - cos^2
  return {i0, i1, i2};
}

LloydMaxCodebook compute_lloyd_max_sphere(int bits, int m) {
  const int n = m - 2;
  const size_t half = size_t{1} << (bits - 1);
  const double z_half = cos_pow_integral(n, 0.5 * M_PI);  // mass of [0, 1], unnormalised
  // Start at the law's own quantiles of the positive half (cells of equal mass).
  std::vector<double> c(half), next(half), step(half);
  for (size_t i = 0; i < half; ++i) {
    const double target = z_half * (static_cast<double>(i) + 0.5) / half;
    double lo = 0.0, hi = 1.0;
    for (int k = 0; k < 100; ++k) {
      const double mid = 0.5 * (lo + hi);
      if (cos_pow_integral(n, std::asin(mid)) < target) lo = mid; else hi = mid;
    }
    c[i] = 0.5 * (lo + hi);
  }
  auto cell = [&](const std::vector<double>& v, size_t i) {
    const double a = i == 0 ? 0.0 : 0.5 * (v[i - 1] + v[i]);
    const double b = i + 1 == half ? 1.0 : 0.5 * (v[i] + v[i + 1]);
    return std::make_pair(a, b);
  };
  // Lloyd with the Aitken extrapolation of the Gaussian table, taken only when it keeps the
  // centroids strictly increasing inside (0, 1) (near x = 1 the law's mass is thin and an
  // overshoot would empty a cell). Stops when no centroid moves by 1e-12 or after 10^6 steps
  // (asin loses digits next to 1, so the last moves can stall above the tolerance).
  std::vector<double> trial(half);
  int it = 0;
  double prev = 0.0;
  for (; it < 1000000; ++it) {
    double delta = 0.0;
    for (size_t i = 0; i < half; ++i) {
      const auto [a, b] = cell(c, i);
      const Moments mo = sphere_moments(n, a, b);
      next[i] = mo.i0 > 0.0 ? mo.i1 / mo.i0 : c[i];
      step[i] = next[i] - c[i];
      delta = std::max(delta, std::fabs(step[i]));
    }
    c.swap(next);
    if (delta < 1e-12) break;
    if (it % 8 == 7 && prev > 0.0) {
      const double r = delta / prev;
      if (r > 0.0 && r < 0.9999) {
        const double f = r / (1.0 - r);
        bool ok = true;
        for (size_t i = 0; i < half && ok; ++i) {
          trial[i] = c[i] + f * step[i];
          ok = trial[i] > (i == 0 ? 0.0 : trial[i - 1]) && trial[i] < 1.0;
        }
        if (ok) c.swap(trial);
      }
    }
    prev = delta;
  }
  LloydMaxCodebook cb;
  cb.bits = bits;
  cb.iterations = it + 1;
  cb.centroids.resize(2 * half);
  for (size_t i = 0; i < half; ++i) {
    cb.centroids[half + i] = c[i];
    cb.centroids[half - 1 - i] = -c[i];
  }
  cb.thresholds.resize(2 * half - 1);
  for (size_t i = 0; i + 1 < 2 * half; ++i) cb.thresholds[i] = 0.5 * (cb.centroids[i] + cb.centroids[i + 1]);
  double mse = 0.0;
  for (size_t i = 0; i < half; ++i) {
    const auto [a, b] = cell(c, i);
    const Moments mo = sphere_moments(n, a, b);
    mse += mo.i2 - 2.0 * c[i] * mo.i1 + c[i] * c[i] * mo.i0;
  }
  cb.mse = m * mse / z_half;  // both halves over the whole mass 2 z_half, times m
  return cb;
}

}  // namespace

const LloydMaxCodebook& lloyd_max_sphere(int bits, int m) {
  check_bits(bits, "lloyd_max_sphere");
  if (m < 2 || m > kSphereExactMaxM)
    throw Error("", "lloyd_max_sphere", "m must be in 2.." + std::to_string(kSphereExactMaxM) + ", got " + std::to_string(m));
  static std::mutex mu;
  static std::map<std::pair<int, int>, std::unique_ptr<LloydMaxCodebook>> cache;
  {
    std::lock_guard<std::mutex> lock(mu);
    auto it = cache.find({m, bits});
    if (it != cache.end()) return *it->second;
  }
  auto cb = std::make_unique<LloydMaxCodebook>(compute_lloyd_max_sphere(bits, m));  // outside the lock
  std::lock_guard<std::mutex> lock(mu);
  auto [it, inserted] = cache.emplace(std::make_pair(m, bits), std::move(cb));
  return *it->second;  // a racing duplicate is identical and dropped
}

const LloydMaxCodebook& lloyd_max_gaussian(int bits) {
  check_bits(bits, "lloyd_max_gaussian");
  static std::array<LloydMaxCodebook, 9> cache;
  static std::array<std::once_flag, 9> once;
  std::call_once(once[bits], [bits] { cache[bits] = compute_lloyd_max(bits); });
  return cache[bits];
}

ScaledCodebook scaled_codebook(int bits, int m) {
  KVQ_ASSERT(m >= 1);
  const LloydMaxCodebook& cb = lloyd_max_gaussian(bits);
  const double s = 1.0 / std::sqrt(static_cast<double>(m));
  ScaledCodebook out;
  out.centroids.reserve(cb.centroids.size());
  for (double c : cb.centroids) out.centroids.push_back(static_cast<float>(c * s));
  out.thresholds.reserve(cb.thresholds.size());
  for (double t : cb.thresholds) out.thresholds.push_back(static_cast<float>(t * s));
  return out;
}

ScaledCodebook group_codebook(TqCodebook kind, int bits, int m) {
  if (kind == TqCodebook::kGaussian) return scaled_codebook(bits, m);
  if (kind != TqCodebook::kSphere)
    throw Error("", "codebook", "unknown kind " + std::to_string(static_cast<uint32_t>(kind)));
  const LloydMaxCodebook& cb = lloyd_max_sphere(bits, m);  // checks 2 <= m <= kSphereExactMaxM
  ScaledCodebook out;
  out.centroids.assign(cb.centroids.begin(), cb.centroids.end());
  out.thresholds.assign(cb.thresholds.begin(), cb.thresholds.end());
  return out;
}

double group_codebook_mse(TqCodebook kind, int bits, int m) {
  if (bits == 0) return 1.0;
  if (kind == TqCodebook::kSphere && m >= 2 && m <= kSphereExactMaxM) return lloyd_max_sphere(bits, m).mse;
  return lloyd_max_gaussian(bits).mse;
}

double uniform_quantizer_gaussian_mse(int bits, double step) {
  check_bits(bits, "uniform_quantizer_gaussian_mse");
  // Positive half: levels (j + 1/2) step for j = 0..n-1, cells [j step, (j+1) step), last open.
  const int n = 1 << (bits - 1);
  double mse = 0.0;
  for (int j = 0; j < n; ++j) {
    const double a = j * step;
    const double b = j + 1 == n ? INFINITY : (j + 1) * step;
    mse += cell_mse(a, b, (j + 0.5) * step);
  }
  return 2.0 * mse;
}

const UniformGaussianQuantizer& optimal_uniform_gaussian(int bits) {
  check_bits(bits, "optimal_uniform_gaussian");
  static std::array<UniformGaussianQuantizer, 9> cache;
  static std::array<std::once_flag, 9> once;
  std::call_once(once[bits], [bits] {
    // The MSE is unimodal in the step: golden-section search on a bracket around the
    // high-resolution guess (about 4 sigma of range per 2^b levels, generously widened).
    double lo = 1e-4, hi = 2.5;
    const double g = 0.5 * (std::sqrt(5.0) - 1.0);
    double x1 = hi - g * (hi - lo), x2 = lo + g * (hi - lo);
    double f1 = uniform_quantizer_gaussian_mse(bits, x1);
    double f2 = uniform_quantizer_gaussian_mse(bits, x2);
    for (int i = 0; i < 200 && hi - lo > 1e-13; ++i) {
      if (f1 < f2) {
        hi = x2; x2 = x1; f2 = f1;
        x1 = hi - g * (hi - lo);
        f1 = uniform_quantizer_gaussian_mse(bits, x1);
      } else {
        lo = x1; x1 = x2; f1 = f2;
        x2 = lo + g * (hi - lo);
        f2 = uniform_quantizer_gaussian_mse(bits, x2);
      }
    }
    UniformGaussianQuantizer q;
    q.bits = bits;
    q.step = 0.5 * (lo + hi);
    q.mse = uniform_quantizer_gaussian_mse(bits, q.step);
    cache[bits] = q;
  });
  return cache[bits];
}

}  // namespace kvq::codec
