#pragma once
// What kvq-inspect shows, as data: derived from calibration and allocation files only (lib/io,
// lib/stats, lib/alloc), so the terminal summary, the CSV/JSON tables and the plots agree.
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "kvq/format/decision.hpp"
#include "kvq/format/decision_layout.hpp"
#include "kvq/io/alloc_file.hpp"
#include "kvq/io/calib_file.hpp"
#include "kvq/io/kvq_file.hpp"
#include "kvq/util/statistics.hpp"

namespace kvq::report {

using FileKind = KvqFileKind;
// From the root @format and @version (kvq::read_kvq_header). Throws kvq::Error (file, field, what
// was found) for anything that is not a kvq calibration or allocation file this kvq reads.
FileKind detect_kind(const std::string& path);

// ---- allocation ----

// Stored width of each of the head's d coordinates, and their sum, the code bits per token: the
// kind's row of kCodingKinds (kvq/format/coding_kinds.hpp). TQ groups: per head dimension; low
// rank: the `rank` kept eigen-directions at `bits`, the other d - rank at 0 (not stored); KIVI: all
// at `bits`; minifloat: 8 (FP8) or 4 (NVFP4).
using kvq::code_bits;
using kvq::dim_widths;
// Width of each RoPE block (both coordinates) for TQ-group heads; empty for codings without a
// per-block width (low rank, KIVI).
std::vector<int> block_widths(const HeadDecision& h, const CalibProvenance& p);
// Effective bpd of the head's packed layout (codes + norms + scales); NaN if the codec refuses it.
double head_effective_bpd(const HeadDecision& h, int head_dim);

// The allocator fingerprint of one side: per layer, how many head dimensions (summed over KV
// heads) are stored at each width.
struct Fingerprint {
  Side side = Side::kK;
  int max_width = 8;                        // columns 0..max_width
  std::vector<std::vector<int64_t>> dims;   // [layer][width]
  double share(int layer, int width) const;  // fraction of the layer's dims
  double mean_bits(int layer) const;
};
Fingerprint fingerprint(const AllocFile& a, Side side);

// The method a side was allocated with, parsed from the name the file records (once, here);
// nullopt for a name this kvq does not know.
std::optional<Method> side_method(const AllocFile& a, Side side);
bool has_side(const AllocFile& a, Side side);

// Per-head predicted distortion at the even split, i.e. before C2, recomputed from the
// calibration with the solver parameters the allocation records (same C1 as kvq-allocate; KL
// weights for cobra-kl). Indexed layer * n_kv_heads + head. Empty when the side is not a COBRA
// model allocation (uniform, block-gtq) or is cobra-measured (its curves are measured with the
// codec on the reservoir, not recomputed here).
std::vector<double> cobra_distortion_before(const AllocFile& a, const CalibFile& c, Side side);
// The before-C2 distortions to show: the solver's own, stored in the allocation (any COBRA
// method, cobra-measured included); for files written before kvq stored them, recomputed from `c`
// when given (cobra_distortion_before), else empty. Same indexing.
std::vector<double> distortion_before_c2(const AllocFile& a, const CalibFile* c, Side side);
// Per-head predicted distortion after C2 as stored in the decisions (same indexing).
std::vector<double> cobra_distortion_after(const AllocFile& a, Side side);

// ---- calibration ----

struct HeadEnergy {
  int layer = 0, kv_head = 0;
  int64_t tokens_k = 0, tokens_q = 0;  // samples in the sums (q: every query head of the group)
  double trace_k = 0, trace_v = 0;     // E|k|^2, E|v|^2 (uncentered)
  std::vector<double> energy;          // Block-GTQ s_i per RoPE block
  double median = 0;
  double max_over_median = 0, max_over_min = 0;  // spread (min clamped at 1e-30)
  int top_block = 0;
  double top_quarter_share = 0;        // share of sum s_i in the ceil(n_b/4) largest blocks
};
std::vector<HeadEnergy> head_energies(const CalibFile& c);  // layer-major

struct Spectra {
  std::vector<double> k, v;  // eigenvalues, descending
};
// Eigenvalues of the K (pre-RoPE) and V covariance (centered) or second moment (uncentered).
Spectra eigen_spectra(const CalibFile& c, int layer, int kv_head, bool centered = true);

// ---- comparison of two allocations ----

struct LayerMove {
  Side side = Side::kK;
  int layer = 0;
  int64_t bits_a = 0, bits_b = 0;  // code bits per token, all KV heads of the layer
  int64_t gained = 0, lost = 0;    // bits per token that B adds / removes relative to A
  bool per_dim = true;             // gained/lost counted per coordinate (both TQ groups) or per head
};
struct Comparison {
  std::vector<LayerMove> layers;  // K layers then V layers
};
// Throws kvq::Error naming file B and the first model field that differs (the two allocations
// must be of the same model: config hash, architecture, shape, RoPE geometry).
Comparison compare_allocs(const AllocFile& a, const std::string& path_a, const AllocFile& b,
                          const std::string& path_b);

}  // namespace kvq::report
