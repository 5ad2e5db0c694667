// kvq-generate: load a model, generate greedily from a prompt, and report perplexity on a text.
#include <spdlog/spdlog.h>

#include <chrono>
#include <cmath>
#include <cstdio>

#include "kvq/cli/cli.hpp"
#include "kvq/eval/generate.hpp"
#include "kvq/model/model.hpp"
#include "kvq/model/tokenizer.hpp"
#include "kvq/util/atomic_file.hpp"
#include "kvq/util/error.hpp"

int main(int argc, char** argv) {
  CLI::App app{"kvq-generate: greedy generation and single-window perplexity with the fp32 forward"};
  kvq::cli::Common common;
  kvq::cli::add_common(app, common);
  std::string model_path, tok_path, prompt = "Once upon a time", ppl_text;
  int steps = 32, window = 256;
  kvq::cli::add_model(app, model_path);
  app.add_option("--tokenizer", tok_path, "tokenizer file (default: the model's own)");
  app.add_option("--prompt", prompt, "prompt text (BOS is prepended)")->default_val(prompt);
  app.add_option("--steps", steps, "tokens to generate")->default_val(32)->check(CLI::Range(0, 1 << 16));
  app.add_option("--ppl-text", ppl_text, "text file: perplexity of [BOS] + its first --window-1 tokens");
  app.add_option("--window", window, "perplexity window in tokens, BOS included")->default_val(257)
      ->check(CLI::Range(2, 1 << 20));
  CLI11_PARSE(app, argc, argv);
  kvq::cli::apply_common(common);
  return kvq::cli::run_main("kvq-generate", [&] {
    kvq::set_threads(common.threads);
    kvq::Model m = kvq::Model::load(model_path);
    auto tok = kvq::Tokenizer::load(tok_path.empty()
                                        ? kvq::Tokenizer::default_path_for_model(model_path, m.config().vocab_size)
                                        : tok_path);
    std::vector<int64_t> ids{tok->bos_id()};
    for (int t : tok->encode(prompt)) ids.push_back(t);
    auto t0 = std::chrono::steady_clock::now();
    auto out = kvq::greedy_generate(m, ids, steps);
    double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::vector<int> gen(out.begin(), out.end());
    std::printf("prompt: %s\ngenerated (%d tokens, %.2f s): %s\n", prompt.c_str(), int(out.size()), secs,
                tok->decode(gen).c_str());
    if (!ppl_text.empty()) {
      std::string text = kvq::read_file(ppl_text);
      auto enc = tok->encode(text);
      std::vector<int64_t> w{tok->bos_id()};
      for (size_t i = 0; i < enc.size() && int(w.size()) < window; ++i) w.push_back(enc[i]);
      if (int(w.size()) > m.config().max_seq_len)
        throw kvq::Error(ppl_text, "--window", "longer than the model's maximum " + std::to_string(m.config().max_seq_len));
      double nll = kvq::window_nll(m, w);
      std::printf("perplexity on %s (%d tokens, one causal window): %.4f (mean NLL %.5f nats)\n", ppl_text.c_str(),
                  int(w.size()), std::exp(nll), nll);
    }
    return 0;
  });
}
