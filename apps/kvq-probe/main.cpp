// kvq-probe: what coding each layer's KV cache does to the model's output, measured on its own forward.
#include <cstdio>

#include "kvq/cli/cli.hpp"
#include "kvq/eval/probe.hpp"
#include "kvq/model/model.hpp"
#include "kvq/util/atomic_file.hpp"

int main(int argc, char** argv) {
  CLI::App app{
      "kvq-probe: for each layer and each candidate coding of its KV cache, the model's forward over the\n"
      "calibration windows with only that layer's K and V coded by the real codec, against the unquantized\n"
      "forward: the mean KL of the next-token distributions and the change in NLL. The unquantized\n"
      "forward's residual stream at each layer's input is reused, so a layer's probe runs only the layers\n"
      "after it. The file feeds kvq-allocate --probe.\n"
      "  kvq-probe --model M --calib cal.kvqcal.h5 --candidates vllm-turboquant --out p.kvqprobe.json\n"
      "  kvq-allocate --calib cal.kvqcal.h5 --method vllm-turboquant --probe p.kvqprobe.json --max-kl 0.02 --out a.kvqalloc.h5\n"
      "Candidates vllm-turboquant: vLLM's four TurboQuant presets and the layer kept in BF16. Candidates\n"
      "allocation (--alloc A): A's own coding layer by layer and every layer at once (the composite KL\n"
      "beside the sum of the layers': how additive the errors are)."};
  kvq::cli::Common common;
  kvq::cli::add_common(app, common);
  kvq::ProbeRunOptions o;
  std::string out;
  kvq::cli::add_model(app, o.model);
  kvq::cli::add_calib(app, o.calib);
  app.add_option("--candidates", o.candidates,
                 "the codings to probe: vllm-turboquant (vLLM's four presets and the layer kept in BF16), or "
                 "allocation (the allocation --alloc names, layer by layer and every layer at once)")
      ->default_val(o.candidates)
      ->check(CLI::IsMember({"vllm-turboquant", "allocation"}));
  app.add_option("--alloc", o.alloc, "with --candidates allocation: the allocation file (made from --calib)");
  app.add_option("--windows", o.windows, "calibration windows to run (the first N; more: a steadier figure, a longer run)")
      ->default_val(o.windows)
      ->check(CLI::Range(1, 1 << 20));
  std::string load = "whole";
  app.add_option("--load", load, "whole: the whole model in memory; stream: each forward converts one layer at a time")
      ->default_val("whole")
      ->check(CLI::IsMember({"whole", "stream"}))
      ->each([&](const std::string& v) { o.stream = v == "stream"; });
  kvq::cli::add_out(app, out, "the probe file (.kvqprobe.json, schemas/probe.schema.json), written atomically");
  std::string precision;
  kvq::cli::add_precision(app, precision);
  KVQ_CLI_PARSE(app, argc, argv);
  kvq::cli::apply_common(common);
  o.quiet = common.quiet;
  return kvq::cli::run_main("kvq-probe", [&] {
    kvq::set_threads(common.threads);
    o.precision = kvq::resolve_precision(precision);
    kvq::OutputBatch outputs;
    const kvq::ProbeFile p = kvq::run_probe(o);
    kvq::write_file_atomically(out, kvq::probe_json(p).dump(1) + "\n");
    outputs.commit();
    if (!common.quiet) {
      std::printf("kvq-probe: %d windows x %d tokens, %lld layer forwards in %.1f s; mean KL per layer:\n", p.windows,
                  p.seq_len, static_cast<long long>(p.layer_forwards), p.seconds);
      std::printf("  %-20s", "layer");
      for (int l = 0; l < p.n_layers; ++l) std::printf(" %9d", l);
      std::printf("\n");
      double sum = 0;
      for (const auto& s : p.settings) {
        std::printf("  %-20s", s.name.c_str());
        for (double v : s.kl) std::printf(" %9.3g", v), sum += v;
        std::printf("\n");
      }
      if (p.has_composite)
        std::printf("  every layer at once: KL %.4g, dNLL %.4g; the layers' sum %.4g: additivity ratio %.3f\n",
                    p.composite_kl, p.composite_dnll, sum, sum > 0 ? p.composite_kl / sum : 0.0);
    }
    return 0;
  });
}
