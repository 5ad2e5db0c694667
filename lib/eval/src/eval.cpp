#include "kvq/eval/eval.hpp"

#include <spdlog/spdlog.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <map>
#include <memory>
#include <sstream>
#include <tuple>

#include "kvq/alloc/uniform.hpp"
#include "kvq/corpus/corpus.hpp"
#include "kvq/eval/overlap.hpp"
#include "kvq/format/decision_layout.hpp"
#include "kvq/io/alloc_file.hpp"
#include "kvq/tokenizer/tokenizer.hpp"
#include "kvq/util/error.hpp"
#include "kvq/util/sha256.hpp"

namespace kvq {
namespace {

std::string short_sha(const std::string& s) { return s.substr(0, 12); }

std::string join(const std::vector<std::string>& v) {
  std::string s;
  for (const auto& x : v) s += (s.empty() ? "" : ",") + x;
  return s;
}

}  // namespace

EvalReport run_eval(const EvalOptions& o) {
  if (o.baseline != "uniform" && o.baseline != "none")
    throw Error("", "--baseline", "unknown baseline '" + o.baseline + "' (uniform or none)");
  alloc::check_match(o.match, o.baseline_k_bpd, o.baseline_v_bpd);
  if (o.match == "effective" && o.baseline == "none")
    throw Error("", "--match", "effective sets the baseline's budget, but --baseline none runs no baseline");
  if (o.text.empty()) throw Error("", "--text", "no text given");
  for (const auto& p : o.text)
    if (!std::filesystem::exists(p)) throw Error(p, "--text", "no such file or folder");
  if (o.policy.sink < 0 || o.policy.recent < 0)
    throw Error("", o.policy.sink < 0 ? "--sink" : "--recent", "must be >= 0");
  if (o.max_tokens < 0) throw Error("", "--max-tokens", "must be >= 0");

  AllocFile a = read_alloc(o.alloc);
  Model::LoadOptions lo;
  lo.stream = o.stream;
  lo.precision = o.precision;
  Model m = Model::load(o.model, lo);
  const ModelConfig& cfg = m.config();
  if (a.calib.model_config_sha256 != m.config_sha256())
    throw Error(o.alloc, "calibration.model_config_sha256",
                "the allocation was made for another model (config sha256 " + short_sha(a.calib.model_config_sha256) +
                    "..., calibration " + a.calib_path + "), not for --model " + o.model + " (" +
                    short_sha(m.config_sha256()) + "...)");
  // The cache's dims: an allocation for another K or V dim cannot code this model's rows.
  if (a.calib.head_dim != cfg.head_dim || a.calib.v_dim() != cfg.v_dim())
    throw Error(o.alloc, a.calib.head_dim != cfg.head_dim ? "calibration.head_dim" : "calibration.head_dim_v",
                std::to_string(a.calib.head_dim != cfg.head_dim ? a.calib.head_dim : a.calib.v_dim()) +
                    " does not match --model " + o.model + "'s " +
                    std::to_string(a.calib.head_dim != cfg.head_dim ? cfg.head_dim : cfg.v_dim()));
  // The held-out check runs against --calib, else against the calibration file the allocation
  // names when it is still there unchanged (allocations travel without their calibration files).
  std::string calib_path = o.calib, not_checked;
  if (calib_path.empty()) {
    if (a.calib_path.empty() || !std::filesystem::is_regular_file(a.calib_path))
      not_checked = "the allocation's calibration file " + a.calib_path + " is not here";
    else if (sha256_file(a.calib_path) != a.calib_sha256)
      not_checked = "the allocation's calibration file " + a.calib_path + " changed since allocation";
    else
      calib_path = a.calib_path;
  }
  CalibFile calib;
  if (!calib_path.empty()) {
    calib = read_calib(calib_path, false);
    check_alloc_matches(a, o.alloc, calib, calib_path);
  }

  auto tok = Tokenizer::load(o.tokenizer.empty() ? Tokenizer::default_path_for_model(o.model, cfg.vocab_size)
                                                 : o.tokenizer);
  CorpusText text = read_corpus(o.text, o.lossy_utf8);
  const std::string text_name = join(o.text);
  std::vector<int32_t> stream = tokenize_corpus(text, [&](const std::string& s) { return tok->encode(s); });
  if (o.max_tokens > 0 && int64_t(stream.size()) > o.max_tokens) stream.resize(size_t(o.max_tokens));
  if (stream.empty()) throw Error(text_name, "--text", "holds no tokens");
  for (int32_t id : stream)
    if (id < 0 || id >= cfg.vocab_size)
      throw Error(text_name, "--tokenizer", "token id " + std::to_string(id) + " is outside the model's vocabulary");

  EvalReport r;
  r.model = o.model;
  r.alloc = o.alloc;
  r.text = text_name;
  r.text_tokens = int64_t(stream.size());
  r.window = o.window > 0 ? o.window : cfg.max_seq_len;
  r.stride = o.stride > 0 ? o.stride : std::max(1, r.window / 2);
  r.policy = o.policy;
  r.match = o.match;
  r.forward_precision = precision_name(o.precision);

  // Held-out check.
  std::vector<int32_t> cal;
  if (!calib_path.empty()) {
    try {
      cal = calibration_stream(calib, calib_path);
    } catch (const Error& e) {
      if (!o.calib.empty()) throw;  // asked for explicitly: a check that cannot run is an error
      not_checked = e.what();
    }
  }
  if (!cal.empty()) {
    std::vector<int32_t> mine;
    const std::vector<int32_t>* check = &stream;
    if (tok->sha256() != calib.prov.tokenizer_sha256) {  // compare in the calibration's tokens
      auto ctok = Tokenizer::load(calib.prov.tokenizer_path);
      const SpecialTokens cmode = parse_special_tokens(calib.prov.special_tokens_mode, "provenance.special_tokens_mode");
      mine = tokenize_corpus(text, [&](const std::string& s) { return ctok->encode(s, cmode, nullptr); });
      check = &mine;
    }
    OverlapReport ov = check_disjoint(*check, text_name, cal, calib, calib_path);
    r.calib = calib_path;
    r.overlap = "checked against " + calib_path + ": no " + std::to_string(ov.ngram) +
                "-token run shared with its " + std::to_string(ov.calib_windows) + " calibration windows (" +
                std::to_string(ov.calib_tokens) + " tokens)";
    if (sha256_file(calib_path) != a.calib_sha256) r.overlap += "; note: not the calibration file the allocation was made from";
  } else {
    r.overlap = "NOT CHECKED against calibration windows: " + not_checked + " (pass --calib)";
  }

  PplOptions po;
  po.window = r.window;
  po.stride = r.stride;
  // Windows start as the calibration's did: the prefix its provenance records (GLM-4 [gMASK] <sop>),
  // else the tokenizer's (Llama [BOS], Qwen nothing).
  po.prefix = tok->prefix_ids();
  if (!calib_path.empty() && calib.prov.window_prefix && *calib.prov.window_prefix != po.prefix) {
    spdlog::warn("{} records windows starting with {} token(s), the tokenizer's prefix has {}: using the recorded one",
                 calib_path, calib.prov.window_prefix->size(), po.prefix.size());
    po.prefix = *calib.prov.window_prefix;
  }
  for (int id : po.prefix)
    if (id < 0 || id >= cfg.vocab_size)
      throw Error(calib_path.empty() ? text_name : calib_path, "window_prefix",
                  "token id " + std::to_string(id) + " is outside the model's vocabulary");
  po.policy = o.policy;
  po.quiet = o.quiet;
  po.kl = o.kl;

  // Coders first: a bad allocation or baseline budget fails before any forward runs.
  KvCoder alloc_coder(cfg, a.heads, o.alloc);
  std::unique_ptr<KvCoder> base_coder;
  double kb = 0, vb = 0;
  if (o.baseline == "uniform") {
    kb = o.baseline_k_bpd > 0 ? o.baseline_k_bpd : a.k_bpd_nominal;
    vb = o.baseline_v_bpd > 0 ? o.baseline_v_bpd : a.v_bpd_nominal;
    const alloc::Shape shape{cfg.n_layers, cfg.n_kv_heads, cfg.head_dim, cfg.v_dim()};
    if (o.match == "effective") {
      const bool nc = alloc::tq_norm_correction(a.heads);
      kb = alloc::match_effective_bits("uniform", shape, Side::kK, alloc_coder.k_bpd_effective(), nc);
      vb = alloc::match_effective_bits("uniform", shape, Side::kV, alloc_coder.v_bpd_effective(), nc);
    }
    std::vector<HeadDecision> base = alloc::baseline_heads("uniform", shape, kb, vb, alloc::tq_norm_correction(a.heads),
                                                           o.alloc, "pass --baseline-k-bpd / --baseline-v-bpd");
    // An allocation made with --norm-correction auto decides per (layer, KV head, side); without
    // the calibration file the baseline's TQ heads take the allocation's decision for the same
    // head (what kvq-verify's reservoir measurement gives when the groups are the same, as for a
    // uniform allocation), so a uniform allocation equals its own baseline.
    std::map<std::tuple<int, int, int>, bool> nc_of;
    for (const auto& h : a.heads)
      if (h.kind == CodingKind::kTqGroups) nc_of[{h.layer, h.kv_head, int(h.side)}] = h.norm_correction;
    for (auto& h : base) {
      auto it = nc_of.find({h.layer, h.kv_head, int(h.side)});
      if (h.kind == CodingKind::kTqGroups && it != nc_of.end()) h.norm_correction = it->second;
    }
    base_coder = std::make_unique<KvCoder>(cfg, std::move(base), "uniform baseline");
  }

  EvalRow fp;
  fp.name = "fp32";
  po.label = "fp32";
  fp.result = sliding_perplexity(m, stream, po, nullptr);
  r.rows.push_back(fp);

  EvalRow al;
  al.name = a.method + (a.v_method != a.method ? "/" + a.v_method : "");
  al.coded = true;
  al.k_bpd_nominal = a.k_bpd_nominal;
  al.v_bpd_nominal = a.v_bpd_nominal;
  al.k_bpd_effective = alloc_coder.k_bpd_effective();
  al.v_bpd_effective = alloc_coder.v_bpd_effective();
  po.label = al.name;
  al.result = sliding_perplexity(m, stream, po, &alloc_coder);
  r.rows.push_back(al);

  if (base_coder) {
    EvalRow b;
    b.name = "uniform (baseline)";
    b.coded = true;
    b.k_bpd_nominal = kb;
    b.v_bpd_nominal = vb;
    b.k_bpd_effective = base_coder->k_bpd_effective();
    b.v_bpd_effective = base_coder->v_bpd_effective();
    po.label = "uniform baseline";
    b.result = sliding_perplexity(m, stream, po, base_coder.get());
    r.rows.push_back(b);
  }
  return r;
}

nlohmann::json EvalReport::to_json() const {
  nlohmann::json rj = nlohmann::json::array();
  const double fp_ppl = rows.empty() ? 0 : rows[0].result.ppl();
  for (const auto& x : rows) {
    nlohmann::json j = {{"name", x.name},
                        {"coded", x.coded},
                        {"nll", x.result.nll()},
                        {"ppl", x.result.ppl()},
                        {"ppl_vs_fp32", fp_ppl > 0 ? x.result.ppl() / fp_ppl : 0.0},
                        {"tokens", x.result.tokens},
                        {"windows", x.result.windows},
                        {"forward_tokens", x.result.forward_tokens},
                        {"seconds", x.result.seconds}};
    if (x.coded && x.result.has_kl) j["kl_vs_fp32"] = x.result.kl();
    if (x.coded) {
      j["k_bpd_nominal"] = x.k_bpd_nominal;
      j["k_bpd_effective"] = x.k_bpd_effective;
      j["v_bpd_nominal"] = x.v_bpd_nominal;
      j["v_bpd_effective"] = x.v_bpd_effective;
    }
    rj.push_back(j);
  }
  nlohmann::json out = {{"kind", "eval"},
                        {"eval_version", match == "effective" ? 2 : 1},  // 2: baseline_budget may be "effective"
                        {"model", model},
                        {"alloc", alloc},
                        {"text", text},
                        {"calib", calib},
                        {"text_tokens", text_tokens},
                        {"window", window},
                        {"stride", stride},
                        {"sink", policy.sink},
                        {"recent", policy.recent},
                        {"baseline_budget", match},
                        {"held_out_check", overlap},
                        {"rows", rj}};
  if (forward_precision != "fp32") out["forward_precision"] = forward_precision;
  return out;
}

static std::string fmt_kl(double v) {
  char b[32];
  std::snprintf(b, sizeof b, "%.4g", v);
  return b;
}

std::string format_eval_report(const EvalReport& r) {
  std::ostringstream s;
  char buf[512];
  s << "model " << r.model << "\ntext  " << r.text << ": " << r.text_tokens << " tokens, windows of " << r.window
    << " (BOS + " << r.window - 1 << " text tokens), stride " << r.stride << "\n";
  s << "cache: every token's K/V coded once when written; full precision: first " << r.policy.sink
    << " positions (sink), last " << r.policy.recent << " entries per query (recent)\n";
  s << "held-out: " << r.overlap << "\n";
  if (r.forward_precision != "fp32")
    s << "forward: " << r.forward_precision << " (the row named fp32 is the unquantized " << r.forward_precision
      << " forward; every figure compares forwards of the same arithmetic)\n";
  std::snprintf(buf, sizeof buf, "%-24s %9s %9s %9s %9s %9s %11s %9s %10s\n", "", "K bpd", "K eff", "V bpd", "V eff",
                "NLL", "PPL", "vs fp32", "KL");
  s << buf;
  const double fp = r.rows.empty() ? 0 : r.rows[0].result.ppl();
  for (const auto& x : r.rows) {
    const double rel = fp > 0 ? 100.0 * (x.result.ppl() / fp - 1.0) : 0;
    if (x.coded)
      std::snprintf(buf, sizeof buf, "%-24s %9.3g %9.4g %9.3g %9.4g %9.5f %11.4f %+8.2f%% %10s\n", x.name.c_str(),
                    x.k_bpd_nominal, x.k_bpd_effective, x.v_bpd_nominal, x.v_bpd_effective, x.result.nll(),
                    x.result.ppl(), rel, x.result.has_kl ? fmt_kl(x.result.kl()).c_str() : "-");
    else
      std::snprintf(buf, sizeof buf, "%-24s %9s %9s %9s %9s %9.5f %11.4f %9s\n", x.name.c_str(), "32", "32", "32",
                    "32", x.result.nll(), x.result.ppl(), "");
    s << buf;
  }
  s << (r.match == "effective"
            ? "(baseline per side at the nearest effective bpd >= the allocation's, --match effective; "
              "effective bpd"
            : "(baseline at the allocation's nominal bpd; effective bpd");
  s << " = stored bits per token per head / d, protected "
       "full-precision tokens not counted; KL = mean KL(fp32 || coded) of the next-token distributions, nats)\n";
  return s.str();
}

}  // namespace kvq
