// kvq-inspect's views of the end-to-end probe's files and of vLLM TurboQuant allocations.
#include <algorithm>
#include <cstdio>

#include "inspect_detail.hpp"
#include "kvq/alloc/vllm_turboquant.hpp"
#include "kvq/codec/vllm_turboquant.hpp"
#include "kvq/io/probe_file.hpp"
#include "kvq/report/plots.hpp"
#include "kvq/util/error.hpp"

namespace kvq::report::detail {

using nlohmann::json;

// kvq-probe's JSON rather than an HDF5 file: its first byte that is not white space is '{'.
bool is_probe_file(const std::string& path) {
  std::FILE* f = std::fopen(path.c_str(), "rb");
  if (!f) return false;
  int ch;
  do ch = std::fgetc(f);
  while (ch == ' ' || ch == '\n' || ch == '\r' || ch == '\t');
  std::fclose(f);
  return ch == '{';
}

// vllm-turboquant allocations: the preset the decisions spell, the layers kept in BF16 and the key
// codebook the preset's Lloyd-Max keys decode with (vLLM's solve_lloyd_max at the head dim).
struct VllmTqView {
  bool any = false;
  int key_bits = 0, value_bits = 0;  // of the coded layers (0: every layer kept)
  std::vector<int> kept;
  std::string preset;  // "" when the coded widths spell none
};

VllmTqView vllm_tq_view(const AllocFile& a) {
  VllmTqView v;
  const int L = a.calib.n_layers;
  std::vector<int> kb(size_t(std::max(L, 0)), 0);
  for (const auto& h : a.heads) {
    if (h.kind != CodingKind::kVllmTurboQuant || h.layer < 0 || h.layer >= L) continue;
    v.any = true;
    if (h.bits == 16) {
      if (h.side == Side::kK) kb[size_t(h.layer)] = 16;
    } else if (h.side == Side::kK) {
      kb[size_t(h.layer)] = h.bits;
      v.key_bits = h.bits;
    } else {
      v.value_bits = h.bits;
    }
  }
  for (int l = 0; l < L; ++l)
    if (kb[size_t(l)] == 16) v.kept.push_back(l);
  for (int p = 0; p < vllm_tq::kNumPresets; ++p) {
    const auto& in = vllm_tq::info(vllm_tq::Preset(p));
    if (in.key_bits == v.key_bits && in.value_bits == v.value_bits) v.preset = in.name;
  }
  return v;
}

json vllm_tq_json(const AllocFile& a) {
  const VllmTqView v = vllm_tq_view(a);
  json j;
  j["preset"] = v.preset.empty() ? json(nullptr) : json(v.preset);
  j["key_bits"] = v.key_bits;
  j["value_bits"] = v.value_bits;
  j["kept_layers"] = v.kept;
  j["forced_layers"] = alloc::vllm_tq_forced_layers(a.calib.n_layers);
  if (v.key_bits == 3 || v.key_bits == 4) {
    const vllm_tq::Codebook cb = vllm_tq::lloyd_max(a.calib.head_dim, v.key_bits);
    j["key_codebook"] = {{"head_dim", a.calib.head_dim},
                         {"bits", v.key_bits},
                         {"centroids", cb.centroids},
                         {"midpoints", cb.midpoints},
                         {"iterations", cb.iterations}};
  }
  return j;
}

std::string vllm_tq_text(const AllocFile& a) {
  const VllmTqView v = vllm_tq_view(a);
  if (!v.any) return "";
  std::string s = "  vLLM TurboQuant ";
  s += v.preset.empty() ? (v.key_bits ? "widths K " + std::to_string(v.key_bits) + " / V " + std::to_string(v.value_bits) +
                                            " (no vLLM preset)"
                                      : std::string("every layer kept"))
                        : "--kv-cache-dtype " + v.preset;
  s += "; kept in BF16: " + (v.kept.empty() ? std::string("none") : join_ints(v.kept)) + " (vLLM always keeps " +
       join_ints(alloc::vllm_tq_forced_layers(a.calib.n_layers)) + ")\n";
  const json p = a.summary.is_object() && a.summary.contains("joint") ? a.summary["joint"].value("params", json()) : json();
  if (p.is_object() && p.contains("error") && p.contains("default_error"))
    s += "                   measured error " + p["error"].get<std::string>() + " (" +
         a.params.value("objective", std::string("attention")) + "); vLLM's default with this preset " +
         p["default_error"].get<std::string>() + " at " + p.value("default_bpd", std::string("?")) + " bits per dim\n";
  if (v.key_bits == 3 || v.key_bits == 4) {
    const vllm_tq::Codebook cb = vllm_tq::lloyd_max(a.calib.head_dim, v.key_bits);
    s += "                   key codebook (Lloyd-Max for N(0, 1/" + std::to_string(a.calib.head_dim) + "), " +
         std::to_string(v.key_bits) + " bits):";
    for (float c : cb.centroids) s += " " + fmt(c, 6);
    s += "\n";
  }
  return s;
}


bool has_vllm_tq(const AllocFile& a) { return vllm_tq_view(a).any; }

InspectResult inspect_probe(const InspectOptions& o, const std::function<void(const std::string&)>& emit,
                            const std::string& dir) {
  // A probe file (kvq-probe's JSON): its per-layer table, the figure, the file as JSON.
  InspectResult r;
  r.kind = "probe";
  if (!o.calib.empty()) throw Error("", "--calib", "only for allocation files (the input is a probe file)");
  const std::string& path = o.files[0];
  const ProbeFile pf = read_probe(path);
  Table t;
  t.header = {"candidate"};
  t.left = {true};
  for (int l = 0; l < pf.n_layers; ++l) {
    t.header.push_back("L" + std::to_string(l));
    t.left.push_back(false);
  }
  t.header.push_back("sum");
  t.left.push_back(false);
  for (const auto& st : pf.settings) {
    std::vector<std::string> row = {st.name};
    double sum = 0;
    for (double v : st.kl) row.push_back(fmt(v, 3)), sum += v;
    row.push_back(fmt(sum, 4));
    t.add(row);
  }
  std::string s = std::string(kProbeFormat) + " v" + std::to_string(kProbeVersion) + "  " + path + "\n";
  s += "  model        " + pf.model_path + " (config sha256 " + short_hash(pf.model_config_sha256) + "), " +
       std::to_string(pf.n_layers) + " layers\n";
  s += "  calibration  " + pf.calib_path + " (sha256 " + short_hash(pf.calib_sha256) + "), first " +
       std::to_string(pf.windows) + " windows x " + std::to_string(pf.seq_len) + " tokens, " +
       std::to_string(pf.positions) + " positions scored\n";
  s += "  candidates   " + pf.candidates + (pf.alloc_path.empty() ? "" : " (" + pf.alloc_path + ")") + "\n";
  s += "  cost         " + std::to_string(pf.layer_forwards) + " layer forwards, " + fmt(pf.seconds, 3) +
       " s; unquantized NLL " + fmt(pf.clean_nll, 5) + "\n";
  if (pf.has_composite) {
    double sum = 0;
    for (double v : pf.settings.at(0).kl) sum += v;
    s += "  composite    every layer at once: KL " + fmt(pf.composite_kl, 4) + ", dNLL " + fmt(pf.composite_dnll, 4) +
         "; the layers' sum " + fmt(sum, 4) + ": additivity ratio " + fmt_fixed(sum > 0 ? pf.composite_kl / sum : 0.0, 3) + "\n";
  }
  s += "\nmean next-token KL (nats) with only that layer's K and V coded:\n" + t.to_text();
  emit(s);
  if (!o.json_out.empty()) write_json(json::parse(probe_json(pf).dump()), o.json_out, &r);
  if (!o.csv_out.empty()) write_tables({t}, o.csv_out, &r);
  if (!dir.empty()) add_files(&r, plot_probe(pf, dir + file_stem(path) + ".probe"));
  return r;
}

}  // namespace kvq::report::detail
