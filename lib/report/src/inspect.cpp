#include "kvq/report/inspect.hpp"

#include "inspect_detail.hpp"

#include <algorithm>
#include <cmath>
#include <ctime>
#include <filesystem>
#include <map>
#include <optional>

#include "kvq/format/decision_layout.hpp"
#include "kvq/report/plots.hpp"
#include "kvq/report/summary.hpp"
#include "kvq/util/atomic_file.hpp"
#include "kvq/util/error.hpp"

namespace kvq::report {
namespace detail {

using nlohmann::json;
namespace fs = std::filesystem;

std::string base_name(const std::string& p) {
  auto s = p.find_last_of('/');
  return s == std::string::npos ? p : p.substr(s + 1);
}

// "runs/bg2.kvqalloc.h5" -> "bg2": the prefix of the figure files.
std::string file_stem(const std::string& p) {
  std::string b = base_name(p);
  for (const char* ext : {".kvqalloc.h5", ".kvqcal.h5", ".h5", ".kvqprobe.json", ".json"})
    if (b.size() > std::string(ext).size() && b.compare(b.size() - std::string(ext).size(), std::string::npos, ext) == 0)
      return b.substr(0, b.size() - std::string(ext).size());
  return b;
}

std::string short_hash(const std::string& h) { return h.size() > 12 ? h.substr(0, 12) + "…" : h; }

std::string utc(int64_t t) {
  std::time_t tt = std::time_t(t);
  std::tm tm{};
  gmtime_r(&tt, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%d %H:%M:%SZ", &tm);
  return buf;
}

std::string side_str(Side s) { return s == Side::kK ? "K" : "V"; }

std::string join_ints(const std::vector<int>& v) {
  std::string s;
  for (size_t i = 0; i < v.size(); ++i) s += (i ? " " : "") + std::to_string(v[i]);
  return s;
}

std::string model_block(const CalibProvenance& p) {
  std::string s;
  s += "  model        " + (p.model_path.empty() ? std::string("(path not recorded)") : p.model_path) + " (" +
       p.architecture + "), config sha256 " + short_hash(p.model_config_sha256) + "\n";
  s += "  shape        " + std::to_string(p.n_layers) + " layers, " + std::to_string(p.n_heads) + " query heads / " +
       std::to_string(p.n_kv_heads) + " KV heads (group " +
       std::to_string(p.n_kv_heads ? p.n_heads / p.n_kv_heads : 0) + "), head dim " + std::to_string(p.head_dim) +
       ", rotary dim " + std::to_string(p.rotary_dim) + ", " + to_string(p.pairing) + " RoPE pairing, theta " +
       fmt(p.rope_theta, 6) + "\n";
  if (p.rope_type != "default" || p.rope_attention_factor != 1.0)
    s += "  rope         " + p.rope_type + " scaling, attention factor " + fmt(p.rope_attention_factor, 6) +
         (p.rope_inv_freq.empty() ? std::string()
                                  : ", inv_freq " + fmt(p.rope_inv_freq.front(), 6) + " .. " +
                                        fmt(p.rope_inv_freq.back(), 6)) +
         "\n";
  if (p.hybrid()) {
    s += "  hybrid       " + std::to_string(p.n_layers) + " of " + std::to_string(p.n_decoder_layers) +
         " decoder layers keep a KV cache (layer l here is decoder layer";
    for (int l : p.decoder_layers) s += " " + std::to_string(l);
    s += "); the others run Gated DeltaNet: a fixed-size state, nothing to allocate\n";
  }
  if (p.has_local_rope()) {
    s += "  local rope   layers";
    for (int l : p.rope_local_layers) s += " " + std::to_string(l);
    s += " rotate with their own frequencies (Gemma 3's local RoPE), inv_freq " + fmt(p.rope_local_inv_freq.front(), 6) +
         " .. " + fmt(p.rope_local_inv_freq.back(), 6) + "\n";
  }
  if (std::any_of(p.layer_window.begin(), p.layer_window.end(), [](int w) { return w > 0; })) {
    s += "  window       sliding-window attention per layer (0 = full):";
    for (int w : p.layer_window) s += " " + std::to_string(w);
    s += "\n";
  }
  if (p.has_sinks()) {
    double lo = p.attention_sinks[0][0], hi = lo;
    for (const auto& layer : p.attention_sinks)
      for (double x : layer) lo = std::min(lo, x), hi = std::max(hi, x);
    s += "  sinks        one learned logit per query head in every softmax (gpt-oss), " + fmt(lo, 4) + " .. " +
         fmt(hi, 4) + "\n";
  }
  return s;
}

const char* summary_key(const AllocFile& a, Side s) {
  if (a.summary.is_object() && a.summary.contains("joint")) return "joint";
  return s == Side::kK ? "k" : "v";
}

double jnum(const json& j, const char* k) {
  return j.is_object() && j.contains(k) && j[k].is_number() ? j[k].get<double>() : std::nan("");
}

void write_tables(const std::vector<Table>& tables, const std::string& main_path, InspectResult* r) {
  for (const auto& t : tables) {
    const std::string p = csv_path(main_path, t.name);
    write_file_atomically(p, t.to_csv());
    r->written.push_back(p);
  }
}

void write_json(const json& j, const std::string& path, InspectResult* r) {
  write_file_atomically(path, j.dump(1) + "\n");
  r->written.push_back(path);
}

void add_files(InspectResult* r, const std::vector<std::string>& files) {
  r->written.insert(r->written.end(), files.begin(), files.end());
}

// Whether some side's before-C2 distortions are only to be had by recomputing them from the
// calibration: a COBRA model side of a file written before kvq stored them.
bool recomputes_before_c2(const AllocFile& a) {
  for (Side side : {Side::kK, Side::kV}) {
    const std::optional<Method> m = side_method(a, side);
    if (m && is_cobra(*m) && *m != Method::kCobraMeasured && has_side(a, side) && a.distortion_before(side).empty())
      return true;
  }
  return false;
}

json allocation_ref(const AllocFile& a, const std::string& path) {
  return {{"path", path},
          {"method", a.method},
          {"v_method", a.v_method},
          {"calibration_content_digest", a.calib_digest},
          {"budget",
           {{"k_bpd_nominal", a.k_bpd_nominal},
            {"v_bpd_nominal", a.v_bpd_nominal},
            {"k_bpd_effective", a.k_bpd_effective},
            {"v_bpd_effective", a.v_bpd_effective}}}};
}

}  // namespace detail

using namespace detail;

std::string csv_path(const std::string& main_path, const std::string& name) {
  if (name.empty()) return main_path;
  const std::string b = base_name(main_path);
  const auto dot = b.rfind('.');
  const std::string dir = main_path.substr(0, main_path.size() - b.size());
  if (dot == std::string::npos || dot == 0) return main_path + "." + name + ".csv";
  return dir + b.substr(0, dot) + "." + name + b.substr(dot);
}

// ---------------------------------------------------------------- calibration

std::vector<Table> calib_tables(const CalibFile& c) {
  Table heads;
  heads.header = {"layer", "kv_head", "tokens_k", "tokens_q", "E|k|^2", "E|v|^2", "median_s", "max/median", "max/min",
                  "top_block", "top25%_share"};
  Table blocks;
  blocks.name = "blocks";
  blocks.header = {"layer", "kv_head", "block", "energy", "energy_over_median"};
  for (const auto& e : head_energies(c)) {
    heads.add({std::to_string(e.layer), std::to_string(e.kv_head), std::to_string(e.tokens_k),
               std::to_string(e.tokens_q), fmt(e.trace_k), fmt(e.trace_v), fmt(e.median), fmt(e.max_over_median, 3),
               fmt(e.max_over_min, 3), std::to_string(e.top_block), fmt_fixed(e.top_quarter_share, 3)});
    for (size_t i = 0; i < e.energy.size(); ++i)
      blocks.add({std::to_string(e.layer), std::to_string(e.kv_head), std::to_string(i), fmt(e.energy[i], 8),
                  fmt(e.median > 0 ? e.energy[i] / e.median : std::nan(""), 6)});
  }
  return {heads, blocks};
}

std::string calib_summary_text(const CalibFile& c, const std::string& path) {
  const auto& p = c.prov;
  std::string s = std::string(kCalibFormat) + " v" + std::to_string(c.format_version) + "  " + path + "\n";
  s += model_block(p);
  for (const auto& f : p.corpus)
    s += "  corpus       " + f.path + "  " + std::to_string(f.bytes) + " bytes, sha256 " + short_hash(f.sha256) +
         (f.replaced_bytes ? ", " + std::to_string(f.replaced_bytes) + " invalid UTF-8 bytes replaced" : "") + "\n";
  s += "  tokenizer    " + p.tokenizer_path + ", sha256 " + short_hash(p.tokenizer_sha256) + "\n";
  s += "  capture      " + std::to_string(c.windows_done) + " of " + std::to_string(c.calib_offsets.size()) +
       " calibration windows x " + std::to_string(p.seq_len) + " tokens" + (c.complete() ? "" : " (INCOMPLETE: resume it)") +
       ", batch " + std::to_string(p.batch_size) + ", seed " + std::to_string(p.seed) + ", " + p.dtype + " (" + p.forward_precision + " forward), corpus " +
       std::to_string(p.n_tokens_corpus) + " tokens, " + std::to_string(p.n_ranks) + " rank(s)\n";
  s += "  held out     " + std::to_string(c.holdout_offsets.size()) + " windows (never in the statistics)\n";
  s += "  reservoir    " + std::to_string(c.reservoir.size()) + " rows kept of " + std::to_string(c.reservoir.seen) +
       " offered (capacity " + std::to_string(p.reservoir_tokens) + ")\n";
  if (c.moments.has_amax()) {
    auto top = [](const std::vector<float>& a) { return fmt(double(*std::max_element(a.begin(), a.end())), 4); };
    s += "  maxima       |x| per head recorded: post-RoPE K up to " + top(c.moments.k_amax) + ", V up to " +
         top(c.moments.v_amax) + ", post-RoPE Q up to " + top(c.moments.q_amax) + " (kvq-export vllm scales)\n";
  } else {
    s += "  maxima       none (recorded from calibration format 3 on; recapture for kvq-export vllm / layer-precision)\n";
  }
  s += "  written by   " + p.tool_version + ", " + (p.created_unix ? utc(p.created_unix) : std::string("no timestamp")) + "\n";

  const auto en = head_energies(c);
  int64_t kmin = INT64_MAX, kmax = 0, qmin = INT64_MAX, qmax = 0;
  for (const auto& e : en) {
    kmin = std::min(kmin, e.tokens_k), kmax = std::max(kmax, e.tokens_k);
    qmin = std::min(qmin, e.tokens_q), qmax = std::max(qmax, e.tokens_q);
  }
  auto range = [](int64_t a, int64_t b) { return a == b ? std::to_string(a) : std::to_string(a) + ".." + std::to_string(b); };
  if (!en.empty())
    s += "  tokens       K/V " + range(kmin, kmax) + " per (layer, KV head); Q " + range(qmin, qmax) +
         " (every query head of the group counted)\n";

  const int nb = p.head_dim / 2;
  s += "\nBlock-GTQ energy spread per (layer, KV head), " + std::to_string(nb) +
       " RoPE blocks (s_i = 1/2 E|q_(i)|^2 + 1/2 E|k_(i)|^2):\n";
  s += calib_tables(c)[0].to_text();
  // Per layer: how uneven the blocks are, averaged over KV heads (what Block-GTQ can exploit).
  Table layers;
  layers.header = {"layer", "mean max/median", "mean max/min", "mean top25%_share"};
  const int H = p.n_kv_heads;
  for (int l = 0; l < p.n_layers; ++l) {
    double a = 0, b = 0, t = 0;
    for (int h = 0; h < H; ++h) {
      const auto& e = en[size_t(l * H + h)];
      a += e.max_over_median, b += e.max_over_min, t += e.top_quarter_share;
    }
    layers.add({std::to_string(l), fmt(a / H, 3), fmt(b / H, 3), fmt_fixed(t / H, 3)});
  }
  s += "\nper layer (mean over KV heads):\n" + layers.to_text();
  return s;
}

json calib_summary_json(const CalibFile& c, const std::string& path) {
  json heads = json::array();
  for (const auto& e : head_energies(c))
    heads.push_back({{"layer", e.layer},
                     {"kv_head", e.kv_head},
                     {"tokens_k", e.tokens_k},
                     {"tokens_q", e.tokens_q},
                     {"mean_sq_norm_k", e.trace_k},
                     {"mean_sq_norm_v", e.trace_v},
                     {"block_energy", e.energy},
                     {"energy_median", e.median},
                     {"max_over_median", std::isfinite(e.max_over_median) ? json(e.max_over_median) : json(nullptr)},
                     {"max_over_min", std::isfinite(e.max_over_min) ? json(e.max_over_min) : json(nullptr)},
                     {"top_block", e.top_block},
                     {"top_quarter_share", e.top_quarter_share}});
  return {{"kind", "calibration"},
          {"inspect_version", 1},
          {"file", path},
          {"format", kCalibFormat},
          {"version", c.format_version},
          {"content_digest", calib_content_digest(c)},
          {"provenance", json::parse(provenance_to_json(c.prov))},
          {"windows_done", c.windows_done},
          {"windows_planned", int64_t(c.calib_offsets.size())},
          {"holdout_windows", int64_t(c.holdout_offsets.size())},
          {"reservoir_rows", c.reservoir.size()},
          {"heads", heads}};
}

// ---------------------------------------------------------------- allocation

std::vector<Table> alloc_tables(const AllocFile& a, const CalibFile* c) {
  const int d = a.calib.head_dim, H = a.calib.n_kv_heads;
  std::map<Side, std::vector<double>> before;
  for (Side s : {Side::kK, Side::kV}) before[s] = distortion_before_c2(a, c, s);
  Table heads;
  heads.header = {"side", "layer", "kv_head", "kind", "rank", "bits", "budget_bits", "code_bits", "eff_bpd",
                  "pred_D", "pred_D_before_C2", "block_bits"};
  heads.left = {true, false, false, true, false, false, false, false, false, false, false, true};
  for (const auto& h : a.heads) {
    const bool lr = uses(h, kFieldRank);
    std::string bits = "-";
    if (uses(h, kFieldBits)) bits = std::to_string(h.bits);
    if (uses(h, kFieldMinifloat)) bits = to_string(h.minifloat);  // fp8 / nvfp4
    if (uses(h, kFieldGroups) && !h.groups.empty()) {
      int lo = 99, hi = 0;
      for (const auto& g : h.groups) lo = std::min(lo, g.bits), hi = std::max(hi, g.bits);
      bits = lo == hi ? std::to_string(lo) : std::to_string(lo) + "-" + std::to_string(hi);
    }
    // Per-block widths only say something when they differ (Block-GTQ).
    const bool blocks = uses(h, kFieldGroups) && h.groups.size() > 1;
    const auto& b = before[h.side];
    const size_t idx = size_t(h.layer * H + h.kv_head);
    heads.add({side_str(h.side), std::to_string(h.layer), std::to_string(h.kv_head), to_string(h.kind),
               lr ? std::to_string(h.rank) : "-", bits, uses(h, kFieldBudgetBits) ? std::to_string(h.budget_bits) : "-",
               std::to_string(code_bits(h, h.side == Side::kV ? a.calib.v_dim() : d)),  // V at its own dim (MLA)
               fmt_fixed(head_effective_bpd(h, h.side == Side::kV ? a.calib.v_dim() : d), 3),
               h.predicted_distortion != 0 || lr ? fmt(h.predicted_distortion) : "-",
               idx < b.size() ? fmt(b[idx]) : "-", blocks ? join_ints(block_widths(h, a.calib)) : "-"});
  }
  Table fp;
  fp.name = "fingerprint";
  int wmax = 8;
  for (Side s : {Side::kK, Side::kV})
    if (has_side(a, s)) wmax = std::max(wmax, fingerprint(a, s).max_width);
  fp.header = {"side", "layer", "dims"};
  fp.left = {true};
  for (int w = 0; w <= wmax; ++w) fp.header.push_back(std::to_string(w) + "b_%");
  fp.header.push_back("mean_bits");
  for (Side s : {Side::kK, Side::kV}) {
    if (!has_side(a, s)) continue;
    const Fingerprint f = fingerprint(a, s);
    for (int l = 0; l < a.calib.n_layers; ++l) {
      int64_t n = 0;
      for (auto x : f.dims[size_t(l)]) n += x;
      std::vector<std::string> row = {side_str(s), std::to_string(l), std::to_string(n)};
      for (int w = 0; w <= wmax; ++w) row.push_back(w <= f.max_width ? fmt_fixed(100 * f.share(l, w), 1) : "0.0");
      row.push_back(fmt_fixed(f.mean_bits(l), 3));
      fp.add(row);
    }
  }
  return {heads, fp};
}

std::string alloc_summary_text(const AllocFile& a, const std::string& path, const CalibFile* c) {
  std::string s = std::string(kAllocFormat) + " v" + std::to_string(alloc_version_for(a)) + "  " + path + "\n";
  s += model_block(a.calib);
  s += "  calibration  " + a.calib_path + " (sha256 " + short_hash(a.calib_sha256) + ", content " +
       short_hash(a.calib_digest) + "), " + std::to_string(a.calib.samples) + " windows x " +
       std::to_string(a.calib.seq_len) + " tokens, seed " + std::to_string(a.calib.seed) + "\n";
  s += "  methods      K " + a.method + ", V " + a.v_method + "\n";
  s += "  budget       K " + fmt(a.k_bpd_nominal) + " bpd nominal, " + fmt_fixed(a.k_bpd_effective, 4) +
       " effective;  V " + fmt(a.v_bpd_nominal) + " bpd nominal, " + fmt_fixed(a.v_bpd_effective, 4) +
       " effective  (effective = codes + norms + scales per dim)\n";
  if (a.params.is_object()) {
    std::string ps;
    for (const auto& [k, v] : a.params.items()) ps += (ps.empty() ? "" : " ") + k + "=" + (v.is_string() ? v.get<std::string>() : v.dump());
    s += "  params       " + ps + "\n";
  }
  s += detail::vllm_tq_text(a);
  {  // side information of TQ heads with several groups: fp16 per group or the compact record
    int n_multi = 0, n_compact = 0, k = 0;
    for (const auto& h : a.heads) {
      if (!uses(h, kFieldGroups) || h.groups.size() < 2) continue;
      ++n_multi;
      if (h.ratio_bits > 0) ++n_compact, k = h.ratio_bits;
    }
    if (n_multi > 0) {
      s += "  group norms  ";
      if (n_compact == 0) {
        s += "fp16 per group on " + std::to_string(n_multi) + " TQ heads";
      } else {
        s += "compact on " + std::to_string(n_compact) + " of " + std::to_string(n_multi) +
             " multi-group TQ heads: one 16-bit record per token (head norm " + std::to_string(16 - k) +
             " bits + ratio index " + std::to_string(k) + " bits)";
        if (a.summary.is_object() && a.summary.contains("group_norms"))
          s += "; norms' relative RMS error " + fmt(jnum(a.summary["group_norms"], "rel_rms_mean")) + " mean, " +
               fmt(jnum(a.summary["group_norms"], "rel_rms_max")) + " max (fp16: " +
               fmt(jnum(a.summary["group_norms"], "rel_rms_fp16_mean")) + ")";
      }
      s += "\n";
    }
  }
  for (Side side : {Side::kK, Side::kV}) {
    if (!has_side(a, side)) continue;
    const char* key = summary_key(a, side);
    if (!(a.summary.is_object() && a.summary.contains(key))) continue;
    const json& j = a.summary[key];
    s += "  solver " + std::string(key == std::string("joint") ? "K+V" : side_str(side)) + "     " +
         (j.contains("method") ? j["method"].get<std::string>() : std::string("?")) + ": budget " +
         fmt(jnum(j, "budget_assigned"), 10) + " of " + fmt(jnum(j, "budget_total"), 10) + " bits/token, code bits " +
         fmt(jnum(j, "code_bits_used"), 10);
    if (j.contains("predicted_distortion")) s += ", sum predicted D " + fmt(jnum(j, "predicted_distortion"));
    const double b = jnum(j, "distortion_std_before"), af = jnum(j, "distortion_std_after");
    const std::optional<Method> method = side_method(a, side);
    if (method && is_cobra(*method))
      s += "; per-head D std " + fmt(b) + " -> " + fmt(af) + " after C2" +
           (af > 0 ? " (" + fmt_fixed(b / af, 2) + "x)" : "");
    if (jnum(j, "heads_over_budget") > 0)
      s += "; " + fmt(jnum(j, "heads_over_budget")) + " heads over budget by " + fmt(jnum(j, "bits_over_budget")) + " bits";
    s += "\n";
    if (key == std::string("joint")) break;
  }
  auto tables = alloc_tables(a, c);
  // Fingerprint per side, as percentages, widths present only.
  for (Side side : {Side::kK, Side::kV}) {
    if (!has_side(a, side)) continue;
    const Fingerprint f = fingerprint(a, side);
    Table t;
    t.header = {"layer"};
    std::vector<int> used;
    for (int w = 0; w <= f.max_width; ++w)
      for (int l = 0; l < a.calib.n_layers; ++l)
        if (f.dims[size_t(l)][size_t(w)] > 0) {
          used.push_back(w);
          break;
        }
    for (int w : used) t.header.push_back(std::to_string(w) + " b");
    t.header.push_back("mean b");
    for (int l = 0; l < a.calib.n_layers; ++l) {
      std::vector<std::string> row = {std::to_string(l)};
      for (int w : used) row.push_back(fmt_fixed(100 * f.share(l, w), 1));
      row.push_back(fmt_fixed(f.mean_bits(l), 3));
      t.add(row);
    }
    s += "\nallocator fingerprint, " + side_str(side) + ": % of head dims stored at each width" +
         (std::count(used.begin(), used.end(), 0) ? " (0 b = not stored)" : "") + "\n" + t.to_text();
  }
  s += "\nper head:\n" + tables[0].to_text();
  return s;
}

// ---------------------------------------------------------------- run

InspectResult run_inspect(const InspectOptions& o, std::FILE* out) {
  InspectResult r;
  if (o.files.empty() || o.files.size() > 2)
    throw Error("", "FILE", "give one calibration, allocation or probe file, or two allocation files to compare");
  for (const auto& f : o.files)
    if (!fs::exists(f)) throw Error(f, "", "no such file");
  if (!o.plots_dir.empty()) {
    make_output_dir(o.plots_dir, "--plots");  // a new one is built aside and renamed in with the rest (OutputBatch)
  }
  auto emit = [&](const std::string& s) {
    if (o.summary && out) std::fputs(s.c_str(), out);
  };
  const std::string dir = o.plots_dir.empty() ? "" : (fs::path(o.plots_dir) / "").string();

  if (o.files.size() == 1 && detail::is_probe_file(o.files[0])) return detail::inspect_probe(o, emit, dir);

  if (o.files.size() == 2) {
    r.kind = "comparison";
    for (const auto& f : o.files)
      if (detect_kind(f) != FileKind::kAllocation)
        throw Error(f, "/@format", "is a calibration file: comparing needs two allocation files");
    const AllocFile a = read_alloc(o.files[0]), b = read_alloc(o.files[1]);
    const Comparison cmp = compare_allocs(a, o.files[0], b, o.files[1]);
    Table t;
    t.header = {"side", "layer", "bits_A", "bits_B", "net", "gained", "lost", "counted"};
    t.left = {true, false, false, false, false, false, false, true};
    json layers = json::array();
    for (const auto& m : cmp.layers) {
      t.add({side_str(m.side), std::to_string(m.layer), std::to_string(m.bits_a), std::to_string(m.bits_b),
             (m.bits_b >= m.bits_a ? "+" : "") + std::to_string(m.bits_b - m.bits_a), "+" + std::to_string(m.gained),
             "-" + std::to_string(m.lost), m.per_dim ? "per dim" : "per head"});
      layers.push_back({{"side", side_str(m.side)},
                        {"layer", m.layer},
                        {"bits_a", m.bits_a},
                        {"bits_b", m.bits_b},
                        {"gained", m.gained},
                        {"lost", m.lost},
                        {"counted", m.per_dim ? "per-dim" : "per-head"}});
    }
    std::string s = "comparison of two allocations of one " + a.calib.architecture + " model (config sha256 " +
                    short_hash(a.calib.model_config_sha256) + ")\n";
    s += "  A  " + o.files[0] + ": K " + a.method + " " + fmt(a.k_bpd_nominal) + " bpd (eff " +
         fmt_fixed(a.k_bpd_effective, 3) + "), V " + a.v_method + " " + fmt(a.v_bpd_nominal) + " bpd (eff " +
         fmt_fixed(a.v_bpd_effective, 3) + ")\n";
    s += "  B  " + o.files[1] + ": K " + b.method + " " + fmt(b.k_bpd_nominal) + " bpd (eff " +
         fmt_fixed(b.k_bpd_effective, 3) + "), V " + b.v_method + " " + fmt(b.v_bpd_nominal) + " bpd (eff " +
         fmt_fixed(b.v_bpd_effective, 3) + ")\n";
    s += std::string("  calibration ") + (a.calib_digest == b.calib_digest ? "same content" : "different content (same model)") + "\n";
    s += "\ncode bits per token per layer (all KV heads); gained/lost = bits B adds/removes against A, per coordinate\n"
         "where both code head dimensions, per head otherwise (low-rank bases differ):\n" +
         t.to_text();
    emit(s);
    if (!o.json_out.empty())
      write_json({{"kind", "comparison"},
                  {"inspect_version", 1},
                  {"a", allocation_ref(a, o.files[0])},
                  {"b", allocation_ref(b, o.files[1])},
                  {"model",
                   {{"model_config_sha256", a.calib.model_config_sha256},
                    {"architecture", a.calib.architecture},
                    {"n_layers", a.calib.n_layers},
                    {"n_kv_heads", a.calib.n_kv_heads},
                    {"head_dim", a.calib.head_dim}}},
                  {"layers", layers}},
                 o.json_out, &r);
    if (!o.csv_out.empty()) write_tables({t}, o.csv_out, &r);
    if (!dir.empty())
      add_files(&r, plot_compare(a, file_stem(o.files[0]) + " (" + a.method + " " + fmt(a.k_bpd_nominal) + " bpd)", b,
                                 file_stem(o.files[1]) + " (" + b.method + " " + fmt(b.k_bpd_nominal) + " bpd)", cmp,
                                 dir + file_stem(o.files[0]) + "_vs_" + file_stem(o.files[1]) + ".compare"));
    return r;
  }

  const std::string& path = o.files[0];
  const FileKind kind = detect_kind(path);
  auto check_head = [&](const CalibProvenance& p) {
    // Checked before anything is written: a bad --layer must not leave half the figures behind.
    if (o.plots_dir.empty()) return;
    if (o.layer < 0 || o.layer >= p.n_layers)
      throw Error("", "--layer", std::to_string(o.layer) + " is out of range: the model has layers 0.." +
                                     std::to_string(p.n_layers - 1));
    if (o.head < 0 || o.head >= p.n_kv_heads)
      throw Error("", "--head", std::to_string(o.head) + " is out of range: the model has KV heads 0.." +
                                    std::to_string(p.n_kv_heads - 1));
  };
  if (kind == FileKind::kCalibration) {
    r.kind = "calibration";
    if (!o.calib.empty()) throw Error("", "--calib", "only for allocation files (the input is a calibration file)");
    const CalibFile c = read_calib(path, false);
    check_head(c.prov);
    emit(calib_summary_text(c, path));
    if (!o.json_out.empty()) write_json(calib_summary_json(c, path), o.json_out, &r);
    if (!o.csv_out.empty()) write_tables(calib_tables(c), o.csv_out, &r);
    if (!dir.empty()) {
      const std::string tag = "_l" + std::to_string(o.layer) + "_h" + std::to_string(o.head);
      add_files(&r, plot_energy(c, nullptr, o.layer, o.head, dir + file_stem(path) + ".energy" + tag));
      add_files(&r, plot_eigen(c, nullptr, o.layer, o.head, dir + file_stem(path) + ".eigen" + tag));
    }
    return r;
  }

  r.kind = "allocation";
  AllocFile a = read_alloc(path);
  check_head(a.calib);
  // The calibration behind the allocation: given, or the recorded path when it is still there.
  std::string cal_path = o.calib;
  if (cal_path.empty() && !a.calib_path.empty() && fs::exists(a.calib_path)) cal_path = a.calib_path;
  CalibFile cal;
  const CalibFile* c = nullptr;
  if (!cal_path.empty()) {
    if (detect_kind(cal_path) != FileKind::kCalibration)
      throw Error(cal_path, "--calib", "is an allocation file, not a calibration file");
    cal = read_calib(cal_path, false);
    check_alloc_matches(a, path, cal, cal_path);
    c = &cal;
  }
  // Files written before kvq stored the solver's before-C2 distortions need the calibration for them.
  const bool recompute_before = recomputes_before_c2(a);
  if (c) {
    if (calib_content_digest(cal) != a.calib_digest)
      r.notes.push_back(cal_path + " is not the calibration " + path + " was made from (content digest differs): " +
                        (recompute_before ? "energy, eigen and before-C2 figures show this one"
                                          : "energy and eigen figures show this one"));
  } else {
    r.notes.push_back("no calibration (" + (a.calib_path.empty() ? std::string("none recorded") : a.calib_path + " is gone") +
                      "; pass --calib): energy and eigenvalue figures" +
                      (recompute_before ? " and before-C2 distortions" : "") + " skipped");
  }
  if (c && a.calib.model_path.empty()) a.calib.model_path = c->prov.model_path;  // display only
  std::string s = alloc_summary_text(a, path, c);
  {
    // The spread of the before-C2 figures shown must be the one the solver recorded: a check that
    // the figures show what the solver saw (recomputed ones especially).
    std::string extra;
    for (Side side : {Side::kK, Side::kV}) {
      const auto before = distortion_before_c2(a, c, side);
      if (before.empty()) continue;
      const bool stored = !a.distortion_before(side).empty();
      extra += "  " + side_str(side) + " per-head distortion before C2 (" +
               (stored ? std::string("stored by the solver") : "recomputed from " + base_name(cal_path)) + "): std " +
               fmt(population_std(before)) + ", solver recorded " +
               fmt(jnum(a.summary[summary_key(a, side)], "distortion_std_before")) + "\n";
    }
    if (!extra.empty()) s += "\n" + extra;
  }
  emit(s);
  if (!o.json_out.empty()) {
    json j = alloc_manifest(a);
    // vllm-turboquant: the preset, the kept layers and the key codebook, in the free-form summary
    // (the manifest stays schema-valid).
    if (detail::has_vllm_tq(a)) j["summary"]["vllm_turboquant"] = detail::vllm_tq_json(a);
    write_json(j, o.json_out, &r);
  }
  if (!o.csv_out.empty()) write_tables(alloc_tables(a, c), o.csv_out, &r);
  if (!dir.empty()) {
    const std::string stem = dir + file_stem(path);
    add_files(&r, plot_fingerprint(a, stem + ".fingerprint"));
    const bool lowrank = std::any_of(a.heads.begin(), a.heads.end(),
                                     [](const HeadDecision& h) { return uses(h, kFieldRank); });
    if (lowrank)
      add_files(&r, plot_cobra_heads(a, distortion_before_c2(a, c, Side::kK), distortion_before_c2(a, c, Side::kV),
                                     stem + ".cobra_heads"));
    else
      r.notes.push_back("no low-rank heads (method " + a.method + "/" + a.v_method + "): (rank, bits) figure skipped");
    if (c) {
      const std::string tag = "_l" + std::to_string(o.layer) + "_h" + std::to_string(o.head);
      add_files(&r, plot_energy(*c, &a, o.layer, o.head, stem + ".energy" + tag));
      add_files(&r, plot_eigen(*c, &a, o.layer, o.head, stem + ".eigen" + tag));
    }
  }
  return r;
}

}  // namespace kvq::report
