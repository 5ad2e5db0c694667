#include "kvq/report/summary.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <optional>
#include <sstream>

#include "kvq/alloc/cobra.hpp"
#include "kvq/format/decision_layout.hpp"
#include "kvq/io/kvq_file.hpp"
#include "kvq/stats/derived.hpp"
#include "kvq/util/error.hpp"

namespace kvq::report {

FileKind detect_kind(const std::string& path) { return read_kvq_header(path).kind; }

// ---- allocation ----

std::vector<int> block_widths(const HeadDecision& h, const CalibProvenance& p) {
  if (!uses(h, kFieldGroups)) return {};
  const auto w = dim_widths(h, p.head_dim);
  std::vector<int> out;
  for (int i = 0; i < p.head_dim / 2; ++i) {
    int a = 0, b = 0;
    rope_block_coords(p.pairing, p.head_dim, p.rotary_dim, i, &a, &b);
    out.push_back(std::max(w[size_t(a)], w[size_t(b)]));
  }
  return out;
}

double head_effective_bpd(const HeadDecision& h, int d) {
  try {
    return layout::effective_bpd(h, d);
  } catch (const Error&) {
    return std::numeric_limits<double>::quiet_NaN();
  }
}

double Fingerprint::share(int layer, int width) const {
  const auto& row = dims[size_t(layer)];
  const int64_t n = std::accumulate(row.begin(), row.end(), int64_t(0));
  return n ? double(row[size_t(width)]) / double(n) : 0.0;
}

double Fingerprint::mean_bits(int layer) const {
  const auto& row = dims[size_t(layer)];
  int64_t n = 0, bits = 0;
  for (size_t w = 0; w < row.size(); ++w) {
    n += row[w];
    bits += int64_t(w) * row[w];
  }
  return n ? double(bits) / double(n) : 0.0;
}

Fingerprint fingerprint(const AllocFile& a, Side side) {
  Fingerprint f;
  f.side = side;
  const int d = a.calib.head_dim;
  for (const auto& h : a.heads)
    if (h.side == side)
      for (int w : dim_widths(h, d)) f.max_width = std::max(f.max_width, w);
  f.dims.assign(size_t(a.calib.n_layers), std::vector<int64_t>(size_t(f.max_width) + 1, 0));
  for (const auto& h : a.heads) {
    if (h.side != side || h.layer < 0 || h.layer >= a.calib.n_layers) continue;
    for (int w : dim_widths(h, d)) ++f.dims[size_t(h.layer)][size_t(std::max(w, 0))];
  }
  return f;
}

std::optional<Method> side_method(const AllocFile& a, Side side) {
  try {
    return method_from_string(side == Side::kK ? a.method : a.v_method);
  } catch (const Error&) {
    return std::nullopt;  // a name this kvq does not know: shown as recorded, no COBRA figures
  }
}

bool has_side(const AllocFile& a, Side side) {
  return std::any_of(a.heads.begin(), a.heads.end(), [&](const HeadDecision& h) { return h.side == side; });
}

namespace {

bool joint(const AllocFile& a) {
  return a.params.is_object() && a.params.contains("joint_kv") && a.params["joint_kv"].is_boolean() &&
         a.params["joint_kv"].get<bool>();
}

// The solver's C1 model as recorded: the side summary's params (text values, as the solver wrote
// them), else the allocation's CLI parameters.
alloc::CobraModel recorded_model(const AllocFile& a, Side side) {
  alloc::CobraModel m;
  const auto& p = a.params;
  auto num = [&](const char* key, double dflt) {
    return p.is_object() && p.contains(key) && p[key].is_number() ? p[key].get<double>() : dflt;
  };
  m.c = num("q_constant", m.c);
  m.r_min = int(num("r_min", m.r_min));
  m.b_min = int(num("cobra_b_min", m.b_min));
  m.b_max = int(num("cobra_b_max", m.b_max));
  if (p.is_object() && p.contains("c1_rounding") && p["c1_rounding"].is_string())
    m.rounding = alloc::c1_rounding_from_string(p["c1_rounding"].get<std::string>());
  const char* key = joint(a) ? "joint" : side == Side::kK ? "k" : "v";
  if (a.summary.is_object() && a.summary.contains(key) && a.summary[key].contains("params")) {
    const auto& s = a.summary[key]["params"];
    auto get = [&](const char* k, auto set) {
      if (s.contains(k) && s[k].is_string()) set(s[k].template get<std::string>());
    };
    get("c", [&](const std::string& v) { m.c = std::stod(v); });
    get("r_min", [&](const std::string& v) { m.r_min = std::stoi(v); });
    get("r_step", [&](const std::string& v) { m.r_step = std::stoi(v); });
    get("b_min", [&](const std::string& v) { m.b_min = std::stoi(v); });
    get("b_max", [&](const std::string& v) { m.b_max = std::stoi(v); });
    get("c1_rounding", [&](const std::string& v) { m.rounding = alloc::c1_rounding_from_string(v); });
  }
  return m;
}

// The spectra the solver saw for one side: eigenvalues of the covariance (or second moment), or
// for cobra-kl keys the KL weights in their sorted order.
std::vector<std::vector<double>> solver_spectra(const AllocFile& a, const CalibFile& c, Side side, bool kl) {
  const auto sh = c.shape();
  const bool centered = !(a.params.is_object() && a.params.value("basis", std::string("centered")) == "uncentered");
  const SideMoments& s = side == Side::kK ? c.moments.k : c.moments.v;
  std::vector<std::vector<double>> out;
  for (int l = 0; l < sh.n_layers; ++l)
    for (int h = 0; h < sh.n_kv_heads; ++h) {
      auto e = eigen_decompose(second_moment(s, sh, l, h, centered));
      std::vector<double> lam(e.values.data(), e.values.data() + e.values.size());
      if (kl) {
        // kvq-allocate measures the query variance with the centered query covariance.
        Eigen::VectorXd qv = query_variance_in_basis(c.moments, l, h, e.vectors, true);
        lam = alloc::kl_reorder(alloc::checked_spectrum(lam, sh.head_dim, "eigenvalues"),
                                std::vector<double>(qv.data(), qv.data() + qv.size()))
                  .weights;
      }
      out.push_back(alloc::checked_spectrum(lam, sh.head_dim, "eigenvalues"));
    }
  return out;
}

}  // namespace

std::vector<double> cobra_distortion_before(const AllocFile& a, const CalibFile& c, Side side) {
  const std::optional<Method> method = side_method(a, side);
  if (!method || !is_cobra(*method) || *method == Method::kCobraMeasured || !has_side(a, side)) return {};
  const auto sh = c.shape();
  const int n = sh.n_layers * sh.n_kv_heads;
  const alloc::CobraModel m = recorded_model(a, side);
  if (joint(a)) {
    auto spectra = solver_spectra(a, c, Side::kK, false);
    auto v = solver_spectra(a, c, Side::kV, false);
    spectra.insert(spectra.end(), v.begin(), v.end());
    auto r = alloc::cobra_c2_none(spectra, alloc::cobra_total_budget(2 * n, sh.head_dim, a.k_bpd_nominal), m);
    auto first = r.uniform_distortion.begin() + (side == Side::kK ? 0 : n);
    return std::vector<double>(first, first + n);
  }
  const double bpd = side == Side::kK ? a.k_bpd_nominal : a.v_bpd_nominal;
  auto spectra = solver_spectra(a, c, side, side == Side::kK && *method == Method::kCobraKl);
  return alloc::cobra_c2_none(spectra, alloc::cobra_total_budget(n, sh.head_dim, bpd), m).uniform_distortion;
}

std::vector<double> distortion_before_c2(const AllocFile& a, const CalibFile* c, Side side) {
  const size_t n = size_t(a.calib.n_layers) * size_t(a.calib.n_kv_heads);
  if (a.distortion_before(side).size() == n) return a.distortion_before(side);
  return c ? cobra_distortion_before(a, *c, side) : std::vector<double>{};
}

std::vector<double> cobra_distortion_after(const AllocFile& a, Side side) {
  const int H = a.calib.n_kv_heads;
  std::vector<double> out(size_t(a.calib.n_layers) * size_t(H), std::numeric_limits<double>::quiet_NaN());
  for (const auto& h : a.heads)
    if (h.side == side && h.layer < a.calib.n_layers && h.kv_head < H)
      out[size_t(h.layer * H + h.kv_head)] = h.predicted_distortion;
  return out;
}

// ---- calibration ----

std::vector<HeadEnergy> head_energies(const CalibFile& c) {
  const auto sh = c.shape();
  RopeGeometry g{c.prov.pairing, sh.head_dim, c.prov.rotary_dim};
  std::vector<HeadEnergy> out;
  for (int l = 0; l < sh.n_layers; ++l)
    for (int h = 0; h < sh.n_kv_heads; ++h) {
      HeadEnergy e;
      e.layer = l;
      e.kv_head = h;
      e.tokens_k = c.moments.k.count_of(sh, l, h);
      e.tokens_q = c.moments.q.count_of(sh, l, h);
      if (e.tokens_k > 0) {
        const double* gk = c.moments.k.gram_of(sh, l, h);
        const double* gv = c.moments.v.gram_of(sh, l, h);
        for (int i = 0; i < sh.head_dim; ++i) e.trace_k += gk[size_t(i) * size_t(sh.head_dim) + size_t(i)];
        for (int i = 0; i < sh.v_dim(); ++i) e.trace_v += gv[size_t(i) * size_t(sh.v_dim()) + size_t(i)];  // MLA: V's own dim
        e.trace_k /= double(e.tokens_k);
        e.trace_v /= double(c.moments.v.count_of(sh, l, h));
      }
      if (e.tokens_k > 0 && e.tokens_q > 0) e.energy = block_energies(c.moments, g, l, h);
      if (!e.energy.empty()) {
        std::vector<double> s = e.energy;
        std::sort(s.begin(), s.end());
        const size_t n = s.size();
        e.median = n % 2 ? s[n / 2] : 0.5 * (s[n / 2 - 1] + s[n / 2]);
        const double mx = s.back(), mn = std::max(s.front(), 1e-30);
        e.max_over_median = e.median > 0 ? mx / e.median : std::numeric_limits<double>::infinity();
        e.max_over_min = mx / mn;
        e.top_block = int(std::max_element(e.energy.begin(), e.energy.end()) - e.energy.begin());
        const size_t q = (n + 3) / 4;
        const double total = std::accumulate(s.begin(), s.end(), 0.0);
        const double top = std::accumulate(s.end() - std::ptrdiff_t(q), s.end(), 0.0);
        e.top_quarter_share = total > 0 ? top / total : 0.0;
      }
      out.push_back(std::move(e));
    }
  return out;
}

Spectra eigen_spectra(const CalibFile& c, int layer, int kv_head, bool centered) {
  const auto sh = c.shape();
  Spectra s;
  auto k = eigen_decompose(second_moment(c.moments.k, sh, layer, kv_head, centered)).values;
  auto v = eigen_decompose(second_moment(c.moments.v, sh, layer, kv_head, centered)).values;
  s.k.assign(k.data(), k.data() + k.size());
  s.v.assign(v.data(), v.data() + v.size());
  return s;
}

// ---- comparison ----

namespace {

template <class T>
void require_same(const std::string& path_b, const std::string& field, const T& a, const T& b,
                  const std::string& path_a) {
  if (a == b) return;
  std::ostringstream as, bs;
  as << a;
  bs << b;
  throw Error(path_b, field,
              "'" + bs.str() + "' differs from '" + as.str() + "' in " + path_a +
                  ": allocations of different models cannot be compared");
}

}  // namespace

Comparison compare_allocs(const AllocFile& a, const std::string& pa, const AllocFile& b, const std::string& pb) {
  const auto &x = a.calib, &y = b.calib;
  require_same(pb, "calibration.model_config_sha256", x.model_config_sha256, y.model_config_sha256, pa);
  require_same(pb, "calibration.architecture", x.architecture, y.architecture, pa);
  require_same(pb, "calibration.n_layers", x.n_layers, y.n_layers, pa);
  require_same(pb, "calibration.n_heads", x.n_heads, y.n_heads, pa);
  require_same(pb, "calibration.n_kv_heads", x.n_kv_heads, y.n_kv_heads, pa);
  require_same(pb, "calibration.head_dim", x.head_dim, y.head_dim, pa);
  require_same(pb, "calibration.rotary_dim", x.rotary_dim, y.rotary_dim, pa);
  require_same(pb, "calibration.rope_pairing", std::string(to_string(x.pairing)), std::string(to_string(y.pairing)), pa);
  require_same(pb, "calibration.rope_theta", x.rope_theta, y.rope_theta, pa);

  const int L = x.n_layers, H = x.n_kv_heads, d = x.head_dim;
  Comparison out;
  for (Side side : {Side::kK, Side::kV}) {
    if (!has_side(a, side) && !has_side(b, side)) continue;
    std::vector<LayerMove> layers(static_cast<size_t>(L));
    for (int l = 0; l < L; ++l) {
      layers[size_t(l)].side = side;
      layers[size_t(l)].layer = l;
    }
    for (int l = 0; l < L; ++l)
      for (int h = 0; h < H; ++h) {
        const HeadDecision *ha = nullptr, *hb = nullptr;
        for (const auto& e : a.heads)
          if (e.side == side && e.layer == l && e.kv_head == h) ha = &e;
        for (const auto& e : b.heads)
          if (e.side == side && e.layer == l && e.kv_head == h) hb = &e;
        auto& m = layers[size_t(l)];
        const auto wa = ha ? dim_widths(*ha, d) : std::vector<int>(size_t(d), 0);
        const auto wb = hb ? dim_widths(*hb, d) : std::vector<int>(size_t(d), 0);
        const int64_t ca = std::accumulate(wa.begin(), wa.end(), int64_t(0));
        const int64_t cb = std::accumulate(wb.begin(), wb.end(), int64_t(0));
        m.bits_a += ca;
        m.bits_b += cb;
        // Coordinates are comparable only when both code the head's own dimensions (not a basis's).
        const bool same_coords = ha && hb && !uses(*ha, kFieldBasisMean) && !uses(*hb, kFieldBasisMean);
        if (same_coords) {
          for (int i = 0; i < d; ++i) {
            m.gained += std::max(0, wb[size_t(i)] - wa[size_t(i)]);
            m.lost += std::max(0, wa[size_t(i)] - wb[size_t(i)]);
          }
        } else {
          m.per_dim = false;
          m.gained += std::max<int64_t>(0, cb - ca);
          m.lost += std::max<int64_t>(0, ca - cb);
        }
      }
    out.layers.insert(out.layers.end(), layers.begin(), layers.end());
  }
  return out;
}

}  // namespace kvq::report
