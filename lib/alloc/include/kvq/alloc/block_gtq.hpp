#pragma once
// Block-GTQ (paper 000, Theorem 1): per (layer, KV head), integer bit widths for the n_b RoPE
// blocks minimising J(b) = sum_i s_i D(b_i) under sum_i b_i = floor(n_b * bits_per_dim), with
// D(b) = 4^-b (TQ-MSE error law) or a caller-supplied per-width table.
#include <cstdint>
#include <functional>
#include <vector>

#include "kvq/alloc/common.hpp"
#include "kvq/format/rope.hpp"

namespace kvq::alloc {

struct GreedyOptions {
  int b_min = 1;
  int b_max = 8;
  // exact_distortion mode when non-empty: distortion_table[b] = D(b) (e.g. measured Lloyd-Max MSE
  // per width), indexed by bit width, size > b_max. Must be strictly decreasing and convex on
  // [b_min, b_max] (then the marginal gains s_i (D(b) - D(b+1)) fall with b and the greedy is
  // exactly optimal); otherwise kvq::Error.
  std::vector<double> distortion_table;
};

struct GreedyResult {
  std::vector<int> bits;       // per block, in [b_min, b_max]
  int64_t budget = 0;          // B = floor(n_b * bits_per_dim): block-bits asked for
  int64_t used = 0;            // sum of bits (== budget: a valid budget always fits)
  double effective_bits_per_dim = 0.0;  // used / n_b (code bits per dim; <= nominal when it floors)
  double objective = 0.0;      // J(b) = sum s_i D(b_i)
};

// The greedy of Theorem 1 on one head. Each step gives a bit to the block with the largest
// marginal gain (for 4^-b that is argmax s_i 4^-b_i) among blocks below b_max, ties to the lower
// block index. Computed without stepping: per block the gains fall with b, so the result is the
// top (B - n_b*b_min) gains of all blocks under the order (gain desc, index asc).
// Errors (kvq::Error, field + value): bits_per_dim <= 0, < b_min, > b_max or not finite; energies
// empty, negative or not finite; bad b_min/b_max; bad distortion_table.
GreedyResult block_gtq_greedy(const std::vector<double>& energies, double bits_per_dim,
                              const GreedyOptions& opt = {});

// Throws kvq::Error unless table is strictly decreasing and convex on [b_min, b_max].
void check_distortion_table(const std::vector<double>& table, int b_min, int b_max);

// J(b) under 4^-b (table empty) or the table.
double block_gtq_objective(const std::vector<double>& energies, const std::vector<int>& bits,
                           const std::vector<double>& distortion_table = {});

// Groups of equal width, in increasing width; each group's dims are the coordinates of its blocks
// in block order, each block contributing its (a, b) pair as rope_block_coords() gives it.
std::vector<TqGroup> groups_from_block_bits(const std::vector<int>& block_bits, RopePairing pairing,
                                            int head_dim, int rotary_dim);

struct BlockGtqInput {
  Shape shape;
  int rotary_dim = 0;          // d_r (0 = head_dim)
  RopePairing pairing = RopePairing::kSplitHalf;
  // [head_index][block]: n_b = head_dim / 2 energies s_{l,h,i} (unrotated tail pairs included).
  std::vector<std::vector<double>> energies;
};

// D(bits, m): the distortion of one coordinate group of `bits` and m coordinates, in the units of
// the distortion table (e.g. the coded codebook's per-vector MSE E||u - Q(u)||^2 at m).
using GroupDistortion = std::function<double(int bits, int m)>;

struct BlockGtqOptions {
  GreedyOptions greedy;
  // When set, replaces greedy.distortion_table: the distortion of a width depends on the size of
  // the group that width forms (all blocks of one width are one group, m = 2 x their count), so
  // each head's table is found by fixed-point iteration on its own allocation:
  //   T_0(b) = D(b, head_dim);  A_k = greedy(T_k);
  //   T_{k+1}(b) = D(b, m_b(A_k)), m_b = 2 x (blocks of A_k at width b), or 2 when none (a block
  //   moved to an empty width is a group of one block);
  // stopping when A_k = A_{k-1} (the table is its own groups'), when T_k is not strictly
  // decreasing and convex (the greedy would not be exact) or after max_table_iterations tables.
  // The head gets, of the A_k computed, the one with the least self-consistent objective
  // J(A) = sum_i s_i D(b_i, m_{b_i}(A)) (ties: the earliest), and predicted_distortion = J(A).
  GroupDistortion group_distortion;
  int max_table_iterations = 8;
  uint64_t seed = 42;  // base of derive_seed(); group rotation seed tag = the group's width
  Overhead overhead;
};

// K side decisions (post-RoPE TQ-MSE groups). V is allocate_uniform(..., Side::kV, b_V).
Allocation allocate_block_gtq(const BlockGtqInput& in, double bits_per_dim,
                              const BlockGtqOptions& opt = {});

}  // namespace kvq::alloc
