// kvq-generate: load a model, generate greedily from a prompt, and report perplexity on a text.
#include <spdlog/spdlog.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <nlohmann/json.hpp>

#include "kvq/capture/capture.hpp"
#include "kvq/cli/cli.hpp"
#include "kvq/eval/generate.hpp"
#include "kvq/model/model.hpp"
#include "kvq/tokenizer/tokenizer.hpp"
#include "kvq/util/atomic_file.hpp"
#include "kvq/util/error.hpp"

int main(int argc, char** argv) {
  CLI::App app{"kvq-generate: greedy generation and single-window perplexity with the fp32 forward"};
  kvq::cli::Common common;
  kvq::cli::add_common(app, common);
  std::string model_path, tok_path, prompt = "Once upon a time", ppl_text;
  std::string json_out;
  int steps = 32, window = 256;
  std::string load = "auto", max_memory;
  kvq::cli::add_model(app, model_path);
  app.add_option("--load", load,
                 "whole: the whole model in memory; stream: the checkpoint stays mapped and every forward converts one "
                 "layer at a time (each generated token converts every layer again: slow, little memory); "
                 "auto: whole when the model (in --precision) fits --max-memory, else stream (logged)")
      ->default_val("auto")
      ->check(CLI::IsMember({"auto", "whole", "stream"}));
  app.add_option("--max-memory", max_memory,
                 "memory the model may take with --load whole/auto (6G, 1500M, bytes; default 80% of the "
                 "available memory)");
  app.add_option("--tokenizer", tok_path, "tokenizer file (default: the model's own)");
  app.add_option("--prompt", prompt, "prompt text (BOS is prepended where the tokenizer adds one)")->default_val(prompt);
  app.add_option("--steps", steps, "tokens to generate")->default_val(32)->check(CLI::Range(0, 1 << 16));
  // Checked at parse time: a missing file or a directory fails before the generation runs.
  app.add_option("--ppl-text", ppl_text, "text file: perplexity of [BOS] + its first tokens, --window in all (BOS where the tokenizer adds one)")
      ->check(CLI::ExistingFile);
  app.add_option("--window", window, "perplexity window in tokens, BOS included")->default_val(257)
      ->check(CLI::Range(2, 1 << 20));
  app.add_option("--json", json_out,
                 "write {prompt_ids, generated_ids, last_top10 (the prompt's last position: id, logit), "
                 "ppl_window_tokens, ppl_mean_nll} as JSON (atomically)");
  std::string precision;
  kvq::cli::add_precision(app, precision);
  KVQ_CLI_PARSE(app, argc, argv);
  kvq::cli::apply_common(common);
  return kvq::cli::run_main("kvq-generate", [&] {
    kvq::set_threads(common.threads);
    const kvq::Precision prec = kvq::resolve_precision(precision);
    // The whole model (in the forward's precision) is checked against the memory before it is loaded:
    // a model that does not fit is refused (whole) or streamed (auto), never killed by the kernel half-way.
    const int64_t need = kvq::Model::whole_bytes(model_path, prec);
    const int64_t budget =
        max_memory.empty() ? kvq::default_memory_budget() : kvq::parse_memory_size(max_memory, "--max-memory");
    auto gib = [](int64_t b) {
      char buf[32];
      if (b < (int64_t(1) << 30)) std::snprintf(buf, sizeof buf, "%.1f MiB", double(b) / double(int64_t(1) << 20));
      else std::snprintf(buf, sizeof buf, "%.2f GiB", double(b) / double(int64_t(1) << 30));
      return std::string(buf);
    };
    bool stream = load == "stream";
    if (!stream && need > budget) {
      const std::string why = "the model takes " + gib(need) + " in " + kvq::precision_name(prec) + ", more than the " +
                              gib(budget) + " " +
                              (max_memory.empty() ? "(80% of the available memory)" : "--max-memory allows");
      if (load == "whole") throw kvq::Error(model_path, "--load", "whole: " + why + "; --load stream converts one layer at a time");
      spdlog::warn("{}: {}: streaming the layers (--load stream; every token converts each layer again)", model_path, why);
      stream = true;
    }
    kvq::Model m = kvq::Model::load(model_path, kvq::Model::LoadOptions{stream, prec});
    spdlog::info("forward precision {}", kvq::precision_name(prec));
    auto tok = kvq::Tokenizer::load(tok_path.empty()
                                        ? kvq::Tokenizer::default_path_for_model(model_path, m.config().vocab_size)
                                        : tok_path);
    std::vector<int64_t> ids;
    for (int t : tok->encode_with_bos(prompt)) ids.push_back(t);  // BOS where the tokenizer adds one
    auto t0 = std::chrono::steady_clock::now();
    auto out = kvq::greedy_generate(m, ids, steps);
    double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::vector<int> gen(out.begin(), out.end());
    std::printf("prompt: %s\ngenerated (%d tokens, %.2f s): %s\n", prompt.c_str(), int(out.size()), secs,
                tok->decode(gen).c_str());
    nlohmann::json report = {{"model", model_path}, {"tokenizer", tok->path()}, {"tokenizer_sha256", tok->sha256()},
                             {"prompt", prompt}, {"prompt_ids", ids}, {"generated_ids", out}};
    nlohmann::json top = nlohmann::json::array();
    if (!json_out.empty())
      for (const auto& t : kvq::last_top_logits(m, ids, 10)) top.push_back({{"id", t.id}, {"logit", t.logit}});
    report["last_top10"] = top;
    if (!ppl_text.empty()) {
      std::string text = kvq::read_file(ppl_text);
      auto enc = tok->encode(text);
      std::vector<int64_t> w;
      for (int t : tok->prefix_ids()) w.push_back(t);  // BOS, nothing, or GLM's [gMASK] <sop>
      for (size_t i = 0; i < enc.size() && int(w.size()) < window; ++i) w.push_back(enc[i]);
      if (int(w.size()) > m.config().max_seq_len)
        throw kvq::Error(ppl_text, "--window", "longer than the model's maximum " + std::to_string(m.config().max_seq_len));
      double nll = kvq::window_nll(m, w);
      std::printf("perplexity on %s (%d tokens, one causal window): %.4f (mean NLL %.5f nats)\n", ppl_text.c_str(),
                  int(w.size()), std::exp(nll), nll);
      report["ppl_text"] = ppl_text;
      report["ppl_window_tokens"] = w.size();
      report["ppl_mean_nll"] = nll;
    }
    if (!json_out.empty()) kvq::write_file_atomically(json_out, report.dump(1) + "\n");
    return 0;
  });
}
