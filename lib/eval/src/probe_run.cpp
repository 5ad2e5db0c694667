// kvq-probe's work: the calibration windows, the candidates, the probe, the file's record.
#include <algorithm>
#include <memory>

#include "kvq/codec/vllm_turboquant.hpp"
#include "kvq/eval/overlap.hpp"
#include "kvq/eval/probe.hpp"
#include "kvq/io/alloc_file.hpp"
#include "kvq/io/calib_file.hpp"
#include "kvq/io/h5_paths.hpp"
#include "kvq/util/error.hpp"
#include "kvq/util/sha256.hpp"

namespace kvq {

ProbeFile run_probe(const ProbeRunOptions& o) {
  const bool vllm = o.candidates == "vllm-turboquant";
  if (!vllm && o.candidates != "allocation")
    throw Error("", "--candidates", "unknown value '" + o.candidates + "' (vllm-turboquant or allocation)");
  if (vllm != o.alloc.empty())
    throw Error("", "--alloc", vllm ? "only with --candidates allocation" : "--candidates allocation needs --alloc");
  if (o.windows < 1) throw Error("", "--windows", "must be >= 1, got " + std::to_string(o.windows));
  CalibFile c = read_calib(o.calib, false);
  if (!c.complete())
    throw Error(o.calib, h5path::kWindowsDone,
                std::to_string(c.windows_done) + " of " + std::to_string(c.calib_offsets.size()) +
                    " windows: an interrupted capture (finish it with calib-capture --resume)");
  Model::LoadOptions lo;
  lo.stream = o.stream;
  lo.precision = o.precision;
  Model m = Model::load(o.model, lo);
  const ModelConfig& cfg = m.config();
  if (c.prov.model_config_sha256 != m.config_sha256())
    throw Error(o.calib, "provenance.model_config_sha256",
                "the calibration was made from another model (" + c.prov.model_path + "), not from --model " + o.model);
  AllocFile a;
  if (!vllm) {
    a = read_alloc(o.alloc);
    if (a.calib_digest != calib_content_digest(c))
      throw Error(o.alloc, "calibration.content_digest",
                  "the allocation was made from another calibration (" + a.calib_path + "), not from --calib " + o.calib);
  }
  if (vllm && cfg.v_dim() != cfg.head_dim)
    throw Error(o.model, "head_dim_v",
                std::to_string(cfg.v_dim()) + " differs from head_dim " + std::to_string(cfg.head_dim) +
                    ": an MLA latent cache, which vLLM's TurboQuant does not code (no MLA path)");
  if (const std::string why = vllm ? vllm_tq::unsupported_head_dim(cfg.head_dim) : ""; !why.empty())
    throw Error(o.model, "head_dim", why + ": vLLM's TurboQuant refuses this model");

  // The windows: the recorded prefix + seq_len - |prefix| corpus tokens from each window's offset.
  const std::vector<int32_t> stream =
      calibration_stream(c, o.calib, "cannot re-read the calibration windows", "run kvq-probe where calib-capture ran");
  const std::vector<int> prefix = c.prov.window_prefix_or(cfg.bos_id);
  const int64_t slot = int64_t(c.prov.seq_len) - int64_t(prefix.size());
  const size_t n = std::min(size_t(o.windows), c.calib_offsets.size());
  std::vector<std::vector<int64_t>> windows;
  for (size_t w = 0; w < n; ++w) {
    const int64_t off = c.calib_offsets[w];
    if (off < 0 || off + slot > int64_t(stream.size()))
      throw Error(o.calib, h5path::kCalibOffsets, "window " + std::to_string(w) + " is past the corpus");
    std::vector<int64_t> ids(prefix.begin(), prefix.end());
    ids.insert(ids.end(), stream.begin() + off, stream.begin() + off + slot);
    windows.push_back(std::move(ids));
  }

  // The candidates: every preset on every layer, and the layer kept.
  ProbeFile p;
  p.candidates = o.candidates;
  struct Cand {
    std::string name;
    int kb, vb;
  };
  std::vector<Cand> cands;
  std::vector<std::unique_ptr<KvCoder>> coders;
  std::vector<const KvCoder*> settings;
  if (!vllm) {
    cands.push_back({"allocation", 0, 0});
    coders.push_back(std::make_unique<KvCoder>(cfg, a.heads, o.alloc));
    settings.push_back(coders.back().get());
  } else {
    for (int i = 0; i < vllm_tq::kNumPresets; ++i) {
      const auto& in = vllm_tq::info(vllm_tq::Preset(i));
      cands.push_back({in.name, in.key_bits, in.value_bits});
    }
    cands.push_back({"kept", 16, 16});
  }
  for (const Cand& k : cands) {
    if (!vllm) break;
    std::vector<HeadDecision> heads;
    for (Side side : {Side::kK, Side::kV})
      for (int l = 0; l < cfg.n_layers; ++l)
        for (int h = 0; h < cfg.n_kv_heads; ++h) {
          HeadDecision d;
          d.layer = l;
          d.kv_head = h;
          d.side = side;
          d.kind = CodingKind::kVllmTurboQuant;
          d.post_rope = side == Side::kK;
          d.bits = side == Side::kK ? k.kb : k.vb;
          heads.push_back(d);
        }
    coders.push_back(std::make_unique<KvCoder>(cfg, heads, o.calib));
    settings.push_back(coders.back().get());
  }
  ProbeOptions po;
  po.quiet = o.quiet;
  po.max_batch_tokens = o.max_batch_tokens;
  po.label = "kvq-probe";
  const ProbeResult r = probe_layers(m, windows, settings, po);
  if (!vllm) {
    const CompositeResult all = probe_composite(m, windows, *settings[0], po);
    p.has_composite = true;
    p.composite_kl = all.kl;
    p.composite_dnll = all.dnll;
    p.alloc_path = o.alloc;
  }

  p.model_path = o.model;
  p.model_config_sha256 = m.config_sha256();
  p.calib_path = o.calib;
  p.calib_sha256 = sha256_file(o.calib);
  p.calib_digest = calib_content_digest(c);
  p.n_layers = cfg.n_layers;
  p.windows = int(windows.size());
  p.seq_len = c.prov.seq_len;
  p.forward_precision = precision_name(m.precision());
  p.positions = r.positions;
  p.layer_forwards = r.layer_forwards;
  p.clean_nll = r.clean_nll;
  p.seconds = r.seconds;
  for (size_t s = 0; s < cands.size(); ++s) {
    ProbeSetting x;
    x.name = cands[s].name;
    x.key_bits = cands[s].kb;
    x.value_bits = cands[s].vb;
    for (int l = 0; l < cfg.n_layers; ++l) {
      x.kl.push_back(r.kl_at(int(s), l));
      x.dnll.push_back(r.dnll_at(int(s), l));
    }
    p.settings.push_back(std::move(x));
  }
  return p;
}

}  // namespace kvq
