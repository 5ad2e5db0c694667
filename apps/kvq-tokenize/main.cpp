// kvq-tokenize: the ids a model's tokenizer gives a text, with the model's BOS rule, as
// llama.cpp's llama-tokenize does; for checking a tokenizer by hand.
#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "kvq/cli/cli.hpp"
#include "kvq/model/llama2c.hpp"
#include "kvq/tokenizer/tokenizer.hpp"
#include "kvq/util/atomic_file.hpp"
#include "kvq/util/error.hpp"

int main(int argc, char** argv) {
  CLI::App app{
      "kvq-tokenize: print the token ids of a text under the model's tokenizer (tokenizer.json, SentencePiece "
      "tokenizer.model or llama2.c tokenizer.bin), the model's BOS rule applied"};
  kvq::cli::Common common;
  kvq::cli::add_common(app, common);
  std::string model_path, tok_path, text_file, text_string, json_out, special = "special";
  bool no_bos = false;
  kvq::cli::add_model(app, model_path);
  app.add_option("--tokenizer", tok_path, "tokenizer file (default: the model's own; tokenizer.json wins over tokenizer.model)");
  // ExistingFile: a directory would otherwise read as an empty text (ifstream opens it on Linux).
  auto* text_opt = app.add_option("--text", text_file, "file whose whole contents are tokenized (bytes as they are)")
                       ->check(CLI::ExistingFile);
  auto* str_opt = app.add_option("--string", text_string, "text given on the command line");
  text_opt->excludes(str_opt);
  app.add_option("--special-tokens", special,
                 "special: special-token strings in the text (e.g. <|begin_of_text|>) become their ids, as Hugging "
                 "Face does; text: they are encoded as ordinary text")
      ->default_val("special")
      ->check(CLI::IsMember({"special", "text"}));
  app.add_flag("--no-bos", no_bos, "do not prepend the BOS even where the model's rule adds one");
  app.add_option("--json", json_out,
                 "write {ids, n_tokens, bos_added, special_tokens_matched, tokenizer_path, tokenizer_sha256} as JSON "
                 "(atomically)");
  app.footer(
      "BOS rule: SentencePiece and llama2.c always prepend BOS; tokenizer.json prepends it when its post-processor "
      "template starts with a special token or tokenizer_config.json beside it sets add_bos_token (Qwen: none); "
      "GLM-4's tiktoken tokenizer.model prepends [gMASK] <sop>; Meta's Llama-3 original/tokenizer.model <|begin_of_text|>.\n"
      "Exit codes: 0 ok, 2 bad input (one line naming file, field and value), 3 internal error.");
  KVQ_CLI_PARSE(app, argc, argv);
  kvq::cli::apply_common(common);
  return kvq::cli::run_main("kvq-tokenize", [&] {
    if (text_file.empty() && str_opt->count() == 0) throw kvq::Error("", "--text/--string", "one of them is required");
    const kvq::SpecialTokens mode = kvq::parse_special_tokens(special);
    if (tok_path.empty()) {
      namespace fs = std::filesystem;
      const fs::path p(model_path);
      // Only a llama2.c .bin needs the model's vocabulary size to find its tok<N>.bin.
      const bool hf = fs::is_directory(p) || p.filename() == "config.json" || p.extension() == ".safetensors" ||
                      p.filename() == "model.safetensors.index.json";
      tok_path = kvq::Tokenizer::default_path_for_model(model_path, hf ? 0 : kvq::llama2c_config(model_path).vocab_size);
    }
    auto tok = kvq::Tokenizer::load(tok_path);
    const std::string text = text_file.empty() ? text_string : kvq::read_file(text_file);
    int matched = 0;
    std::vector<int> ids = no_bos ? tok->encode(text, mode, &matched) : tok->encode_with_bos(text, mode, &matched);
    const bool bos_added = !no_bos && !tok->prefix_ids().empty();  // the BOS, or GLM-4's [gMASK] <sop>
    std::string line;
    for (size_t i = 0; i < ids.size(); ++i) line += (i ? " " : "") + std::to_string(ids[i]);
    std::printf("%s\n", line.c_str());
    if (!common.quiet)
      std::fprintf(stderr, "%zu tokens (BOS %s), %d special-token string(s) matched (--special-tokens %s), tokenizer %s\n",
                 ids.size(), bos_added ? "added" : "not added", matched, kvq::to_string(mode), tok->path().c_str());
    if (!json_out.empty()) {
      nlohmann::json j = {{"ids", ids},
                          {"n_tokens", ids.size()},
                          {"bos_added", bos_added},
                          {"special_tokens_matched", matched},
                          {"special_tokens_mode", kvq::to_string(mode)},
                          {"tokenizer_path", tok->path()},
                          {"tokenizer_sha256", tok->sha256()}};
      kvq::write_file_atomically(json_out, j.dump(1) + "\n");
    }
    return 0;
  });
}
