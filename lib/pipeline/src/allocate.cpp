#include "kvq/pipeline/allocate.hpp"

#include <spdlog/spdlog.h>

#include <atomic>
#include <cmath>
#include <exception>
#include <mutex>
#include <thread>

#include "kvq/alloc/block_gtq.hpp"
#include "kvq/alloc/cobra.hpp"
#include "kvq/alloc/layer_precision.hpp"
#include "kvq/alloc/uniform.hpp"
#include "kvq/codec/codebook.hpp"
#include "kvq/codec/codec.hpp"
#include "kvq/codec/group_norms.hpp"
#include "kvq/io/h5_paths.hpp"
#include "kvq/pipeline/allocation_methods.hpp"
#include "kvq/stats/derived.hpp"
#include "kvq/util/atomic_file.hpp"
#include "kvq/format/decision_layout.hpp"
#include "kvq/util/error.hpp"
#include "kvq/util/sha256.hpp"
#include "layer_precision.hpp"
#include "reservoir.hpp"

namespace kvq {
namespace {

// derive_seed tag of a head's ratio-codebook fit (TQ widths use 1..8, the Hadamard signs 0).
constexpr uint64_t kRatioSeedTag = 0x726174696fULL;

using nlohmann::json;

alloc::CobraOptions cobra_options(const AllocateOptions& o, Method method) {
  alloc::CobraOptions c;
  c.model.c = o.q_constant;
  c.model.r_min = o.r_min;
  c.model.b_min = o.cobra_b_min;
  c.model.b_max = o.cobra_b_max;
  c.model.rounding = alloc::c1_rounding_from_string(o.c1_rounding);
  const bool damped = method == Method::kCobraMse || method == Method::kCobraKl;
  if (o.c2 != "kvq" && o.c2 != "reference")
    throw Error("", "--c2", "unknown value '" + o.c2 + "' (kvq or reference)");
  if (o.c2 == "reference" && !damped)
    throw Error("", "--c2", "reference is the KV-COBRA reference code's damped C2: it applies to cobra-mse and cobra-kl, not " +
                                std::string(to_string(method)));
  c.c2 = !damped ? alloc::C2Kind::kExact : o.c2 == "reference" ? alloc::C2Kind::kReference : alloc::C2Kind::kDamped;
  c.damped.rounds = o.rounds;
  c.damped.damping = o.damping;
  c.floor.abs = o.floor_abs;
  c.floor.div = o.floor_div;
  c.kl = method == Method::kCobraKl;
  c.seed = o.seed;
  return c;
}

// Eigenbasis, mean and (for KL) query variance of one side for every head.
std::vector<alloc::CobraHeadInput> cobra_inputs(const CalibFile& c, Side side, bool centered, bool kl) {
  const auto sh = c.shape();
  const SideMoments& s = side == Side::kK ? c.moments.k : c.moments.v;
  std::vector<alloc::CobraHeadInput> out;
  for (int l = 0; l < sh.n_layers; ++l)
    for (int h = 0; h < sh.n_kv_heads; ++h) {
      auto e = eigen_decompose(second_moment(s, sh, l, h, centered));
      alloc::CobraHeadInput in;
      in.eigenvalues.assign(e.values.data(), e.values.data() + e.values.size());
      in.eigenvectors = e.vectors;
      // The codec subtracts the mean only for the centered basis; uncentered keeps x as is.
      in.mean = centered ? mean_of(s, sh, l, h) : Eigen::VectorXd::Zero(side_dim(sh, side));
      if (kl) {
        Eigen::VectorXd qv = query_variance_in_basis(c.moments, l, h, e.vectors, true);
        in.query_variance.assign(qv.data(), qv.data() + qv.size());
      }
      out.push_back(std::move(in));
    }
  return out;
}

// D(r, b) measured by coding the reservoir's rows with the real codec at every candidate.
std::vector<alloc::MeasuredTable> measure_tables(const CalibFile& c, Side side,
                                                 const std::vector<alloc::CobraHeadInput>& in,
                                                 const AllocateOptions& o) {
  const auto sh = c.shape();
  const int d = side_dim(sh, side), L = sh.n_layers, H = sh.n_kv_heads;
  const int64_t n = std::min<int64_t>(c.reservoir.size(), o.measure_tokens);
  if (n < 1)
    throw Error(o.calib, h5path::kReservoir, "empty: cobra-measured needs reservoir rows (calib-capture --reservoir-tokens)");
  std::vector<alloc::MeasuredTable> tables;
  for (int l = 0; l < L; ++l)
    for (int h = 0; h < H; ++h) {
      const auto& hi = in[size_t(l * H + h)];
      const std::vector<float> x = reservoir_rows(c, l, h, side, false, n);  // COBRA codes K pre-RoPE
      std::vector<float> y(x.size());
      alloc::MeasuredTable tab;
      tab.b_min = o.cobra_b_min;
      tab.b_max = o.cobra_b_max;
      for (int r = o.r_min; r <= d; r += 2) tab.ranks.push_back(r);
      double total_energy = 0;
      for (int64_t t = 0; t < n; ++t)
        for (int i = 0; i < d; ++i) {
          double z = x[size_t(t) * size_t(d) + size_t(i)] - (hi.mean.size() ? hi.mean[i] : 0.0);
          total_energy += z * z;
        }
      tab.rank0_mse = total_energy / double(n);
      for (int r : tab.ranks)
        for (int b = tab.b_min; b <= tab.b_max; ++b) {
          HeadDecision dec;
          dec.layer = l;
          dec.kv_head = h;
          dec.side = side;
          dec.kind = CodingKind::kLowRankHadamard;
          dec.rank = r;
          dec.bits = b;
          dec.budget_bits = r * b;
          dec.hadamard_seed = alloc::derive_seed(o.seed, l, h, side, 0);
          dec.basis.resize(size_t(d) * size_t(r));
          for (int i = 0; i < d; ++i)
            for (int j = 0; j < r; ++j) dec.basis[size_t(i * r + j)] = float(hi.eigenvectors(i, j));
          dec.mean.resize(size_t(d));
          for (int i = 0; i < d; ++i) dec.mean[size_t(i)] = float(hi.mean.size() ? hi.mean[i] : 0.0);
          codec::HeadCodec hc(dec, d);
          hc.round_trip(x.data(), int(n), y.data());
          double se = 0;
          for (size_t i = 0; i < x.size(); ++i) se += double(x[i] - y[i]) * double(x[i] - y[i]);
          tab.mse.push_back(se / double(n));
        }
      tables.push_back(std::move(tab));
    }
  return tables;
}

alloc::Allocation allocate_side(const CalibFile& c, Side side, Method method, double bpd, const AllocateOptions& o) {
  const auto sh = c.shape();
  // Each side at its own dim: MLA's served cache has a 576-dim K and a 512-dim V.
  alloc::Shape shape{sh.n_layers, sh.n_kv_heads, side_dim(sh, side)};
  if (method == Method::kUniform) {
    alloc::UniformOptions u;
    u.b_max = o.b_max;
    u.seed = o.seed;
    return alloc::allocate_uniform(shape, side, bpd, u);
  }
  if (method == Method::kBlockGtq) {
    alloc::BlockGtqInput in;
    in.shape = shape;
    in.rotary_dim = c.prov.rotary_dim;
    in.pairing = c.prov.pairing;
    RopeGeometry g{c.prov.pairing, sh.head_dim, c.prov.rotary_dim};
    for (int l = 0; l < sh.n_layers; ++l)
      for (int h = 0; h < sh.n_kv_heads; ++h) in.energies.push_back(block_energies(c.moments, g, l, h));
    alloc::BlockGtqOptions bo;
    bo.greedy.b_min = o.b_min;
    bo.greedy.b_max = o.b_max;
    bo.seed = o.seed;
    if (o.exact_distortion && o.codebook == TqCodebook::kSphere)
      bo.group_distortion = [](int b, int m) { return codec::group_codebook_mse(TqCodebook::kSphere, b, m); };
    else if (o.exact_distortion)
      for (int b = 0; b <= o.b_max; ++b)  // table indexed by width; b = 0 stores nothing: MSE 1
        bo.greedy.distortion_table.push_back(b == 0 ? 1.0 : codec::lloyd_max_gaussian(b).mse);
    return alloc::allocate_block_gtq(in, bpd, bo);
  }
  const bool centered = !o.uncentered;
  auto opts = cobra_options(o, method);
  auto inputs = cobra_inputs(c, side, centered, method == Method::kCobraKl);
  if (method == Method::kCobraMeasured)
    return alloc::allocate_cobra_measured(shape, side, measure_tables(c, side, inputs, o), inputs, bpd, opts);
  return alloc::allocate_cobra(shape, side, inputs, bpd, opts);
}

double side_effective_bpd(const std::vector<HeadDecision>& heads, Side side, int d) {
  return alloc::mean_effective_bpd(heads, side, d);
}

json summary_json(const alloc::AllocSummary& s) {
  json j = {{"method", to_string(s.method)},
            {"nominal_bpd", s.nominal_bpd},
            {"code_bits_per_dim", s.code_bits_per_dim},
            {"budget_total", s.budget_total},
            {"budget_assigned", s.budget_assigned},
            {"code_bits_used", s.code_bits_used},
            {"distortion_std_before", s.distortion_std_before},
            {"distortion_std_after", s.distortion_std_after},
            {"heads_over_budget", s.heads_over_budget},
            {"bits_over_budget", s.bits_over_budget}};
  if (s.has_prediction) j["predicted_distortion"] = s.predicted_distortion;
  json p = json::object();
  for (const auto& [k, v] : s.params) p[k] = v;
  j["params"] = p;
  return j;
}

}  // namespace

AllocFile run_allocate(const AllocateOptions& o) {
  if (o.out.empty()) throw Error("", "--out", "an output path is required");
  check_allocation_method("--method", o.method, Side::kK);
  check_allocation_method("--v-method", o.v_method, Side::kV);
  if (o.rotate_below < 0 || o.rotate_below > 9)
    throw Error("", "--rotate-below", "must be in 0..9 (bits; 0: rotate every group), got " + std::to_string(o.rotate_below));
  if (!(o.bpd > 0) || !std::isfinite(o.bpd)) throw Error("", "--bpd", "must be > 0, got " + std::to_string(o.bpd));
  if (o.ratio_bits < 1 || o.ratio_bits > 8)
    throw Error("", "--ratio-bits", "must be in 1..8 (the head norm keeps 16 - k bits), got " + std::to_string(o.ratio_bits));
  if (o.codebook != TqCodebook::kGaussian && o.codebook != TqCodebook::kSphere)
    throw Error("", "--codebook", "unknown value " + std::to_string(static_cast<uint32_t>(o.codebook)));
  if (o.codebook == TqCodebook::kSphere) {
    auto tq = [](Method m) { return m == Method::kUniform || m == Method::kBlockGtq; };
    if (o.joint_kv || (!tq(o.method) && !tq(o.v_method)))
      throw Error("", "--codebook",
                  "exact applies to TQ groups (--method / --v-method uniform or block-gtq); this allocation has none");
  }
  const bool layer_precision = o.method == Method::kLayerPrecision;
  const bool vllm_tq = o.method == Method::kVllmTurboQuant;
  const bool joint_method = layer_precision || vllm_tq;  // one choice per layer for K and V together
  const bool v_joint = o.v_method == Method::kLayerPrecision || o.v_method == Method::kVllmTurboQuant;
  if ((joint_method || v_joint) && o.v_method != o.method) {
    const char* name = joint_method ? to_string(o.method) : to_string(o.v_method);
    throw Error("", joint_method ? "--v-method" : "--method",
                std::string(name) + " chooses K and V of a layer together: give it as both --method and --v-method");
  }
  if (joint_method && o.joint_kv) throw Error("", "--joint-kv", std::string("not with ") + to_string(o.method) + " (it is joint already)");
  if (joint_method && o.v_bpd > 0 && o.v_bpd != o.bpd)
    throw Error("", "--v-bpd", std::string(to_string(o.method)) + " has one budget over K and V (--bpd)");
  if (layer_precision) layer_formats_from_flag("--formats", o.formats);  // before reading the file
  if (vllm_tq) vllm_presets_from_flag("--presets", o.vllm_presets);
  if (joint_method && o.objective != "attention" && o.objective != "mse")
    throw Error("", "--objective", "unknown value '" + o.objective + "' (attention or mse)");
  if (!vllm_tq && o.max_error >= 0) throw Error("", o.max_is_kl ? "--max-kl" : "--max-error", "only with --method vllm-turboquant");
  if (!vllm_tq && !o.probe.empty()) throw Error("", "--probe", "only with --method vllm-turboquant");
  if (o.max_is_kl && o.probe.empty())
    throw Error("", "--max-kl", "needs --probe (kvq-probe's measured KL; without it bound the reservoir error: --max-error)");
  if (!o.max_is_kl && o.max_error >= 0 && !o.probe.empty())
    throw Error("", "--max-error", "with --probe the figure is the measured KL: give the bound as --max-kl");
  if (vllm_tq && !(o.max_error < 0 || std::isfinite(o.max_error)))
    throw Error("", "--max-error", "must be finite and >= 0, got " + std::to_string(o.max_error));
  if (!joint_method && o.bpd > o.b_max) throw Error("", "--bpd", std::to_string(o.bpd) + " is above b_max " + std::to_string(o.b_max));
  if (o.joint_kv && o.method != Method::kCobraMse && o.method != Method::kCobraDp)
    throw Error("", "--joint-kv", "needs --method cobra-mse or cobra-dp (the exact solver splits the budget)");
  double v_bpd = o.v_bpd > 0 ? o.v_bpd : (o.v_method == Method::kUniform ? std::ceil(o.bpd) : o.bpd);
  if (!joint_method && v_bpd > o.b_max) throw Error("", "--v-bpd", std::to_string(v_bpd) + " is above b_max " + std::to_string(o.b_max));

  const bool needs_samples = o.method == Method::kCobraMeasured || o.v_method == Method::kCobraMeasured ||
                             layer_precision || (vllm_tq && o.probe.empty()) ||
                             o.norm_correction == NormCorrectionMode::kAuto ||
                             o.group_norms == AllocateOptions::GroupNorms::kCompact;
  CalibFile c = read_calib(o.calib, needs_samples);
  if (!c.complete())
    throw Error(o.calib, h5path::kWindowsDone,
                std::to_string(c.windows_done) + " of " + std::to_string(c.calib_offsets.size()) +
                    " windows: an interrupted capture (finish it with calib-capture --resume)");
  const auto sh = c.shape();
  if (o.joint_kv && sh.v_dim() != sh.head_dim)
    throw Error(o.calib, "provenance.head_dim_v",
                std::to_string(sh.v_dim()) + " differs from head_dim " + std::to_string(sh.head_dim) +
                    ": --joint-kv solves K and V of one dim (allocate them separately)");
  for (int l = 0; l < sh.n_layers; ++l)
    for (int h = 0; h < sh.n_kv_heads; ++h)
      if (c.moments.k.count_of(sh, l, h) == 0 || c.moments.q.count_of(sh, l, h) == 0)
        throw Error(o.calib, h5path::kStatsCountK, "no samples for layer " + std::to_string(l) + " head " + std::to_string(h));

  AllocFile a;
  a.method = to_string(o.method);  // the file records names (frozen strings)
  a.v_method = to_string(o.joint_kv ? o.method : o.v_method);
  a.k_bpd_nominal = o.bpd;
  a.v_bpd_nominal = o.joint_kv ? o.bpd : v_bpd;
  a.calib_path = o.calib;
  a.calib_sha256 = sha256_file(o.calib);
  a.calib_digest = calib_content_digest(c);
  a.calib = c.prov;
  a.params = {{"seed", o.seed},
              {"b_min", o.b_min},
              {"b_max", o.b_max},
              {"exact_distortion", o.exact_distortion},
              {"norm_correction", o.norm_correction == NormCorrectionMode::kAuto
                                      ? json("auto")
                                      : json(o.norm_correction == NormCorrectionMode::kOn)},
              {"rotate_below", o.rotate_below},
              {"rounds", o.rounds},
              {"damping", o.damping},
              {"floor_abs", o.floor_abs},
              {"floor_div", o.floor_div},
              {"c1_rounding", o.c1_rounding},
              {"c2", o.c2},
              {"basis", o.uncentered ? "uncentered" : "centered"},
              {"q_constant", o.q_constant},
              {"cobra_b_min", o.cobra_b_min},
              {"cobra_b_max", o.cobra_b_max},
              {"r_min", o.r_min},
              {"measure_tokens", o.measure_tokens},
              {"joint_kv", o.joint_kv}};
  if (layer_precision) {
    a.params["formats"] = o.formats;
    a.params["objective"] = o.objective;
  }
  if (vllm_tq) {
    a.params["presets"] = o.vllm_presets;
    a.params["objective"] = o.probe.empty() ? o.objective : "kl";
    if (!o.probe.empty()) a.params["probe"] = o.probe;
    if (o.max_error >= 0) a.params[o.max_is_kl ? "max_kl" : "max_error"] = o.max_error;
  }
  if (o.codebook == TqCodebook::kSphere) a.params["codebook"] = "exact";  // absent = gaussian (bytes unchanged)
  const bool compact = o.group_norms == AllocateOptions::GroupNorms::kCompact;
  if (compact) {  // absent = fp16 (bytes unchanged)
    a.params["group_norms"] = "compact";
    a.params["ratio_bits"] = o.ratio_bits;
  }

  if (o.joint_kv) {
    alloc::Shape shape{sh.n_layers, sh.n_kv_heads, sh.head_dim, sh.v_dim()};
    auto opts = cobra_options(o, o.method);
    opts.c2 = alloc::C2Kind::kExact;
    auto alloc = alloc::allocate_cobra_joint(shape, cobra_inputs(c, Side::kK, !o.uncentered, false),
                                             cobra_inputs(c, Side::kV, !o.uncentered, false), o.bpd, opts);
    a.heads = alloc.heads;
    a.summary = {{"joint", summary_json(alloc.summary)}};
    // The joint solver's before-C2 figures: all K heads, then all V heads.
    const auto& before = alloc.summary.distortion_before;
    if (!before.empty()) {
      KVQ_ASSERT(before.size() % 2 == 0);
      const auto mid = before.begin() + std::ptrdiff_t(before.size() / 2);
      a.k_distortion_before.assign(before.begin(), mid);
      a.v_distortion_before.assign(mid, before.end());
    }
  } else if (joint_method) {
    auto alloc = layer_precision ? allocate_layer_precision(c, o) : allocate_vllm_turboquant(c, o);
    a.heads = alloc.heads;
    a.summary = {{"joint", summary_json(alloc.summary)}};
    if (vllm_tq) a.k_bpd_nominal = a.v_bpd_nominal = alloc.summary.nominal_bpd;
  } else {
    auto k = allocate_side(c, Side::kK, o.method, o.bpd, o);
    auto v = allocate_side(c, Side::kV, o.v_method, v_bpd, o);
    a.heads = k.heads;
    a.heads.insert(a.heads.end(), v.heads.begin(), v.heads.end());
    a.summary = {{"k", summary_json(k.summary)}, {"v", summary_json(v.summary)}};
    a.k_distortion_before = k.summary.distortion_before;
    a.v_distortion_before = v.summary.distortion_before;
  }
  const bool nc_auto = o.norm_correction == NormCorrectionMode::kAuto;
  const bool nc_measured = nc_auto && c.reservoir.size() > 0;
  if (nc_auto && !nc_measured)
    spdlog::warn("{}: no reservoir rows: --norm-correction auto falls back to on for every TQ head", o.calib);
  json nc_table = json::array();
  const bool compact_fit = compact && c.reservoir.size() > 0;
  if (compact && !compact_fit)
    spdlog::warn("{}: no reservoir rows: --group-norms compact keeps one fp16 norm per group", o.calib);
  std::vector<HeadDecision*> to_fit;
  for (auto& h : a.heads) {
    if (h.kind != CodingKind::kTqGroups) continue;
    for (auto& g : h.groups) {
      if (g.bits < o.rotate_below) g.rotation = TqRotation::kIdentity;
      const int m = static_cast<int>(g.dims.size());
      if (o.codebook == TqCodebook::kSphere && m >= 2 && m <= kTqSphereMaxM) g.codebook = TqCodebook::kSphere;
    }
    if (compact_fit && h.groups.size() >= 2) to_fit.push_back(&h);
  }
  // Compact group norms, one head per task (each fit is deterministic: any thread count gives the
  // same file).
  std::vector<codec::CompactNormFit> fits(to_fit.size());
  {
    std::atomic<size_t> next{0};
    std::exception_ptr failed;
    std::mutex failed_mu;
    auto work = [&] {
      for (size_t i; (i = next.fetch_add(1)) < to_fit.size();) {
        try {
          HeadDecision& h = *to_fit[i];
          const int64_t n = std::min<int64_t>(c.reservoir.size(), codec::kCompactFitMaxRows);
          const std::vector<float> rows = reservoir_rows(c, h, n);
          fits[i] = codec::fit_compact_group_norms(h, side_dim(sh, h.side), rows.data(), n, o.ratio_bits,
                                                   alloc::derive_seed(o.seed, h.layer, h.kv_head, h.side, kRatioSeedTag));
        } catch (...) {
          const std::lock_guard<std::mutex> lock(failed_mu);
          if (!failed) failed = std::current_exception();
        }
      }
    };
    const size_t n_threads = std::min<size_t>(
        to_fit.size(), o.threads > 0 ? size_t(o.threads) : std::max(1u, std::thread::hardware_concurrency()));
    std::vector<std::thread> pool;
    for (size_t i = 1; i < n_threads; ++i) pool.emplace_back(work);
    if (!to_fit.empty()) work();
    for (auto& t : pool) t.join();
    if (failed) std::rethrow_exception(failed);
  }
  const int n_compact = static_cast<int>(fits.size());
  double rel_sum = 0, rel_max = 0, rel16_sum = 0;
  for (const auto& fit : fits) {
    rel_sum += fit.rel_rms;
    rel16_sum += fit.rel_rms_fp16;
    rel_max = std::max(rel_max, fit.rel_rms);
  }
  for (auto& h : a.heads) {
    if (h.kind != CodingKind::kTqGroups) continue;
    h.norm_correction = o.norm_correction != NormCorrectionMode::kOff;
    if (nc_measured) {  // after the groups' rotation and codebook: measured as it will be coded
      const NormCorrectionChoice ch = choose_norm_correction(c, h, o.measure_tokens);
      h.norm_correction = ch.on;
      nc_table.push_back({{"layer", h.layer}, {"kv_head", h.kv_head}, {"side", h.side == Side::kK ? "K" : "V"},
                          {"err_off", ch.err[0]}, {"err_on", ch.err[1]}, {"on", ch.on}});
    }
  }
  if (nc_measured) {
    int n_on = 0;
    for (const auto& e : nc_table) n_on += e["on"].get<bool>();
    a.summary["norm_correction_auto"] = {
        {"rows", std::min<int64_t>(c.reservoir.size(), o.measure_tokens)},
        {"queries", std::min<int64_t>(std::min<int64_t>(c.reservoir.size(), o.measure_tokens), kNormCorrectionQueries)},
        {"k_error", "mean |q.k - q.k^| over query heads x reservoir (query, key) pairs, post-RoPE"},
        {"v_error", "mean squared reconstruction error per row"},
        {"heads_on", n_on},
        {"heads", nc_table}};
    spdlog::info("--norm-correction auto: on for {} of {} TQ heads", n_on, nc_table.size());
  }
  if (compact_fit) {
    a.summary["group_norms"] = {
        {"ratio_bits", o.ratio_bits},
        {"heads_compact", n_compact},
        {"rel_rms_mean", n_compact ? rel_sum / n_compact : 0.0},
        {"rel_rms_max", rel_max},
        {"rel_rms_fp16_mean", n_compact ? rel16_sum / n_compact : 0.0},
        {"rel_rms", "sqrt(sum (rho_g - rho~_g)^2 / sum rho^2) over the fitted reservoir rows"}};
    spdlog::info("--group-norms compact: {} TQ heads, norms' relative RMS error {:.2e} mean, {:.2e} max (fp16 per "
                 "group: {:.2e})",
                 n_compact, n_compact ? rel_sum / n_compact : 0.0, rel_max, n_compact ? rel16_sum / n_compact : 0.0);
  }
  a.k_bpd_effective = side_effective_bpd(a.heads, Side::kK, sh.head_dim);
  a.v_bpd_effective = side_effective_bpd(a.heads, Side::kV, sh.v_dim());
  write_alloc(o.out, a);
  if (!o.manifest_json.empty()) write_file_atomically(o.manifest_json, alloc_manifest(a).dump(1) + "\n");
  spdlog::info("{}: K {} at {} bpd (effective {:.4f}), V {} at {} bpd (effective {:.4f})", o.out, a.method,
               a.k_bpd_nominal, a.k_bpd_effective, a.v_method, a.v_bpd_nominal, a.v_bpd_effective);
  return a;
}

}  // namespace kvq
