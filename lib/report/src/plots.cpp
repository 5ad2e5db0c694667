#include "kvq/report/plots.hpp"

#include <algorithm>
#include <cmath>
#include <map>

#include "chart.hpp"
#include "kvq/io/h5_paths.hpp"
#include "kvq/report/table.hpp"
#include "kvq/stats/derived.hpp"
#include "kvq/util/error.hpp"

namespace kvq::report {
namespace {

using namespace chart;

std::string base_name(const std::string& p) {
  auto s = p.find_last_of('/');
  return s == std::string::npos ? p : p.substr(s + 1);
}

const char* side_name(Side s) { return s == Side::kK ? "K" : "V"; }
Color side_color(Side s) { return s == Side::kK ? kBlue : kOrange; }

std::string model_line(const CalibProvenance& p) {
  // Allocation files do not record the model path; the config hash identifies the model.
  const std::string name =
      p.model_path.empty() ? "model " + p.model_config_sha256.substr(0, 12) : base_name(p.model_path);
  return name + " (" + p.architecture + ", " + std::to_string(p.n_layers) + " layers, " +
         std::to_string(p.n_kv_heads) + " KV heads, d = " + std::to_string(p.head_dim) + ")";
}

// Integer category ticks 0..n-1, thinned to at most ~24 labels.
std::vector<std::pair<double, std::string>> index_ticks(int n, const std::string& prefix = "") {
  std::vector<std::pair<double, std::string>> t;
  const int step = std::max(1, (n + 23) / 24);
  for (int i = 0; i < n; i += step) t.push_back({double(i), prefix + std::to_string(i)});
  return t;
}

// Log-axis limits spanning the positive values with a margin (whole decades for wide ranges);
// `headroom`: fraction of the height kept free at the top for a legend.
Axis log_axis(const std::vector<double>& vals, const std::string& label, double headroom = 0) {
  double lo = HUGE_VAL, hi = 0;
  for (double v : vals)
    if (v > 0 && std::isfinite(v)) {
      lo = std::min(lo, v);
      hi = std::max(hi, v);
    }
  if (!(hi > 0)) lo = 0.1, hi = 10;
  Axis a;
  a.log = true;
  a.label = label;
  a.lo = lo / 1.4;
  a.hi = hi * 1.4;
  if (a.hi / a.lo > 100) {  // wide ranges: whole decades
    a.lo = std::pow(10.0, std::floor(std::log10(lo) - 0.05));
    a.hi = std::pow(10.0, std::ceil(std::log10(hi) + 0.05));
  }
  if (headroom > 0) a.hi *= std::pow(a.hi / a.lo, headroom / (1 - headroom));
  return a;
}

std::string bpd_line(const AllocFile& a, Side s) {
  const bool k = s == Side::kK;
  return std::string(k ? a.method : a.v_method) + " at " + fmt(k ? a.k_bpd_nominal : a.v_bpd_nominal) +
         " bpd nominal, " + fmt_fixed(k ? a.k_bpd_effective : a.v_bpd_effective, 3) + " effective";
}

const HeadDecision* find_head(const AllocFile& a, Side s, int layer, int head) {
  for (const auto& h : a.heads)
    if (h.side == s && h.layer == layer && h.kv_head == head) return &h;
  return nullptr;
}

void check_head(const CalibFile& c, int layer, int head) {
  const auto sh = c.shape();
  if (layer < 0 || layer >= sh.n_layers)
    throw Error("", "--layer", std::to_string(layer) + " is out of range (the model has " +
                                   std::to_string(sh.n_layers) + " layers, 0.." + std::to_string(sh.n_layers - 1) + ")");
  if (head < 0 || head >= sh.n_kv_heads)
    throw Error("", "--head", std::to_string(head) + " is out of range (the model has " +
                                  std::to_string(sh.n_kv_heads) + " KV heads, 0.." +
                                  std::to_string(sh.n_kv_heads - 1) + ")");
}

std::vector<std::string> outputs(const std::string& stem) { return {stem + ".png", stem + ".svg"}; }

}  // namespace

std::vector<std::string> plot_fingerprint(const AllocFile& a, const std::string& stem) {
  std::vector<Side> sides;
  for (Side s : {Side::kK, Side::kV})
    if (has_side(a, s)) sides.push_back(s);
  if (sides.empty()) throw Error("", "heads", "the allocation has no decisions to plot");
  const int W = kFingerprintSize.width, H = kFingerprintSize.height, L = a.calib.n_layers;
  render(stem, W, H, [&](cairo_t* cr) {
    text(cr, W / 2.0, 10, "Allocator fingerprint: " + model_line(a.calib), 16, 0.5, 0, true);
    const double top = 36, rowh = (H - top) / double(sides.size());
    for (size_t i = 0; i < sides.size(); ++i) {
      const Side side = sides[i];
      const Fingerprint f = fingerprint(a, side);
      Panel p(cr, 0, top + double(i) * rowh, W, rowh - 4, 200);
      p.x_axis({-0.6, L - 0.4, false, "layer", index_ticks(L)});
      p.y_axis({0, 110, false, "share of " + std::string(side_name(side)) + " head dimensions (%)",
                {{0, "0"}, {25, "25"}, {50, "50"}, {75, "75"}, {100, "100"}}});
      p.frame(std::string(side_name(side)) + ": " + bpd_line(a, side),
              "one column per layer, all KV heads; number on top = mean stored bits per dimension");
      for (int l = 0; l < L; ++l) {
        double y = 0;
        for (int w = 0; w <= f.max_width; ++w) {
          const double s = 100 * f.share(l, w);
          if (s <= 0) continue;
          p.bar(l - 0.38, l + 0.38, y, y + s, width_color(w), false);
          y += s;
        }
        if (L <= 40) p.label(l, 101, fmt_fixed(f.mean_bits(l), 2), L > 20 ? 8 : 10, 0.5, 1);
      }
      std::vector<LegendEntry> legend;
      for (int w = std::max(8, f.max_width); w >= 0; --w) {
        bool used = false;
        for (int l = 0; l < L; ++l) used |= f.dims[size_t(l)].size() > size_t(w) && f.dims[size_t(l)][size_t(w)] > 0;
        if (w == 0 && !used) continue;  // the 1..8 scale is always shown; 0 and >8 only when present
        if (w > 8 && !used) continue;
        legend.push_back({std::to_string(w) + " b" + (w == 0 ? " (not stored)" : ""), width_color(w), Mark::kBox, !used});
      }
      p.legend(legend, Corner::kOutsideRight, "bits / dim (pale: unused)");
    }
  });
  return outputs(stem);
}

std::vector<std::string> plot_energy(const CalibFile& c, const AllocFile* a, int layer, int kv_head,
                                     const std::string& stem) {
  check_head(c, layer, kv_head);
  const auto sh = c.shape();
  if (c.moments.k.count_of(sh, layer, kv_head) == 0 || c.moments.q.count_of(sh, layer, kv_head) == 0)
    throw Error("", h5path::kStatsCountK, "no samples for layer " + std::to_string(layer) + " head " + std::to_string(kv_head));
  RopeGeometry g{c.prov.pairing, sh.head_dim, c.prov.rotary_dim};
  const std::vector<double> s = block_energies(c.moments, g, layer, kv_head);
  std::vector<double> sorted = s;
  std::sort(sorted.begin(), sorted.end());
  const size_t n = s.size();
  double median = n % 2 ? sorted[n / 2] : 0.5 * (sorted[n / 2 - 1] + sorted[n / 2]);
  if (!(median > 0)) median = std::max(sorted.back(), 1e-30);
  std::vector<double> norm;
  for (double v : s) norm.push_back(v / median);

  std::vector<int> bits;
  std::string note;
  if (a) {
    const HeadDecision* h = find_head(*a, Side::kK, layer, kv_head);
    if (h) bits = block_widths(*h, a->calib);
    if (bits.empty())
      note = "K is coded " + std::string(h && uses(*h, kFieldRank)
                                             ? "in a low-rank eigenbasis (rank " + std::to_string(h->rank) + ", " +
                                                   std::to_string(h->bits) + " b): no per-block width, see the eigen plot"
                                             : "without per-block widths");
  }
  const int nr = c.prov.rotary_dim / 2;
  const int W = kEnergySize.width, H = kEnergySize.height;
  render(stem, W, H, [&](cairo_t* cr) {
    Panel p(cr, 0, 8, W, H - 8, bits.empty() ? 24 : 70);
    p.x_axis({-0.6, n - 0.4, false, "RoPE block i  (frequency θ_i = base^(-2i/d_r) falls to the right)", {}, true});
    Axis y = log_axis(norm, "block energy s_i / median(s)   (log scale)", 0.18);
    p.y_axis(y);
    if (!bits.empty()) p.y2_axis({0, 9, false, "allocated bits per dimension", index_ticks(9)});
    std::string title = "Block energy spectrum: layer " + std::to_string(layer) + ", KV head " + std::to_string(kv_head);
    if (a) title += "   (" + bpd_line(*a, Side::kK) + ")";
    std::string sub = "s_i = ½ E‖q_(i)‖² + ½ E‖k_(i)‖², " + std::string(to_string(c.prov.pairing)) +
                      " pairing, median s = " + fmt(median) + "; " + model_line(c.prov);
    p.frame(title, note.empty() ? sub : note);
    for (size_t i = 0; i < n; ++i)
      p.bar(double(i) - 0.4, double(i) + 0.4, y.lo, norm[i], bits.empty() ? Color{0.55, 0.70, 0.85, 1} : width_color(bits[i]),
            true);
    p.hline(1, kGrey, 1.0, true);
    p.label(n - 0.5, 1, "median", 10, 1, 1, kDarkGrey);
    if (nr < int(n)) {
      p.vline(nr - 0.5, kDarkGrey, 1.2, true);
      p.label(nr - 0.3, y.hi, "unrotated dims (θ = 0) →", 10, 0, 0, kDarkGrey);
    }
    std::vector<LegendEntry> legend = {
        {"s_i / median" + std::string(bits.empty() ? "" : " (bar colour = width)"),
         bits.empty() ? Color{0.55, 0.70, 0.85, 1} : width_color(4), Mark::kBox}};
    if (!bits.empty()) {
      std::vector<double> xs, ys;
      for (size_t i = 0; i < n; ++i) {
        xs.push_back(double(i));
        ys.push_back(bits[i]);
      }
      p.steps(xs, ys, 0.45, kBlack, 2.5, true);
      for (size_t i = 0; i < n; ++i) p.marker(xs[i], ys[i], kBlack, n > 64 ? 2 : 3.5, Mark::kDot, true);
      legend.push_back({"allocated bits (right axis)", kBlack, Mark::kLine});
    }
    p.legend(legend, Corner::kTopRight);
  });
  return outputs(stem);
}

std::vector<std::string> plot_cobra_heads(const AllocFile& a, const std::vector<double>& k_before,
                                          const std::vector<double>& v_before, const std::string& stem) {
  std::vector<Side> sides;
  for (Side s : {Side::kK, Side::kV})
    for (const auto& h : a.heads)
      if (h.side == s && uses(h, kFieldRank)) {
        sides.push_back(s);
        break;
      }
  if (sides.empty()) throw Error("", "heads", "no low-rank (COBRA) heads: the (rank, bits) plot needs a cobra-* method");
  const int W = kCobraSize.width, H = kCobraSize.height;
  const int L = a.calib.n_layers, HK = a.calib.n_kv_heads, d = a.calib.head_dim, n = L * HK;
  const char* joint_key = a.summary.is_object() && a.summary.contains("joint") ? "joint" : nullptr;
  render(stem, W, H, [&](cairo_t* cr) {
    text(cr, W / 2.0, 10, "KV-COBRA heads: " + model_line(a.calib), 16, 0.5, 0, true);
    const double top = 36, rowh = (H - top) / double(sides.size());
    for (size_t row = 0; row < sides.size(); ++row) {
      const Side side = sides[row];
      const Color col = side_color(side);
      const double y0 = top + double(row) * rowh;
      // Left: (rank, bits) of every head.
      std::map<std::pair<int, int>, int> count;
      int bmax = 1;
      for (const auto& h : a.heads)
        if (h.side == side && uses(h, kFieldRank)) {
          ++count[{h.rank, h.bits}];
          bmax = std::max(bmax, h.bits);
        }
      Panel ps(cr, 0, y0, W * 0.40, rowh - 4, 20);
      ps.x_axis({0, d + 3.0, false, "rank r (kept eigen-directions)", {}, true});
      ps.y_axis({0, bmax + 1.5, false, "bits b per kept coordinate", {}, true});
      ps.frame(std::string(side_name(side)) + ": (rank, bits) per head", bpd_line(a, side));
      const double bpd = side == Side::kK ? a.k_bpd_nominal : a.v_bpd_nominal;
      const double bbar = d * bpd;
      std::vector<double> cx, cy;
      for (double r = std::max(0.5, bbar / (bmax + 1.5)); r <= d + 3.0; r += 0.05) {
        cx.push_back(r);
        cy.push_back(bbar / r);
      }
      ps.line(cx, cy, kGrey, 1.5, true);
      // Count labels only where they do not collide with the previous label of the same width.
      std::map<int, double> last_label_x;
      std::vector<std::pair<std::pair<int, int>, int>> pts(count.begin(), count.end());
      std::sort(pts.begin(), pts.end(), [](const auto& x, const auto& y) {
        return x.first.second != y.first.second ? x.first.second < y.first.second : x.first.first < y.first.first;
      });
      for (const auto& [rb, k] : pts) {
        const double rad = std::min(14.0, 4.0 + 2.0 * std::sqrt(double(k - 1)));
        ps.marker(rb.first, rb.second, {col.r, col.g, col.b, 0.7}, rad);
        if (k < 2) continue;
        auto it = last_label_x.find(rb.second);
        const double px = ps.X(rb.first);
        if (it != last_label_x.end() && px - it->second < 34) continue;
        ps.label(rb.first, rb.second + 0.28, "×" + std::to_string(k), 10, 0.5, 1);
        last_label_x[rb.second] = px;
      }
      ps.legend({{"heads (area ∝ count)", col, Mark::kDot}, {"r·b = d·bpd = " + fmt(bbar), kGrey, Mark::kDashed}},
                Corner::kTopRight);

      // Right: per-head distortion before / after C2.
      const std::vector<double>& before = side == Side::kK ? k_before : v_before;
      const std::vector<double> after = cobra_distortion_after(a, side);
      std::vector<double> all = after;
      all.insert(all.end(), before.begin(), before.end());
      Panel pd(cr, W * 0.40, y0, W * 0.60, rowh - 4, 24);
      std::vector<std::pair<double, std::string>> lt;
      const int lstep = std::max(1, (L + 15) / 16);
      for (int l = 0; l < L; l += lstep) lt.push_back({double(l * HK), "L" + std::to_string(l)});
      pd.x_axis({-0.7, n - 0.3, false, "KV head, layer-major (tick = first head of the layer)", lt});
      pd.y_axis(log_axis(all, "predicted distortion D*_h  (log)", 0.25));
      const char* key = joint_key ? joint_key : side == Side::kK ? "k" : "v";
      std::string sub;
      if (a.summary.is_object() && a.summary.contains(key) && a.summary[key].contains("distortion_std_before"))
        sub = "std across heads (solver): " + fmt(a.summary[key]["distortion_std_before"].get<double>()) +
              " before → " + fmt(a.summary[key]["distortion_std_after"].get<double>()) + " after C2";
      if (before.empty())
        sub += (sub.empty() ? "" : "; ") +
               std::string(side_method(a, side) == Method::kCobraMeasured
                               ? "before C2 per head: measured, not recomputed"
                               : "before C2 per head: needs --calib");
      pd.frame(std::string(side_name(side)) + ": per-head distortion before / after C2", sub);
      for (int l = 1; l < L; ++l) pd.vline(l * HK - 0.5, kGrid, 1, false);
      std::vector<double> xs(static_cast<size_t>(n));
      for (int i = 0; i < n; ++i) xs[size_t(i)] = i;
      const double rad = n > 128 ? 2 : n > 48 ? 3 : 4.5;
      if (!before.empty()) {
        pd.line(xs, before, kGrey, 1, false);
        for (int i = 0; i < n; ++i) pd.marker(i, before[size_t(i)], kGrey, rad, Mark::kHollowDot);
      }
      pd.line(xs, after, col, 1.2, false);
      for (int i = 0; i < n; ++i) pd.marker(i, after[size_t(i)], col, rad, Mark::kDot);
      std::vector<LegendEntry> lg;
      if (!before.empty()) lg.push_back({"before C2 (even split, std " + fmt(population_std(before), 3) + ")", kGrey, Mark::kHollowDot});
      lg.push_back({"after C2 (std " + fmt(population_std(after), 3) + ")", col, Mark::kDot});
      pd.legend(lg, Corner::kTopRight);
    }
  });
  return outputs(stem);
}

std::vector<std::string> plot_eigen(const CalibFile& c, const AllocFile* a, int layer, int kv_head,
                                    const std::string& stem) {
  check_head(c, layer, kv_head);
  const auto sh = c.shape();
  if (c.moments.k.count_of(sh, layer, kv_head) == 0)
    throw Error("", h5path::kStatsCountK, "no samples for layer " + std::to_string(layer) + " head " + std::to_string(kv_head));
  const bool centered = !(a && a->params.is_object() && a->params.value("basis", std::string("centered")) == "uncentered");
  Spectra s = eigen_spectra(c, layer, kv_head, centered);
  double mx = 0;
  for (double v : s.k) mx = std::max(mx, v);
  for (double v : s.v) mx = std::max(mx, v);
  const double floor = std::max(mx, 1e-30) * 1e-9;  // exact zeros would sit at -inf on the log axis
  for (auto* sp : {&s.k, &s.v})
    for (double& v : *sp) v = std::max(v, floor);
  const int d = sh.head_dim;
  const int W = kEigenSize.width, H = kEigenSize.height;
  render(stem, W, H, [&](cairo_t* cr) {
    Panel p(cr, 0, 8, W, H - 8, 24);
    p.x_axis({0.3, d + 0.7, false, "eigenvalue index i (descending)", {}, true});
    std::vector<double> all = s.k;
    all.insert(all.end(), s.v.begin(), s.v.end());
    p.y_axis(log_axis(all, "eigenvalue λ_i  (log scale)"));
    p.frame("Eigenvalue spectra of K and V: layer " + std::to_string(layer) + ", KV head " + std::to_string(kv_head),
            std::string(centered ? "covariance E[(x-μ)(x-μ)ᵀ]" : "second moment E[xxᵀ]") + " of pre-RoPE K and of V, " +
                std::to_string(c.moments.k.count_of(sh, layer, kv_head)) + " tokens; " + model_line(c.prov));
    std::vector<double> xs;
    for (int i = 1; i <= d; ++i) xs.push_back(i);
    std::vector<LegendEntry> lg, kept;
    for (Side side : {Side::kK, Side::kV}) {
      const auto& ev = side == Side::kK ? s.k : s.v;
      const Color col = side_color(side);
      p.line(xs, ev, col, 2);
      if (d <= 128)
        for (int i = 0; i < d; ++i) p.marker(xs[size_t(i)], ev[size_t(i)], col, d > 64 ? 2 : 3, side == Side::kK ? Mark::kDot : Mark::kSquare);
      std::string entry = std::string(side_name(side)) + " (trace " + fmt([&] {
                            double t = 0;
                            for (double v : ev) t += v;
                            return t;
                          }()) + ")";
      lg.push_back({entry, col, side == Side::kK ? Mark::kDot : Mark::kSquare});
      if (a) {
        const HeadDecision* h = find_head(*a, side, layer, kv_head);
        if (h && uses(*h, kFieldRank)) {
          p.vline(h->rank + 0.5, col, 1.8, true);
          const bool kl = side == Side::kK && side_method(*a, side) == Method::kCobraKl;
          kept.push_back({std::string(side_name(side)) + " kept: rank " + std::to_string(h->rank) + " × " +
                              std::to_string(h->bits) + " b" + (kl ? " (directions in KL order)" : ""),
                          col, Mark::kDashed});
        }
      }
    }
    lg.insert(lg.end(), kept.begin(), kept.end());
    p.legend(lg, Corner::kBottomLeft);
  });
  return outputs(stem);
}

std::vector<std::string> plot_compare(const AllocFile& a, const std::string& label_a, const AllocFile& b,
                                      const std::string& label_b, const Comparison& cmp, const std::string& stem) {
  std::vector<Side> sides;
  for (Side s : {Side::kK, Side::kV})
    for (const auto& m : cmp.layers)
      if (m.side == s) {
        sides.push_back(s);
        break;
      }
  const int W = kCompareSize.width, H = kCompareSize.height, L = a.calib.n_layers;
  const Color cg{0.40, 0.74, 0.39, 1}, cl{0.84, 0.19, 0.15, 1};
  render(stem, W, H, [&](cairo_t* cr) {
    text(cr, W / 2.0, 8, "Bits moved per layer, B against A: " + model_line(a.calib), 16, 0.5, 0, true);
    text(cr, W / 2.0, 30, "A = " + label_a + "     B = " + label_b, 12, 0.5, 0, false, 0, kDarkGrey);
    const double top = 48, rowh = (H - top) / double(std::max<size_t>(1, sides.size()));
    for (size_t row = 0; row < sides.size(); ++row) {
      const Side side = sides[row];
      double mx = 1;
      int64_t ta = 0, tb = 0;
      bool per_dim = true;
      for (const auto& m : cmp.layers)
        if (m.side == side) {
          mx = std::max(mx, double(std::max(m.gained, m.lost)));
          ta += m.bits_a, tb += m.bits_b;
          per_dim &= m.per_dim;
        }
      Panel p(cr, 0, top + double(row) * rowh, W, rowh - 4, 24);
      p.x_axis({-0.6, L - 0.4, false, "layer", index_ticks(L)});
      p.y_axis({-mx * 1.25, mx * 1.6, false, std::string(side_name(side)) + " bits per token, B − A (all KV heads)", {}});
      p.frame(std::string(side_name(side)) + ": A " + bpd_line(a, side) + "  |  B " + bpd_line(b, side),
              "code bits per token: A " + std::to_string(ta) + ", B " + std::to_string(tb) + "; moves counted " +
                  (per_dim ? "per coordinate" : "per head (a low-rank basis is not the head's coordinates)"));
      p.hline(0, kBlack, 1, false);
      std::vector<double> xs, net;
      for (const auto& m : cmp.layers) {
        if (m.side != side) continue;
        if (m.gained) p.bar(m.layer - 0.35, m.layer + 0.35, 0, double(m.gained), cg);
        if (m.lost) p.bar(m.layer - 0.35, m.layer + 0.35, -double(m.lost), 0, cl);
        xs.push_back(m.layer);
        net.push_back(double(m.bits_b - m.bits_a));
        if (L <= 32) {
          p.label(m.layer, double(m.gained) + mx * 0.03, "+" + std::to_string(m.gained), L > 16 ? 8 : 10, 0.5, 1);
          p.label(m.layer, -double(m.lost) - mx * 0.03, "−" + std::to_string(m.lost), L > 16 ? 8 : 10, 0.5, 0);
        }
      }
      for (size_t i = 0; i < xs.size(); ++i) p.marker(xs[i], net[i], kBlack, 4.5, Mark::kSquare);
      p.legend({{"B has more bits (gained)", cg, Mark::kBox},
                {"B has fewer bits (lost)", cl, Mark::kBox},
                {"net change", kBlack, Mark::kSquare}},
               Corner::kTopRight);
    }
  });
  return outputs(stem);
}

std::vector<std::string> plot_probe(const ProbeFile& pf, const std::string& stem) {
  const int L = pf.n_layers;
  const int W = kProbeSize.width, H = kProbeSize.height;
  // One colour per candidate: the two of the sides' figures, then greys and black.
  const Color colors[] = {kBlue, kOrange, kDarkGrey, Color{0.15, 0.55, 0.25, 1}, Color{0.60, 0.20, 0.55, 1}, kGrey, kBlack};
  std::vector<double> all;
  for (const auto& s : pf.settings)
    for (double v : s.kl) all.push_back(std::max(v, 1e-12));
  render(stem, W, H, [&](cairo_t* cr) {
    Panel p(cr, 0, 8, W, H - 8, 24);
    p.x_axis({-0.5, L - 0.5, false, "layer (only this layer's K and V coded)", index_ticks(L), false});
    p.y_axis(log_axis(all, "mean next-token KL vs the unquantized forward (nats, log scale)", 0.25));
    std::string sub = std::to_string(pf.windows) + " calibration windows × " + std::to_string(pf.seq_len) + " tokens; " +
                      base_name(pf.model_path);
    if (pf.has_composite) {
      double sum = 0;
      for (double v : pf.settings.at(0).kl) sum += v;
      sub += "; every layer at once: KL " + fmt(pf.composite_kl) + " (the layers' sum " + fmt(sum) + ")";
    }
    p.frame("End-to-end probe (" + pf.candidates + "): what coding each layer costs the output", sub);
    std::vector<double> xs;
    for (int l = 0; l < L; ++l) xs.push_back(l);
    std::vector<LegendEntry> lg;
    for (size_t i = 0; i < pf.settings.size(); ++i) {
      const Color col = colors[i % (sizeof(colors) / sizeof(colors[0]))];
      std::vector<double> ys;
      for (double v : pf.settings[i].kl) ys.push_back(std::max(v, 1e-12));
      p.line(xs, ys, col, 2);
      for (int l = 0; l < L; ++l) p.marker(xs[size_t(l)], ys[size_t(l)], col, 3, Mark::kDot);
      lg.push_back({pf.settings[i].name, col, Mark::kDot});
    }
    p.legend(lg, Corner::kTopRight);
  });
  return outputs(stem);
}

}  // namespace kvq::report
