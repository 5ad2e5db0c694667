#pragma once
// Internal to the KV-COBRA files of kvq_alloc: prefix sums and C1 on them (cobra_c1.cpp), the
// budget checks (cobra_model.cpp), and the model-grid staircase builder of exact C2
// (cobra_stairs.cpp), used by the C2 solvers (cobra_c2.cpp).
#include <cstddef>
#include <cstdint>
#include <vector>

#include "exact_flat.hpp"
#include "kvq/alloc/cobra.hpp"

namespace kvq::alloc::detail {

// One head's spectrum in the form every solver uses: P[r] = sum_{i<r} lambda_i; S = P[d].
// D(r, b) = (S - P[r]) + q(b) P[r] is evaluated by this one expression everywhere so that C1,
// the curves and the decisions agree to the bit.
struct Prefix {
  const double* p;
  int d;
  double total() const { return p[d]; }
  double dist(int r, double q) const { return (p[d] - p[r]) + q * p[r]; }
};

// Every head's prefix sums back to back: one allocation for the whole panel.
struct Prefixes {
  int d = 0;
  std::vector<double> data;
  Prefix operator[](size_t h) const { return {data.data() + h * (d + 1), d}; }
  size_t size() const { return d >= 0 && !data.empty() ? data.size() / (d + 1) : 0; }
};

// Prefix sums of one spectrum (taken as given: no checks).
Prefixes make_prefix(const std::vector<double>& lambda);

// Every head's prefix sums into *out, whose storage is reused (callers keep one per thread: the
// panel is large and rebuilt on every call). Bit for bit the sequential sums p[i+1] = p[i] + l[i].
// *d = the head dimension (spectra[0]'s length); throws kvq::Error on a bad spectrum.
void prefixes(const std::vector<std::vector<double>>& spectra, int* d, Prefixes* out);

// q[b] = c 2^-2b for b = 0 .. b_max.
std::vector<double> q_table(const CobraModel& m);

// C1 on a head's prefix sums (see cobra_c1 for the rule); q = q_table(m).
RankBits c1_prefix(const Prefix& pr, int d, int64_t budget, const CobraModel& m,
                   const std::vector<double>& q);

// C1 (floor mode) when its minimum is already known: `target` = D*(budget), the staircase value
// of the exact solver. Same result as c1_prefix, to the bit, when it returns true; false: no rank
// attains the target (the caller runs c1_prefix).
bool c1_at_target(const Prefix& pr, int d, int64_t budget, const CobraModel& m,
                  const std::vector<double>& q, double target, RankBits* out);

// sum of a[0 .. n) in numpy's order for a contiguous float64 array (ndarray.sum, np.mean's sum):
// its pairwise summation with 8 accumulators, added to the reduction's 0.0 start.
double numpy_sum(const double* a, int64_t n);

// cobra_c1_reference on a validated spectrum of length d; q = q_table(m).
RankBits c1_reference(const double* lam, int d, int64_t budget, const CobraModel& m,
                      const std::vector<double>& q);

// Throws kvq::Error unless 0 < bpd <= b_max.
void check_bpd(double bpd, const CobraModel& m);

// Throws kvq::Error when n heads at the floor already exceed the total.
void check_total(int64_t total, int n, int64_t floor_b);

// The (r, b) options of the model grid no heavier than the head cap, shared by every head (the
// weights do not depend on the spectrum). Chain k holds b = b_min + k over the ranks
// r_j = r_min + j r_step.
struct ModelGrid {
  int J = 0, K = 0, JS = 0;       // ranks, widths, row stride of a head's value table (J + 2)
  std::vector<int32_t> rank;      // [j]
  std::vector<double> q;          // [k] = q(b_min + k)
  std::vector<int32_t> len;       // [k]: ranks j < len[k] have r_j b_k <= cap (falls with k)
  std::vector<int32_t> chains;    // [j]: chains holding rank j (k < chains[j])
  std::vector<double> q_last;     // [j]: q of the widest of them (the rank's lowest D)
  // [k * J + j], k >= 1: the heaviest chain-0 option no heavier than (j, k), as its j; J when
  // there is none (the value table holds +inf there). Grows with k.
  std::vector<int32_t> dom;
  // [k * J + j], k >= 2: the same in chain k - 1 (its heaviest option no heavier than (j, k)).
  std::vector<int32_t> dom_prev;
  std::vector<int32_t> dom1;      // [j]: dom for k = 1; J + 1 when rank j has no chain 1
  // Options in weight order (weight, then rank asc, bits desc): value-table slot k * JS + j and
  // the cost charged, max(r b, floor); pos[k * J + j] = an option's place in that order.
  std::vector<int32_t> slot;
  std::vector<int64_t> cost;
  std::vector<int32_t> pos;
  int words = 0;                  // 64-bit words of a bitmap over positions
  // Chain 0 by rank: cost charged (int and double), position; j_floor = the last rank charged the
  // floor (-1 if none); beyond it the costs strictly rise.
  std::vector<int64_t> cost0;
  std::vector<double> cost0d;
  std::vector<int32_t> pos0;
  std::vector<int32_t> before0;   // [p]: chain-0 options before position p (p = N: all)
  int j_floor = -1;

  // qt = q_table(m); floor_b / cap = the per-head budget floor and cap.
  ModelGrid(int d, const CobraModel& m, const std::vector<double>& qt, int64_t floor_b,
            int64_t cap);
};

// Scratch of the per-head builder (kept per thread by the caller).
struct StairScratch {
  std::vector<double> vals, e0;
  std::vector<int32_t> cand, done;
  std::vector<uint64_t> bm;
  void fit(const ModelGrid& g) {
    const size_t J = static_cast<size_t>(g.J);
    if (cand.size() < J) cand.resize(J), done.resize(J + 1), e0.resize(J);
    if (vals.size() < static_cast<size_t>(g.K) * g.JS) vals.resize(static_cast<size_t>(g.K) * g.JS);
    if (bm.size() < static_cast<size_t>(g.words)) bm.resize(g.words);
  }
};

// One head's staircase D*(B) over the grid's options (plus rank 0), its lower hull and the hull's
// slopes, appended to `st` with floor_b / cap as the head's budget floor and cap. With
// merge_extras false the options above chain 0 that survive the dominance test go to st->ex_*
// instead of onto the staircase (cobra_stairs.cpp describes the construction).
void model_stairs(const Prefix& pr, const ModelGrid& g, int64_t floor_b, int64_t cap,
                  bool merge_extras, StairScratch* sc, Stairs* st);

}  // namespace kvq::alloc::detail
