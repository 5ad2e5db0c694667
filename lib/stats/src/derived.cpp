#include "kvq/stats/derived.hpp"

#include <algorithm>
#include <numeric>

#include "kvq/util/error.hpp"

namespace kvq {

std::vector<double> block_energies(const Moments& m, const RopeGeometry& g, int layer, int head) {
  const auto& s = m.shape();
  KVQ_ASSERT(g.head_dim == s.head_dim && g.rotary_dim <= g.head_dim && g.rotary_dim % 2 == 0);
  const int d = s.head_dim, nb = d / 2;
  const double* gq = m.q.gram_of(s, layer, head);
  const double* gk = m.k.gram_of(s, layer, head);
  const int64_t nq = m.q.count_of(s, layer, head), nk = m.k.count_of(s, layer, head);
  std::vector<double> e(size_t(nb), 0.0);
  for (int i = 0; i < nb; ++i) {
    int a, b;
    rope_block_coords(g.pairing, d, g.rotary_dim, i, &a, &b);
    // |x_(i)|^2 summed over samples is the sum of the two diagonal Gram entries.
    double q2 = gq[a * d + a] + gq[b * d + b], k2 = gk[a * d + a] + gk[b * d + b];
    e[size_t(i)] = (nq > 0 ? 0.5 * q2 / double(nq) : 0.0) + (nk > 0 ? 0.5 * k2 / double(nk) : 0.0);
  }
  return e;
}

Eigen::VectorXd mean_of(const SideMoments& s, const MomentShape& shape, int layer, int head) {
  const int d = s.dim_of(shape);
  const int64_t n = s.count_of(shape, layer, head);
  Eigen::VectorXd mu = Eigen::Map<const Eigen::VectorXd>(s.sum_of(shape, layer, head), d);
  return n > 0 ? Eigen::VectorXd(mu / double(n)) : Eigen::VectorXd::Zero(d);
}

Eigen::MatrixXd second_moment(const SideMoments& s, const MomentShape& shape, int layer, int head, bool centered) {
  const int d = s.dim_of(shape);
  const int64_t n = s.count_of(shape, layer, head);
  if (n == 0) return Eigen::MatrixXd::Zero(d, d);
  Eigen::MatrixXd m = Eigen::Map<const Eigen::MatrixXd>(s.gram_of(shape, layer, head), d, d) / double(n);
  if (centered) {
    Eigen::VectorXd mu = mean_of(s, shape, layer, head);
    m -= mu * mu.transpose();
  }
  return 0.5 * (m + m.transpose());
}

EigenDecomp eigen_decompose(const Eigen::MatrixXd& sym) {
  Eigen::SelfAdjointEigenSolver<Eigen::MatrixXd> es(sym);
  if (es.info() != Eigen::Success) throw Error("", "eigen", "eigen-decomposition did not converge");
  const int d = int(sym.rows());
  std::vector<int> order(static_cast<size_t>(d));
  std::iota(order.begin(), order.end(), 0);
  // Eigen returns ascending; sort descending, stable so equal values keep a fixed order.
  std::stable_sort(order.begin(), order.end(),
                   [&](int a, int b) { return es.eigenvalues()[a] > es.eigenvalues()[b]; });
  EigenDecomp out;
  out.values.resize(d);
  out.vectors.resize(d, d);
  for (int j = 0; j < d; ++j) {
    out.values[j] = std::max(0.0, es.eigenvalues()[order[size_t(j)]]);
    Eigen::VectorXd u = es.eigenvectors().col(order[size_t(j)]);
    Eigen::Index imax;
    u.cwiseAbs().maxCoeff(&imax);
    if (u[imax] < 0) u = -u;  // fix the sign so the basis is deterministic
    out.vectors.col(j) = u;
  }
  return out;
}

Eigen::VectorXd query_variance_in_basis(const Moments& m, int layer, int head, const Eigen::MatrixXd& basis,
                                        bool centered) {
  Eigen::MatrixXd sq = second_moment(m.q, m.shape(), layer, head, centered);
  return (basis.transpose() * sq * basis).diagonal();
}

}  // namespace kvq
