// kvq-verify: prove an allocation on held-out activations; a CI gate.
#include <cstdio>

#include "kvq/cli/cli.hpp"
#include "kvq/pipeline/verify.hpp"
#include "kvq/util/atomic_file.hpp"

int main(int argc, char** argv) {
  CLI::App app{
      "kvq-verify: code the calibration file's held-out windows with an allocation and with a baseline at the\n"
      "same nominal budget (--match effective: at least the allocation's effective bits), decode with the CPU\n"
      "reference decoder, and report per layer:\n"
      "RoPE-logit MAE over causal pairs, softmax KL, top-10 overlap, K/V NMSE, bpd. Logits use the softmax\n"
      "scale the calibration file records (MLA: 192^-1/2 mscale^2), else 1/sqrt(head_dim); V is coded at its\n"
      "own dim when the file records one (MLA's served cache: K 576, V 512).\n"
      "With a GPU, every (layer, KV head, side) also goes through the GPU encoder and decoder and each\n"
      "(layer, window) through the fused decode attention, against the CPU (a disagreement fails a gate;\n"
      "the fused attention is skipped when K and V dims differ).\n"
      "Exit codes: 0 all gates pass, 1 a gate failed (named on stderr), 2 bad input."};
  kvq::cli::Common common;
  kvq::cli::add_common(app, common);
  kvq::VerifyOptions o;
  std::string json_out;
  kvq::cli::add_calib(app, o.calib);
  kvq::cli::add_alloc(app, o.alloc);
  app.add_option("--baseline", o.baseline, "baseline at the same nominal budget: uniform (TQ-MSE) or kivi")
      ->default_val(o.baseline)->check(CLI::IsMember({"uniform", "kivi"}));
  app.add_option("--baseline-k-bpd", o.baseline_k_bpd, "baseline K bits (default: the allocation's nominal)");
  app.add_option("--baseline-v-bpd", o.baseline_v_bpd, "baseline V bits (default: the allocation's nominal)");
  kvq::cli::add_match(app, o.match);
  app.add_flag("!--no-cuda", o.cuda, "skip the GPU path check (GPU encoder, decoder and fused attention vs the CPU) even when a GPU is present");
  app.add_option("--json", json_out, "write the full report as JSON");
  auto* g = app.add_option_group("Gates (CI)", "exit 1 when a measured figure is past its limit");
  g->add_option("--max-logit-mae", o.max_logit_mae, "overall RoPE-logit MAE at most");
  g->add_option("--max-kl", o.max_kl, "overall mean softmax KL at most");
  g->add_option("--min-top10", o.min_top10, "overall mean top-10 overlap at least");
  g->add_option("--max-nmse-k", o.max_nmse_k, "K reconstruction NMSE at most");
  g->add_option("--max-nmse-v", o.max_nmse_v, "V reconstruction NMSE at most");
  g->add_option("--min-layer-wins", o.min_layer_wins, "layers where the allocation beats the baseline, at least");
  KVQ_CLI_PARSE(app, argc, argv);
  kvq::cli::apply_common(common);
  return kvq::cli::run_main("kvq-verify", [&] {
    kvq::VerifyReport r = kvq::run_verify(o);
    if (!common.quiet) std::fputs(kvq::format_report(r).c_str(), stdout);
    if (!json_out.empty()) kvq::write_file_atomically(json_out, r.to_json().dump(1) + "\n");
    for (const auto& f : r.failed_gates) std::fprintf(stderr, "kvq-verify: gate failed: %s\n", f.c_str());
    return r.failed_gates.empty() ? 0 : 1;
  });
}
