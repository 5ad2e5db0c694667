// kvq-allocate --method vllm-turboquant: each head's error in every width vLLM's TurboQuant cache
// can give it, measured on the calibration reservoir with the engine's own codec (coding kind
// vllm-turboquant), and the preset and kept layers chosen from them (lib/alloc).
#include <string>

#include "kvq/alloc/vllm_turboquant.hpp"
#include "kvq/codec/vllm_turboquant.hpp"
#include "kvq/io/h5_paths.hpp"
#include "kvq/io/probe_file.hpp"
#include "kvq/util/error.hpp"
#include "layer_precision.hpp"

namespace kvq {

std::vector<alloc::VllmTqPreset> vllm_presets_from_flag(const std::string& flag, const std::string& list) {
  std::vector<alloc::VllmTqPreset> out;
  if (list == "all") {
    for (int p = 0; p < vllm_tq::kNumPresets; ++p) {
      const auto& in = vllm_tq::info(vllm_tq::Preset(p));
      out.push_back({in.name, in.key_bits, in.value_bits});
    }
    return out;
  }
  size_t start = 0;
  while (start <= list.size()) {
    const size_t comma = list.find(',', start);
    const std::string name = list.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
    const auto p = vllm_tq::parse_preset(name);
    if (!p) throw Error("", flag, "unknown preset '" + name + "' (all, or a list of: " + vllm_tq::preset_names() + ")");
    for (const auto& e : out)
      if (e.name == name) throw Error("", flag, "'" + name + "' given twice");
    const auto& in = vllm_tq::info(*p);
    out.push_back({in.name, in.key_bits, in.value_bits});
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  return out;
}

alloc::Allocation allocate_vllm_turboquant(const CalibFile& c, const AllocateOptions& o) {
  const auto sh = c.shape();
  const int L = sh.n_layers, H = sh.n_kv_heads, d = sh.head_dim;
  if (sh.v_dim() != d)
    throw Error(o.calib, "provenance.head_dim_v",
                std::to_string(sh.v_dim()) + " differs from head_dim " + std::to_string(d) +
                    ": an MLA latent cache, which vLLM's TurboQuant does not code (no MLA path)");
  if (c.prov.hybrid())
    throw Error(o.calib, "provenance.decoder_layers",
                "a hybrid model (" + std::to_string(c.prov.decoder_layer_count() - L) +
                    " of its decoder layers keep no KV cache): vLLM's TurboQuant layer rules (boundary and skipped "
                    "layers) are not modelled for hybrid decoders");
  if (const std::string why = vllm_tq::unsupported_head_dim(d); !why.empty())
    throw Error(o.calib, "provenance.head_dim", why + ": vLLM's TurboQuant refuses this model");
  alloc::VllmTqInput in;
  in.shape = {L, H, d, d};
  in.presets = vllm_presets_from_flag("--presets", o.vllm_presets);
  in.forced = alloc::vllm_tq_forced_layers(L);
  // Sliding-window layers must be kept: the engine refuses to code them.
  for (int l = 0; l < L; ++l)
    if (c.prov.window_of(l) > 0 && std::find(in.forced.begin(), in.forced.end(), l) == in.forced.end())
      in.forced.push_back(l);
  std::sort(in.forced.begin(), in.forced.end());
  if (!o.probe.empty()) {  // the end-to-end probe: a layer's K and V coded together, per preset
    const ProbeFile p = read_probe(o.probe);
    if (p.candidates != "vllm-turboquant")
      throw Error(o.probe, "candidates", "'" + p.candidates + "': not a probe of vllm-turboquant's candidates");
    if (p.calib_digest != calib_content_digest(c))
      throw Error(o.probe, "calibration.content_digest",
                  "measured on another calibration (" + p.calib_path + "), not on --calib " + o.calib);
    if (p.n_layers != L)
      throw Error(o.probe, "model.n_layers", std::to_string(p.n_layers) + ", the calibration has " + std::to_string(L));
    auto find = [&](const std::string& name) -> const ProbeSetting& {
      for (const auto& s : p.settings)
        if (s.name == name) return s;
      throw Error(o.probe, "settings", "no '" + name + "' setting (probe it with kvq-probe --candidates vllm-turboquant)");
    };
    const size_t P = in.presets.size();
    in.layer_err.assign(size_t(L) * (P + 1), 0.0);
    for (size_t i = 0; i <= P; ++i) {
      const ProbeSetting& s = find(i < P ? in.presets[i].name : std::string("kept"));
      for (int l = 0; l < L; ++l) in.layer_err[size_t(l) * (P + 1) + i] = s.kl[size_t(l)];
    }
  } else {
    const int64_t n = std::min<int64_t>(c.reservoir.size(), o.measure_tokens);
    if (n < 1)
      throw Error(o.calib, h5path::kReservoir,
                  "empty: vllm-turboquant needs reservoir rows (calib-capture --reservoir-tokens) or --probe");
  auto variant = [&](int l, int h, Side side, int f) {
    HeadDecision dec;
    dec.layer = l;
    dec.kv_head = h;
    dec.side = side;
    dec.kind = CodingKind::kVllmTurboQuant;
    dec.post_rope = side == Side::kK;
    dec.bits = side == Side::kK ? alloc::kVllmTqKeyBits[f] : alloc::kVllmTqValueBits[f];
    return dec;
  };
  LayerPrecisionCosts costs = measure_head_costs(c, alloc::kVllmTqKeyVariants, alloc::kVllmTqValueVariants, variant,
                                                 o.objective == "attention", o.measure_tokens);
  in.k_err = std::move(costs.k);
  in.v_err = std::move(costs.v);
  }
  alloc::VllmTqTarget target;
  if (o.max_error >= 0) target.max_error = o.max_error;
  else target.bpd = o.bpd;
  try {
    return alloc::allocate_vllm_turboquant(in, target);
  } catch (const Error& e) {
    // The solver names its own parameters; the user typed --bpd / --max-error.
    const std::string what = e.what();
    for (const auto& [prefix, flag] : {std::pair<std::string, std::string>{"bits_per_dim: ", "--bpd"},
                                       std::pair<std::string, std::string>{"max_error: ", "--max-error"}})
      if (what.rfind(prefix, 0) == 0)
        throw Error("", flag == "--max-error" && o.max_is_kl ? "--max-kl" : flag, what.substr(prefix.size()));
    throw;
  }
}

}  // namespace kvq
