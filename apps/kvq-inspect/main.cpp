// kvq-inspect: look at a calibration or allocation file, or compare two allocations.
#include <cstdio>

#include "kvq/cli/cli.hpp"
#include "kvq/util/atomic_file.hpp"
#include "kvq/report/inspect.hpp"

int main(int argc, char** argv) {
  CLI::App app{
      "kvq-inspect: summarise a calibration file (provenance, token counts, RoPE-block energy spread) or an\n"
      "allocation file (budget, allocator fingerprint, per-head rank/bits, distortion spread before/after C2);\n"
      "with two allocations of one model, the bits moved per layer.\n"
      "  kvq-inspect a.kvqalloc.h5 --plots figs/ --layer 2 --head 0\n"
      "  kvq-inspect cal.kvqcal.h5 --json cal.json --csv cal.csv\n"
      "  kvq-inspect uniform.kvqalloc.h5 block-gtq.kvqalloc.h5"};
  kvq::cli::Common common;
  kvq::cli::add_common(app, common);
  kvq::report::InspectOptions o;
  app.add_option("FILE", o.files, "a .kvqcal.h5, .kvqalloc.h5 or .kvqprobe.json (kvq-probe) file; two .kvqalloc.h5 files compare them (A B)")
      ->required()
      ->expected(1, 2)
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll);
  // Optional here (unlike the other tools): an allocation records its calibration's path.
  app.add_option("--calib", o.calib,
                 "calibration file (.kvqcal.h5) for an allocation's energy/eigen figures and before-C2 distortions "
                 "(default: the path the allocation records, if it exists)");
  app.add_option("--json", o.json_out,
                 "write JSON: an allocation's manifest (schemas/allocation-manifest.schema.json; a vllm-turboquant one with "
                 "summary.vllm_turboquant: preset, kept layers, the key codebook's centroids), else the summary "
                 "(schemas/inspect-summary.schema.json)");
  app.add_option("--csv", o.csv_out, "write the main table as CSV; further tables beside it as <stem>.<table>.csv");
  app.add_option("--plots", o.plots_dir, "write figures (PNG + SVG) into this directory");
  app.add_option("--layer", o.layer, "layer of the energy and eigenvalue figures")->default_val(0)->check(CLI::Range(0, 1 << 20));
  app.add_option("--head", o.head, "KV head of the energy and eigenvalue figures")->default_val(0)->check(CLI::Range(0, 1 << 20));
  KVQ_CLI_PARSE(app, argc, argv);
  kvq::cli::apply_common(common);
  o.summary = !common.quiet;
  return kvq::cli::run_main("kvq-inspect", [&] {
    kvq::OutputBatch outputs;  // --json, --csv and every plot together, or none
    auto r = kvq::report::run_inspect(o, stdout);
    outputs.commit();
    for (const auto& n : r.notes)
      if (!common.quiet) std::fprintf(stderr, "kvq-inspect: note: %s\n", n.c_str());
    for (const auto& f : r.written)
      if (!common.quiet) std::fprintf(stderr, "kvq-inspect: wrote %s\n", f.c_str());
    return 0;
  });
}
