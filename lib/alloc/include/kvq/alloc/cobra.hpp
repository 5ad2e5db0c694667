#pragma once
// KV-COBRA: per-head rank/bit choice (C1), cross-head budget split (C2 damped, C2
// exact, C2 exact over measured distortion), KL reordering of the basis, joint K/V split.
//
// Distortion model per head (eigenvalues lambda_1 >= ... >= lambda_d of the head's covariance):
//   D(r, b) = sum_{i>r} lambda_i + q(b) sum_{i<=r} lambda_i,   q(b) = c 2^(-2b).
// c defaults to 1/12, the reference code's value (Bennett's Delta^2/12 with the range folded in).
// The solvers only see eigenvalues (or weights); bases and means are copied into the decisions.
#include <Eigen/Dense>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "kvq/alloc/common.hpp"
#include "kvq/alloc/exact.hpp"

namespace kvq::alloc {

// C1 bit width from a budget: floor(B/r) (r*b <= B always) or the reference's legacy
// round(B/r), which can exceed B. Values are written to disk: never renumber.
enum class C1Rounding : uint32_t { kFloor = 0, kRound = 1 };
const char* to_string(C1Rounding r);
C1Rounding c1_rounding_from_string(const std::string& s);  // throws kvq::Error

struct CobraModel {
  double c = 1.0 / 12.0;  // q(b) = c 2^-2b
  int r_min = 2;          // rank grid r_min, r_min + r_step, ... <= d
  int r_step = 2;
  int b_min = 2;          // ranks with (floor|round)(B/r) < b_min are infeasible
  int b_max = 8;
  C1Rounding rounding = C1Rounding::kFloor;
};
void validate_model(const CobraModel& m, int head_dim);  // throws kvq::Error

struct RankBits {
  int rank = 0;  // 0 = nothing stored (decode to the mean): only when no grid rank is feasible
  int bits = 0;
  double distortion = 0.0;
};

// Validated copy of a spectrum: length d, finite, descending, non-negative. Negatives down to
// -1e-12 * max (eigen-solver noise) become 0; anything else throws kvq::Error naming `field`.
std::vector<double> checked_spectrum(const std::vector<double>& lambda, int head_dim,
                                     const std::string& field);

double cobra_distortion(const std::vector<double>& lambda, int rank, int bits,
                        const CobraModel& m);

// C1: argmin_r D(r, b(r)) over the rank grid, b(r) = min(floor(B/r), b_max) (kFloor) or
// min(round_half_even(B/r), b_max) (kRound, candidate ranks also capped at floor(B/b_min) as the
// reference does); ranks whose unclipped b is below b_min are skipped. Ties -> smaller rank. If no
// rank is feasible: rank 0, D = sum(lambda).
RankBits cobra_c1(const std::vector<double>& lambda, int64_t budget, const CobraModel& m);

// sum_h B_h target for L*H heads at `bpd` bits per dim: llround(n_heads * d * bpd) (half away from
// zero), so non-integer bpd (0.5, 1.5) is fine.
int64_t cobra_total_budget(int n_heads, int head_dim, double bpd);

// Per-head floor B_min = max(abs, floor(Bbar / div)), Bbar = d * bpd (reference: 4 and 4).
struct BudgetFloor {
  int64_t abs = 4;
  int64_t div = 4;
};
int64_t cobra_min_head_budget(double bbar, const BudgetFloor& f);

// The even split of `total` over n heads: floor(total/n), the first total mod n heads get +1.
std::vector<int64_t> even_split(int64_t total, int n);

struct DampedOptions {
  int rounds = 5;
  double damping = 0.3;
};

// One round of the damped update, for step-by-step checks. Integer rounding (as the reference):
//   step_h     = trunc_toward_zero(damping * Bbar * (sqrt(D_h / mean D) - 1))   (0 if mean D <= 0)
//   after_step = max(B_min, B_h + step_h)
//   renorm     = max(B_min, floor(after_step_h * total / sum_h after_step))     (exact integers)
struct DampedRound {
  std::vector<int64_t> start;     // budgets entering the round
  std::vector<double> distortion; // D*_h(start_h) by C1
  double mean_distortion = 0.0;
  std::vector<int64_t> step;
  std::vector<int64_t> after_step;
  int64_t sum_after_step = 0;
  std::vector<int64_t> after_renorm;  // = next round's start
};

struct C2Result {
  std::vector<int64_t> budgets;        // final B_h
  std::vector<RankBits> choice;        // C1 (or the measured table's best point) at B_h
  int64_t total_target = 0;            // B_tot
  int64_t total_assigned = 0;          // sum B_h (damped may drift; exact never does)
  int64_t head_floor = 0;              // B_min used
  double objective = 0.0;              // sum_h D*_h(B_h)
  std::vector<double> uniform_distortion;  // D*_h at the even split (the "before C2" panel)
  std::vector<DampedRound> rounds;     // damped only
  ExactSolution exact;                 // exact only (diagnostics)
};

// C1 at the even split, no redistribution.
C2Result cobra_c2_none(const std::vector<std::vector<double>>& spectra, int64_t total,
                       const CobraModel& m);

// Damped proportional update. Starts from even_split(total), Bbar = total / n_heads (= d * bpd),
// floor from BudgetFloor. The result can leave budget unused (or overshoot via the floor); the
// drift is total_assigned - total_target.
C2Result cobra_c2_damped(const std::vector<std::vector<double>>& spectra, int64_t total,
                         const CobraModel& m, const DampedOptions& opt = {},
                         const BudgetFloor& floor = {});

// ---- Reference mode: the KV-COBRA reference code's C1 and damped C2, reproduced as it runs ----
// kvq's own damped C2 (above) fixes several of the reference's rounding quirks; this mode keeps
// them so that (r, b) and B_h are the reference's on the same spectra. The order of operations is
// listed in cobra_c2.cpp. In short: per-head budget trunc(bpd * d), total = that * n heads; each
// round evaluates D at the rank re-derived from C1's width (max(r_min, min(d, B div b))), not at
// C1's rank; steps and renormalised budgets are truncated to integers; every sum of eigenvalues
// is taken in numpy's pairwise order. The model's r_min, r_step, b_min, b_max, c and rounding
// stand in for the reference's constants (2, 2, 2, 8, 1/12); float64 spectra are assumed (the
// reference's MSE variant sums its fp32 eigenvalues in fp32 inside C2: not reproduced).

// The reference's per-head budget: trunc(bpd * head_dim), the product in double.
int64_t cobra_reference_head_budget(int head_dim, double bpd);

// The reference's choice for one head at budget B: its C1, then the width clipped to
// [b_min, b_max] and the rank re-derived as max(r_min, min(d, B div b)). distortion = D(r, b) of
// that pair, summed as numpy sums (pairwise). This is the (r, b) the reference codes with.
RankBits cobra_c1_reference(const std::vector<double>& lambda, int64_t budget, const CobraModel& m);

// The reference's damped C2: every head starts at head_budget (= cobra_reference_head_budget),
// total_target = head_budget * n; floor max(floor.abs, head_budget div floor.div). rounds[] hold
// the steps (distortion = D at the re-derived rank); choice = cobra_c1_reference at the final B_h.
C2Result cobra_c2_reference(const std::vector<std::vector<double>>& spectra, int64_t head_budget,
                            const CobraModel& m, const DampedOptions& opt = {},
                            const BudgetFloor& floor = {});

// Exact integer optimum of sum_h D*_h(B_h), sum_h B_h = total, B_h in [B_min, head_max]
// (head_max 0 = d * b_max, beyond which D* is flat), by the solver behind solve_exact_budget (the
// curves are built straight from the grid, not through make_curve). Needs kFloor rounding: with
// kRound, D*(B) is not a budget-feasible curve (the head may spend more than B) and kvq::Error is
// thrown.
C2Result cobra_c2_exact(const std::vector<std::vector<double>>& spectra, int64_t total,
                        const CobraModel& m, const BudgetFloor& floor = {}, int64_t head_max = 0);

// Measured distortion: mse[i * n_bits + (b - b_min)] is the MSE measured at (ranks[i], b), n_bits =
// b_max - b_min + 1. rank0_mse (decode to the mean) is an option only when finite.
struct MeasuredTable {
  std::vector<int> ranks;  // strictly ascending, in [1, d]
  int b_min = 2;
  int b_max = 8;
  std::vector<double> mse;
  double rank0_mse = std::numeric_limits<double>::quiet_NaN();
};
void validate_measured(const MeasuredTable& t, int head_dim, const std::string& field);

// Exact C2 where D_h(r, b) is the caller's table (min over entries with r*b <= B_h).
C2Result cobra_c2_exact_measured(const std::vector<MeasuredTable>& tables, int head_dim,
                                 int64_t total, const BudgetFloor& floor = {},
                                 int64_t head_max = 0);

// KL reordering: w_i = q_var_i * lambda_i (q_var_i = u_i^T Sigma_Q u_i), sorted descending (ties
// keep the original order). perm[j] = index of the original direction now at position j.
struct KlOrder {
  std::vector<double> weights;
  std::vector<int> perm;
};
KlOrder kl_reorder(const std::vector<double>& lambda, const std::vector<double>& query_variance);

// q_var_i = u_i^T Sigma_Q u_i for every column u_i of U.
std::vector<double> query_variance_along(const Eigen::MatrixXd& sigma_q, const Eigen::MatrixXd& u);

// ---- Whole-model allocation (decisions + summary) ----

// kReference: cobra_c2_reference (the reference code's damped C2 with its roundings); recorded
// as c2 = "reference" with budget_rule "int(d * bpd) * heads".
enum class C2Kind : uint32_t { kNone = 0, kDamped = 1, kExact = 2, kReference = 3 };
const char* to_string(C2Kind k);
C2Kind c2_kind_from_string(const std::string& s);

struct CobraHeadInput {
  std::vector<double> eigenvalues;  // descending, length d
  Eigen::MatrixXd eigenvectors;     // d x d, column i <-> eigenvalues[i]; empty = no basis output
  Eigen::VectorXd mean;             // length d; empty = no mean output
  std::vector<double> query_variance;  // per eigen-direction; required when kl is on
};

struct CobraOptions {
  CobraModel model;
  C2Kind c2 = C2Kind::kDamped;
  DampedOptions damped;
  BudgetFloor floor;
  int64_t head_max = 0;  // exact C2 cap per head (0 = d * b_max)
  bool kl = false;
  uint64_t seed = 42;    // Hadamard sign seeds: derive_seed(seed, layer, head, side, 0)
  Overhead overhead;
};

// One side (K pre-RoPE or V). Method: kCobraDp for exact C2, else kCobraKl / kCobraMse.
Allocation allocate_cobra(const Shape& shape, Side side, const std::vector<CobraHeadInput>& heads,
                          double bpd, const CobraOptions& opt = {});

// Joint K/V: one budget llround(2 * L * H * d * bpd) split over the union of the K and V curves by
// the exact solver (opt.c2 must be kExact). heads = all K heads then all V heads.
Allocation allocate_cobra_joint(const Shape& shape, const std::vector<CobraHeadInput>& k_heads,
                                const std::vector<CobraHeadInput>& v_heads, double bpd,
                                const CobraOptions& opt = {});

// Measured distortion + exact C2. `heads` may be empty (then no basis/mean output); when given,
// its eigenvector columns must be in the order the tables were measured in (no KL reordering).
Allocation allocate_cobra_measured(const Shape& shape, Side side,
                                   const std::vector<MeasuredTable>& tables,
                                   const std::vector<CobraHeadInput>& heads, double bpd,
                                   const CobraOptions& opt = {});

}  // namespace kvq::alloc
