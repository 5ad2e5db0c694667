#pragma once
// The figures of kvq-inspect, drawn with cairo. Each function writes <stem>.png and <stem>.svg
// (atomically; the same drawing on both surfaces), at the fixed pixel size below, and returns the
// two paths. The SVG has the same size in px.
#include <string>
#include <vector>

#include "kvq/io/alloc_file.hpp"
#include "kvq/io/calib_file.hpp"
#include "kvq/io/probe_file.hpp"
#include "kvq/report/summary.hpp"

namespace kvq::report {

struct PlotSize {
  int width, height;
};
inline constexpr PlotSize kFingerprintSize{1100, 820};
inline constexpr PlotSize kEnergySize{1000, 600};
inline constexpr PlotSize kCobraSize{1200, 820};
inline constexpr PlotSize kEigenSize{1000, 600};
inline constexpr PlotSize kCompareSize{1100, 820};
inline constexpr PlotSize kProbeSize{1000, 600};

// (a) Allocator fingerprint: per side, one stacked column per layer with the share of head
// dimensions at each width (1 b red -> 8 b green, 0 b = not stored, grey); mean bits on top.
std::vector<std::string> plot_fingerprint(const AllocFile& a, const std::string& stem);

// (b) Block-GTQ energy spectrum of one (layer, KV head): s_i / median(s) on a log axis, the bars
// coloured by the allocated width and the allocated bits per block as a step line on the right
// axis (when `a` is given and codes K in TQ groups).
std::vector<std::string> plot_energy(const CalibFile& c, const AllocFile* a, int layer, int kv_head,
                                     const std::string& stem);

// (c) COBRA heads: per side coded low rank, the (rank, bits) of every head (marker area = heads at
// that point; the even budget r*b = d*bpd as a dashed curve) and the per-head predicted distortion
// before C2 (`k_before` / `v_before` as distortion_before_c2 gives them; may be empty) and after C2,
// head index layer-major, log axis.
std::vector<std::string> plot_cobra_heads(const AllocFile& a, const std::vector<double>& k_before,
                                          const std::vector<double>& v_before, const std::string& stem);

// (d) Eigenvalue spectra of K (pre-RoPE) and V of one head; with `a`, the kept rank of each
// low-rank side marked.
std::vector<std::string> plot_eigen(const CalibFile& c, const AllocFile* a, int layer, int kv_head,
                                    const std::string& stem);

// Comparison: code bits per token per layer, A beside B, with the bits B gains / loses.
std::vector<std::string> plot_compare(const AllocFile& a, const std::string& label_a, const AllocFile& b,
                                      const std::string& label_b, const Comparison& cmp, const std::string& stem);

// (g) A probe file (kvq-probe): per layer, the end-to-end KL of each candidate coding of that layer
// alone (log scale), one line per candidate; with an allocation probe, the composite as a note.
std::vector<std::string> plot_probe(const ProbeFile& p, const std::string& stem);

}  // namespace kvq::report
