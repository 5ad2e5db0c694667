// kvq-eval: perplexity with the KV cache coded by an allocation, beside fp32 and a uniform baseline.
#include <cstdio>

#include "kvq/cli/cli.hpp"
#include "kvq/eval/eval.hpp"
#include "kvq/model/model.hpp"
#include "kvq/util/atomic_file.hpp"

int main(int argc, char** argv) {
  CLI::App app{
      "kvq-eval: perplexity of a model on held-out text with K and V coded -> decoded by the real codec\n"
      "inside the forward (every layer, every token, each token coded once when written to the cache),\n"
      "against the fp32 forward and a uniform TQ-MSE baseline at the allocation's nominal bpd (--match effective:\n"
      "at the nearest effective bpd, norms included, at least the allocation's).\n"
      "  kvq-eval --model data/kvq-demo-llama --alloc a.kvqalloc.h5 --text heldout.txt --calib cal.kvqcal.h5\n"
      "Sliding windows: each window is BOS + window-1 text tokens, advanced by --stride; every text token\n"
      "is scored once. --sink N --recent M keep the window's first N positions and, for each query, the\n"
      "last M cache entries in full precision (exact, in one forward per window).\n"
      "Coded rows also give the end-to-end KL against the fp32 forward (--no-kl skips it); --max-kl and\n"
      "--max-ppl-ratio gate CI on the allocation's row. Exit codes: 0 ok, 1 a gate failed, 2 bad input."};
  kvq::cli::Common common;
  kvq::cli::add_common(app, common);
  kvq::EvalOptions o;
  std::string json_out;
  kvq::cli::add_model(app, o.model);
  kvq::cli::add_alloc(app, o.alloc);
  app.add_option("--text", o.text, "held-out UTF-8 text files or folders (repeatable)")
      ->required()
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll);
  app.add_flag("--lossy-utf8", o.lossy_utf8, "replace invalid UTF-8 bytes instead of failing");
  app.add_option("--tokenizer", o.tokenizer, "tokenizer file (default: the model's own)");
  kvq::cli::add_calib(app, o.calib);
  app.get_option("--calib")
      ->required(false)
      ->description("calibration file of the allocation: refuse text that overlaps its calibration windows");
  app.add_option("--baseline,--bpd-baseline", o.baseline,
                 "baseline at the allocation's nominal bpd: uniform (TQ-MSE) or none")
      ->default_val(o.baseline)
      ->check(CLI::IsMember({"uniform", "none"}));
  app.add_option("--baseline-k-bpd", o.baseline_k_bpd, "baseline K bits (default: the allocation's nominal)")
      ->check(CLI::Range(1, 8));
  app.add_option("--baseline-v-bpd", o.baseline_v_bpd, "baseline V bits (default: the allocation's nominal)")
      ->check(CLI::Range(1, 8));
  std::string load = "whole";
  app.add_option("--load", load,
                 "whole: the whole model in memory; stream: the checkpoint stays mapped and each window's forward converts "
                 "one layer at a time (models whose fp32 weights do not fit; same figures)")
      ->default_val("whole")
      ->check(CLI::IsMember({"whole", "stream"}))
      ->each([&](const std::string& v) { o.stream = v == "stream"; });
  kvq::cli::add_match(app, o.match);
  app.add_option("--window", o.window, "tokens per window, BOS included (default: the model's maximum)")
      ->check(CLI::Range(2, 1 << 20));
  app.add_option("--stride", o.stride, "new tokens per window (default: window / 2)")->check(CLI::Range(1, 1 << 20));
  app.add_option("--sink", o.policy.sink, "first N positions of each window stay full precision")
      ->default_val(0)
      ->check(CLI::NonNegativeNumber);
  app.add_option("--recent", o.policy.recent, "last M cache entries of each query stay full precision")
      ->default_val(0)
      ->check(CLI::NonNegativeNumber);
  app.add_option("--max-tokens", o.max_tokens, "score only the first N text tokens (0 = all)")
      ->default_val(0)
      ->check(CLI::NonNegativeNumber);
  app.add_option("--json", json_out, "write the report as JSON (atomically)");
  bool no_kl = false;
  app.add_flag("--no-kl", no_kl,
               "skip the end-to-end KL of the coded rows against the fp32 forward (it costs one more forward per "
               "batch of windows)");
  double max_kl = -1;
  auto* max_kl_opt = app.add_option("--max-kl", max_kl,
                                    "CI gate: exit 1 when the allocation's end-to-end KL (kl_vs_fp32, nats) is above this")
                         ->check(CLI::NonNegativeNumber);
  double max_ppl_ratio = -1;
  app.add_option("--max-ppl-ratio", max_ppl_ratio, "CI gate: exit 1 when the allocation's perplexity / fp32's is above this")
      ->check(CLI::PositiveNumber);
  max_kl_opt->excludes(app.get_option("--no-kl"));
  std::string precision;
  kvq::cli::add_precision(app, precision);
  KVQ_CLI_PARSE(app, argc, argv);
  kvq::cli::apply_common(common);
  o.quiet = common.quiet;
  return kvq::cli::run_main("kvq-eval", [&] {
    kvq::set_threads(common.threads);
    o.precision = kvq::resolve_precision(precision);
    o.kl = !no_kl;
    kvq::EvalReport r = kvq::run_eval(o);
    if (!common.quiet) std::fputs(kvq::format_eval_report(r).c_str(), stdout);
    if (!json_out.empty()) kvq::write_file_atomically(json_out, r.to_json().dump(1) + "\n");
    // The gates read the allocation's row (rows[1]); exit 1 names each failure, as kvq-verify's do.
    int rc = 0;
    const kvq::EvalRow& a = r.rows.at(1);
    if (max_kl >= 0 && a.result.kl() > max_kl) {
      std::fprintf(stderr, "kvq-eval: gate failed: end-to-end KL %.6g > --max-kl %.6g\n", a.result.kl(), max_kl);
      rc = 1;
    }
    const double ratio = a.result.ppl() / r.rows.at(0).result.ppl();
    if (max_ppl_ratio > 0 && ratio > max_ppl_ratio) {
      std::fprintf(stderr, "kvq-eval: gate failed: perplexity ratio %.6g > --max-ppl-ratio %.6g\n", ratio, max_ppl_ratio);
      rc = 1;
    }
    return rc;
  });
}
