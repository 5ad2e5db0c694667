// calib-capture: corpus -> streaming statistics in a versioned HDF5 calibration file.
#include <spdlog/spdlog.h>

#include "kvq/capture/capture.hpp"
#include "kvq/cli/cli.hpp"
#include "kvq/model/model.hpp"
#include "kvq/util/error.hpp"

int main(int argc, char** argv) {
  kvq::Ranks ranks(&argc, &argv);  // MPI only under mpirun: then the windows are sharded over the ranks
  CLI::App app{
      "calib-capture: run a model over a calibration corpus and write the per-(layer, KV head) fp64 moment\n"
      "sums, a bounded reservoir of token rows and whole held-out windows to a calibration file.\n"
      "  calib-capture --model M --corpus TEXT --out cal.kvqcal.h5 [--samples N --seq-len T ...]\n"
      "  calib-capture merge A.kvqcal.h5 B.kvqcal.h5 --out AB.kvqcal.h5\n"
      "  mpirun -n N calib-capture ... (windows sharded over N ranks; rank 0 writes the file)"};
  kvq::cli::Common common;
  kvq::cli::add_common(app, common);
  kvq::CaptureOptions o;
  std::string windows;
  app.add_option("--model", o.model, "model: HF directory (config.json + safetensors) or llama2.c .bin");
  app.add_option("--tokenizer", o.tokenizer, "tokenizer file (default: the model's own)");
  app.add_option("--corpus", o.corpus, "UTF-8 text files or folders (repeatable)")
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll);
  app.add_flag("--lossy-utf8", o.lossy_utf8, "replace invalid UTF-8 bytes (counted, warned) instead of failing");
  app.add_option("--special-tokens", o.special_tokens,
                 "special: special-token strings in the corpus (e.g. <|begin_of_text|>) become their ids, as Hugging "
                 "Face does (counted in the provenance, warned); text: they are encoded as plain text")
      ->default_val("special")
      ->check(CLI::IsMember({"special", "text"}));
  app.add_option("--samples", o.samples, "calibration windows")->default_val(64)->check(CLI::Range(1, 1 << 24));
  app.add_option("--seq-len", o.seq_len, "tokens per window, BOS first")->default_val(256)->check(CLI::Range(2, 1 << 20));
  app.add_option("--holdout", o.holdout, "held-out windows kept whole for kvq-verify (not in the statistics)")
      ->default_val(4)->check(CLI::Range(0, 1 << 20));
  app.add_option("--batch", o.batch_size, "windows per forward batch (fixed for resume)")->default_val(4)
      ->check(CLI::Range(1, 4096));
  app.add_option("--reservoir-tokens", o.reservoir_tokens, "token rows kept for measured distortion")
      ->default_val(4096)->check(CLI::Range(0, 1 << 24));
  kvq::cli::add_seed(app, o.seed);
  app.add_option("--checkpoint-every", o.checkpoint_every, "write a consistent file every K windows (0 = never)")
      ->default_val(0)->check(CLI::NonNegativeNumber);
  app.add_flag("--resume", o.resume, "continue the file at --out from its last committed window");
  app.add_option("--windows", windows, "only calibration windows BEGIN:END of the plan (to merge later)");
  app.add_option("-o,--out", o.out, "output calibration file (.kvqcal.h5), written atomically");
  std::string load = "stream", max_memory, precision;
  kvq::cli::add_precision(app, precision);
  auto* mem = app.add_option_group("Memory", "the layer-streamed forward (the statistics are the same bytes)");
  mem->add_option("--load", load,
                  "stream: the checkpoint stays mapped in its stored dtype, windows pass each layer in chunks "
                  "(one layer at a time in the forward's precision); whole: the whole model in memory, one forward "
                  "per batch")
      ->default_val("stream")
      ->check(CLI::IsMember({"stream", "whole"}));
  mem->add_option("--max-memory", max_memory,
                  "memory the streamed forward plans for (6G, 1500M, bytes; default 80% of the available); "
                  "sets the chunk size (the plan is logged at the start)");
  mem->add_option("--chunk", o.chunk_windows, "windows per chunk (a multiple of --batch; default: what fits)")
      ->check(CLI::NonNegativeNumber);
  mem->add_flag("--spill", o.spill, "keep the chunk's hidden states in a temporary file even when they fit");
  mem->add_option("--tmp-dir", o.tmp_dir,
                  "directory for the streamed capture's temporary files (payload, spill; unlinked at once, their "
                  "space reserved up front), e.g. a scratch disk (default: beside --out)");

  auto* merge = app.add_subcommand("merge", "add the statistics of calibration files over disjoint windows");
  std::vector<std::string> inputs;
  std::string merge_out;
  merge->add_option("inputs", inputs, "calibration files (2 or more)")
      ->required()
      ->expected(2, 1 << 16)
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll);
  merge->add_option("-o,--out", merge_out, "merged calibration file")->required();
  KVQ_CLI_PARSE(app, argc, argv);
  kvq::cli::apply_common(common);
  if (ranks.rank() != 0 && common.verbose == 0 && !common.quiet) spdlog::set_level(spdlog::level::warn);  // rank 0 narrates

  const int rc = kvq::cli::run_main("calib-capture", [&] {
    if (merge->parsed()) {
      if (ranks.rank() != 0) return 0;  // a merge is one process's job
      kvq::CalibFile m = kvq::read_calib(inputs[0], true);
      for (size_t i = 1; i < inputs.size(); ++i)
        m = kvq::merge_calib(m, inputs[0], kvq::read_calib(inputs[i], true), inputs[i]);
      kvq::write_calib(merge_out, m);
      spdlog::info("merged {} files ({} windows) into {}", inputs.size(), m.windows_done, merge_out);
      return 0;
    }
    if (o.model.empty()) throw kvq::Error("", "--model", "required");
    if (o.corpus.empty()) throw kvq::Error("", "--corpus", "required");
    if (o.out.empty()) throw kvq::Error("", "--out", "required");
    o.stream = load == "stream";
    if (!max_memory.empty()) o.max_memory = kvq::parse_memory_size(max_memory, "--max-memory");
    if (!o.stream && (o.chunk_windows > 0 || o.spill || !max_memory.empty()))
      throw kvq::Error("", "--load", "whole does not stream: --max-memory, --chunk and --spill need --load stream");
    if (!windows.empty()) {
      auto colon = windows.find(':');
      if (colon == std::string::npos) throw kvq::Error("", "--windows", "expected BEGIN:END, got '" + windows + "'");
      try {
        o.window_begin = std::stoll(windows.substr(0, colon));
        o.window_end = std::stoll(windows.substr(colon + 1));
      } catch (const std::exception&) {
        throw kvq::Error("", "--windows", "expected BEGIN:END, got '" + windows + "'");
      }
    }
    o.quiet = common.quiet;
    o.precision = kvq::resolve_precision(precision);
    kvq::set_threads(common.threads);
    try {
      kvq::run_capture(o, &ranks);
    } catch (const kvq::ReportedByRankZero&) {
      return 2;
    }
    return 0;
  }, /*exit_on_error=*/false);
  return kvq::cli::leave(ranks.finish(rc));
}
