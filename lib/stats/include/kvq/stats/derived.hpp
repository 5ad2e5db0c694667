#pragma once
// Quantities derived from the moment sums and nothing else.
#include <Eigen/Dense>
#include <vector>

#include "kvq/model/config.hpp"
#include "kvq/stats/moments.hpp"

namespace kvq {

struct RopeGeometry {
  RopePairing pairing = RopePairing::kSplitHalf;
  int head_dim = 0;
  int rotary_dim = 0;
};

// Block-GTQ energies s_i = 1/2 mean_{t,g} |q_(i)|^2 + 1/2 mean_t |k_(i)|^2 for one (layer, head),
// blocks in the model's pairing (the tail past rotary_dim as theta=0 pairs).
std::vector<double> block_energies(const Moments& m, const RopeGeometry& g, int layer, int head);

// Per-dim second moment E[x x^T] (uncentered) or covariance E[(x-mu)(x-mu)^T] (centered).
Eigen::MatrixXd second_moment(const SideMoments& s, const MomentShape& shape, int layer, int head, bool centered);
Eigen::VectorXd mean_of(const SideMoments& s, const MomentShape& shape, int layer, int head);

struct EigenDecomp {
  Eigen::VectorXd values;   // descending, clamped at 0 (round-off can make tiny ones negative)
  Eigen::MatrixXd vectors;  // columns, matching values; each column's largest |entry| positive
};
EigenDecomp eigen_decompose(const Eigen::MatrixXd& sym);

// sigma^2_{Q,i} = u_i^T Sigma_Q u_i for the columns u_i of `basis` (Sigma_Q: the group's query
// covariance, centered or not as asked).
Eigen::VectorXd query_variance_in_basis(const Moments& m, int layer, int head, const Eigen::MatrixXd& basis,
                                        bool centered);

}  // namespace kvq
