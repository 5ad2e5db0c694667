#include "kvq/codec/rotation.hpp"

#include <cmath>
#include <map>
#include <mutex>
#include <utility>

#include "kvq/util/rng.hpp"
#include "kvq/util/error.hpp"

namespace kvq::codec {

std::vector<double> haar_orthogonal(uint64_t seed, int m) {
  KVQ_ASSERT(m >= 1);
  const size_t n = static_cast<size_t>(m);
  Rng rng(seed);
  std::vector<double> r(n * n);  // A, overwritten by R; row-major, filled row by row
  for (double& v : r) v = rng.normal();
  std::vector<double> q(n * n, 0.0);
  for (size_t i = 0; i < n; ++i) q[i * n + i] = 1.0;

  std::vector<double> v(n), w(n);
  for (size_t k = 0; k + 1 < n; ++k) {
    // Householder reflector H = I - 2 v v^T / (v^T v) mapping R[k:, k] onto alpha e_k.
    double norm2 = 0.0;
    for (size_t i = k; i < n; ++i) norm2 += r[i * n + k] * r[i * n + k];
    const double norm = std::sqrt(norm2);
    if (norm == 0.0) continue;
    const double x0 = r[k * n + k];
    const double alpha = x0 >= 0 ? -norm : norm;  // opposite sign: no cancellation in v0
    for (size_t i = k; i < n; ++i) v[i] = r[i * n + k];
    v[k] -= alpha;
    double vv = 0.0;
    for (size_t i = k; i < n; ++i) vv += v[i] * v[i];
    if (vv == 0.0) continue;
    const double beta = 2.0 / vv;
    // R <- H R (rows k..n-1)
    for (size_t j = k; j < n; ++j) {
      double s = 0.0;
      for (size_t i = k; i < n; ++i) s += v[i] * r[i * n + j];
      s *= beta;
      for (size_t i = k; i < n; ++i) r[i * n + j] -= s * v[i];
    }
    // Q <- Q H (columns k..n-1)
    for (size_t i = 0; i < n; ++i) {
      double s = 0.0;
      for (size_t j = k; j < n; ++j) s += q[i * n + j] * v[j];
      w[i] = s * beta;
    }
    for (size_t i = 0; i < n; ++i)
      for (size_t j = k; j < n; ++j) q[i * n + j] -= w[i] * v[j];
  }
  // A = Q R; flip columns of Q (rows of R) where R's diagonal is negative.
  for (size_t j = 0; j < n; ++j) {
    if (r[j * n + j] < 0.0)
      for (size_t i = 0; i < n; ++i) q[i * n + j] = -q[i * n + j];
  }
  return q;
}

std::shared_ptr<const Rotation> haar_rotation(uint64_t seed, int m) {
  static std::mutex mu;
  static std::map<std::pair<uint64_t, int>, std::shared_ptr<const Rotation>> cache;
  {
    std::lock_guard<std::mutex> lock(mu);
    auto it = cache.find({seed, m});
    if (it != cache.end()) return it->second;
  }
  // Built outside the lock (O(m^3)); a racing duplicate is identical and simply dropped.
  auto rot = std::make_shared<Rotation>();
  rot->seed = seed;
  rot->m = m;
  const std::vector<double> q = haar_orthogonal(seed, m);
  rot->matrix.assign(q.begin(), q.end());
  rot->transpose.resize(q.size());
  for (int i = 0; i < m; ++i)
    for (int j = 0; j < m; ++j)
      rot->transpose[static_cast<size_t>(j) * m + i] = rot->matrix[static_cast<size_t>(i) * m + j];
  std::lock_guard<std::mutex> lock(mu);
  auto [it, inserted] = cache.emplace(std::make_pair(seed, m), std::move(rot));
  return it->second;
}

std::shared_ptr<const Rotation> identity_rotation(int m) {
  static std::mutex mu;
  static std::map<int, std::shared_ptr<const Rotation>> cache;
  std::lock_guard<std::mutex> lock(mu);
  auto& slot = cache[m];
  if (!slot) {
    auto rot = std::make_shared<Rotation>();
    rot->m = m;
    rot->matrix.assign(static_cast<size_t>(m) * m, 0.f);
    for (int i = 0; i < m; ++i) rot->matrix[static_cast<size_t>(i) * m + i] = 1.f;
    rot->transpose = rot->matrix;
    slot = std::move(rot);
  }
  return slot;
}

}  // namespace kvq::codec
