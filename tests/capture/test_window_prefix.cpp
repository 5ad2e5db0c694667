// Every calibration window starts with the tokenizer's prefix (Llama [BOS], Qwen nothing, GLM-4
// [gMASK] <sop>), recorded in the provenance as window_prefix, and kvq-eval's windows start with
// the recorded one. Independent truth: a GLM-4 tiktoken tokenizer written here, whose ranks are the
// 256 single bytes (so the token stream is the corpus's bytes) and whose tokenizer_config.json puts
// [gMASK] and <sop> at the ids GLM-4 has relative to <|endoftext|> (151329 + 2, + 4); the demo
// model's SentencePiece BOS (1); the golden version-3 file made before the prefix was recorded.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "kvq/corpus/corpus.hpp"
#include "kvq/io/calib_file.hpp"
#include "kvq/util/error.hpp"
#include "run_cmd.hpp"
#include "shared_data.hpp"

using namespace kvq;
namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

// GLM-4's specials start at <|endoftext|> 151329; here at 256, right after the byte ranks.
constexpr int kEndOfText = 256, kGmask = 258, kSop = 260;

std::string b64(const std::string& s) {  // RFC 4648, for the ranks file
  static const char* abc = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::string o;
  uint32_t v = 0;
  int bits = 0;
  for (unsigned char c : s) {
    v = (v << 8) | c;
    bits += 8;
    while (bits >= 6) o.push_back(abc[(v >> (bits -= 6)) & 63]);
  }
  if (bits > 0) o.push_back(abc[(v << (6 - bits)) & 63]);
  while (o.size() % 4) o.push_back('=');
  return o;
}

// A corpus of `n` printable ASCII bytes with no special-token strings in it.
std::string corpus_text(size_t n, int salt) {
  std::string s;
  for (size_t i = 0; s.size() < n; ++i)
    s += "line " + std::to_string(i * 7 + size_t(salt)) + " of the kvq glm corpus, word" + std::to_string(i % 13) + ".\n";
  s.resize(n - 1);
  return s + "\n";
}

// kvq-make-tiny-hf --family chatglm, its tokenizer.json replaced by a GLM-4 tiktoken
// tokenizer.model (what the chatglm checkpoints ship) and tokenizer_config.json.
std::string tiny_chatglm() {
  const std::string dir = test::temp_path("glm_model");
  fs::remove_all(dir);
  auto r = test::run_cmd(std::string(KVQ_MAKE_TINY_HF) + " --family chatglm --layers 2 --seed 5 --out " + dir);
  EXPECT_EQ(r.status, 0) << r.err;
  fs::remove(dir + "/tokenizer.json");
  std::string ranks;
  for (int b = 0; b < 256; ++b) ranks += b64(std::string(1, char(b))) + " " + std::to_string(b) + "\n";
  test::write_text(dir + "/tokenizer.model", ranks);
  json added = json::object();
  const char* names[] = {"<|endoftext|>", "[MASK]", "[gMASK]", "[sMASK]", "<sop>", "<eop>"};
  for (int i = 0; i < 6; ++i)
    added[std::to_string(kEndOfText + i)] = {{"content", names[i]}, {"special", true}};
  test::write_text(dir + "/tokenizer_config.json",
                   json{{"added_tokens_decoder", added}, {"eos_token", "<|endoftext|>"},
                        {"tokenizer_class", "ChatGLM4Tokenizer"}}
                       .dump());
  return dir;
}

std::string capture_cmd(const std::string& model, const std::string& corpus, const std::string& out,
                        const std::string& extra) {
  return "SOURCE_DATE_EPOCH=0 " + test::bin("calib-capture") + " -q --threads 1 --model " + model + " --corpus " +
         corpus + " --samples 6 --holdout 2 --seq-len 24 --reservoir-tokens 16 --seed 4 --out " + out + " " + extra;
}

}  // namespace

TEST(WindowPrefix, ChatglmCaptureStartsEveryWindowWithGmaskSop) {
  const std::string model = tiny_chatglm();
  const std::string corpus = test::temp_path("glm_corpus.txt"), out = test::temp_path("glm.kvqcal.h5");
  const std::string bytes = corpus_text(2000, 0);
  test::write_text(corpus, bytes);
  auto r = test::run_cmd(capture_cmd(model, corpus, out, ""));
  ASSERT_EQ(r.status, 0) << r.err;
  const CalibFile c = read_calib(out, true);
  ASSERT_TRUE(c.prov.window_prefix.has_value());
  EXPECT_EQ(*c.prov.window_prefix, (std::vector<int>{kGmask, kSop}));
  EXPECT_FALSE(c.prov.window_bos);
  EXPECT_EQ(c.prov.n_tokens_corpus, int64_t(bytes.size()));  // one token per byte: no merges
  const int64_t T = 24, slot = T - 2;
  ASSERT_EQ(c.holdout.windows, 2);
  ASSERT_EQ(c.holdout_offsets.size(), 2u);
  for (int w = 0; w < 2; ++w) {
    const int64_t off = c.holdout_offsets[size_t(w)];
    const int64_t* ids = c.holdout.ids.data() + w * T;
    EXPECT_EQ(ids[0], kGmask) << "held-out window " << w;
    EXPECT_EQ(ids[1], kSop) << "held-out window " << w;
    for (int64_t t = 2; t < T; ++t)
      ASSERT_EQ(ids[t], int64_t(uint8_t(bytes[size_t(off + t - 2)]))) << "window " << w << " position " << t;
  }
  // Every window holds T - 2 corpus tokens: slots of 22, none overlapping, all inside the corpus.
  std::vector<int64_t> all = c.calib_offsets;
  all.insert(all.end(), c.holdout_offsets.begin(), c.holdout_offsets.end());
  std::sort(all.begin(), all.end());
  for (size_t i = 0; i < all.size(); ++i) {
    EXPECT_EQ(all[i] % slot, 0) << all[i];
    EXPECT_LE(all[i] + slot, int64_t(bytes.size()));
    if (i > 0) {
      EXPECT_GT(all[i], all[i - 1]);
    }
  }

  // --resume of the finished file plans the same windows; a file recording another prefix is refused.
  r = test::run_cmd(capture_cmd(model, corpus, out, "--resume"));
  EXPECT_EQ(r.status, 0) << r.err;
  CalibFile other = c;
  other.prov.window_prefix = std::vector<int>{kGmask};
  const std::string part = test::temp_path("glm_other.kvqcal.h5");
  write_calib(part, other);
  r = test::run_cmd(capture_cmd(model, corpus, part, "--resume"));
  EXPECT_EQ(r.status, 2) << r.err;
  EXPECT_NE(r.err.find("provenance.window_prefix"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("[258]"), std::string::npos) << r.err;

  // kvq-eval over the same model: windows [gMASK] <sop> + text, every text token scored once.
  const std::string alloc = test::temp_path("glm.kvqalloc.h5"), text = test::temp_path("glm_text.txt"),
                    report = test::temp_path("glm_eval.json");
  std::string held;  // another template: no 32-token run shared with the corpus
  for (int i = 0; held.size() < 300; ++i) held += "Held-out remark #" + std::to_string(i) + ": quite different prose. ";
  held.resize(300);
  test::write_text(text, held);
  r = test::run_cmd(test::bin("kvq-allocate") + " -q --threads 1 --calib " + out + " --method uniform --bpd 4 --out " + alloc);
  ASSERT_EQ(r.status, 0) << r.err;
  r = test::run_cmd(test::bin("kvq-eval") + " -q --threads 1 --model " + model + " --alloc " + alloc + " --calib " + out +
                    " --text " + text + " --window 16 --stride 8 --baseline none --json " + report);
  ASSERT_EQ(r.status, 0) << r.err;
  const json j = json::parse(std::ifstream(report));
  const int64_t n = int64_t(held.size());
  EXPECT_EQ(j["text_tokens"].get<int64_t>(), n);
  // Window k is [gMASK] <sop> + text [8k, min(8k + 14, n)); the last one ends at n.
  int64_t windows = 0, forward_tokens = 0;
  for (int64_t b = 0;; b += 8) {
    const int64_t e = std::min<int64_t>(b + 14, n);
    ++windows;
    forward_tokens += 2 + (e - b) - 1;
    if (e == n) break;
  }
  ASSERT_EQ(j["rows"].size(), 2u);
  for (const auto& row : j["rows"]) {
    EXPECT_EQ(row["tokens"].get<int64_t>(), n) << row["name"];  // the prefix gives the first token a context
    EXPECT_EQ(row["windows"].get<int64_t>(), windows) << row["name"];
    EXPECT_EQ(row["forward_tokens"].get<int64_t>(), forward_tokens) << row["name"];
  }
  for (const auto& p : {corpus, out, part, alloc, text, report}) fs::remove(p);
  fs::remove_all(model);
}

// Qwen's tokenizer adds nothing (window_prefix []); the demo Llama's adds its BOS (1), and its
// windows are what they were before the prefix was recorded.
TEST(WindowPrefix, QwenEmptyLlamaBos) {
  const std::string corpus = test::temp_path("q_corpus.txt"), out = test::temp_path("q.kvqcal.h5");
  const std::string bytes = corpus_text(3000, 1);
  test::write_text(corpus, bytes);
  const std::string qwen = test::temp_path("qwen_model");
  fs::remove_all(qwen);
  auto r = test::run_cmd(std::string(KVQ_MAKE_TINY_HF) + " --family qwen2 --layers 1 --out " + qwen);
  ASSERT_EQ(r.status, 0) << r.err;
  r = test::run_cmd(capture_cmd(qwen, corpus, out, ""));
  ASSERT_EQ(r.status, 0) << r.err;
  CalibFile c = read_calib(out, true);
  ASSERT_TRUE(c.prov.window_prefix.has_value());
  EXPECT_TRUE(c.prov.window_prefix->empty());
  EXPECT_FALSE(c.prov.window_bos);
  for (int64_t off : c.calib_offsets) EXPECT_EQ(off % 24, 0);

  KVQ_REQUIRE_SHARED("models/kvq-demo-llama/config.json");
  r = test::run_cmd(capture_cmd(test::shared_path("models/kvq-demo-llama"), corpus, out, ""));
  ASSERT_EQ(r.status, 0) << r.err;
  c = read_calib(out, true);
  ASSERT_TRUE(c.prov.window_prefix.has_value());
  EXPECT_EQ(*c.prov.window_prefix, (std::vector<int>{1}));
  EXPECT_TRUE(c.prov.window_bos);
  for (int w = 0; w < c.holdout.windows; ++w) EXPECT_EQ(c.holdout.ids[size_t(w) * 24], 1);
  // The plan a BOS gave before: slots of T - 1.
  const WindowPlan before = plan_windows(c.prov.n_tokens_corpus, 24, 6, 2, 4, {1}, "c");
  EXPECT_EQ(c.calib_offsets, before.calib);
  EXPECT_EQ(c.holdout_offsets, before.holdout);
  for (int64_t off : before.calib) EXPECT_EQ(off % 23, 0);
  for (const auto& p : {corpus, out}) fs::remove(p);
  fs::remove_all(qwen);
}

// The golden version-3 file (calib-capture before the prefix was recorded, demo model, BOS 1):
// it reads without window_prefix, its prefix is [BOS] by window_bos, and the windows it records
// are the ones the planner gives for that prefix.
TEST(WindowPrefix, OldFileReadsWithItsBosWindows) {
  const std::string g = std::string(KVQ_SOURCE_DIR) + "/data/golden/calib-v3.kvqcal.h5";
  const CalibFile c = read_calib(g, true);
  EXPECT_FALSE(c.prov.window_prefix.has_value());
  EXPECT_TRUE(c.prov.window_bos);
  EXPECT_EQ(c.prov.window_prefix_size(), 1u);
  EXPECT_EQ(c.prov.window_prefix_or(1), (std::vector<int>{1}));
  ASSERT_GT(c.holdout.windows, 0);
  for (int w = 0; w < c.holdout.windows; ++w) EXPECT_EQ(c.holdout.ids[size_t(w) * size_t(c.prov.seq_len)], 1);
  const WindowPlan p = plan_windows(c.prov.n_tokens_corpus, c.prov.seq_len, c.prov.samples, c.prov.holdout,
                                    c.prov.seed, c.prov.window_prefix_or(1), "golden");
  EXPECT_EQ(p.calib, c.calib_offsets);
  EXPECT_EQ(p.holdout, c.holdout_offsets);
  // Written again, it stays without the field (nothing is invented for it).
  const std::string copy = test::temp_path("v3copy.kvqcal.h5");
  write_calib(copy, c);
  EXPECT_FALSE(read_calib(copy, false).prov.window_prefix.has_value());
  fs::remove(copy);
}

TEST(WindowPrefix, ProvenanceFieldRoundTripAndBadValues) {
  const CalibFile g = read_calib(std::string(KVQ_SOURCE_DIR) + "/data/golden/calib-v3.kvqcal.h5", false);
  CalibProvenance p = g.prov;
  p.window_prefix = std::vector<int>{kGmask, kSop};
  const std::string text = provenance_to_json(p);
  EXPECT_EQ(json::parse(text)["window_prefix"], json::array({kGmask, kSop}));
  EXPECT_EQ(provenance_from_json("f", text).window_prefix, p.window_prefix);
  p.window_prefix = std::vector<int>{};
  EXPECT_EQ(provenance_from_json("f", provenance_to_json(p)).window_prefix, std::vector<int>{});
  struct Bad {
    json value;
    const char* says;
  };
  for (const Bad& b : {Bad{json("[gMASK]"), "not an array"}, Bad{json::array({1, -3}), "negative"},
                       Bad{json::array({1.5}), "not an integer"}, Bad{json::array({int64_t(1) << 40}), "not an integer"},
                       Bad{json(std::vector<int>(size_t(g.prov.seq_len), 7)), "no corpus token"}}) {
    json j = json::parse(text);
    j["window_prefix"] = b.value;
    try {
      provenance_from_json("cal.h5", j.dump());
      ADD_FAILURE() << "accepted " << b.value.dump();
    } catch (const Error& e) {
      const std::string m = e.what();
      EXPECT_NE(m.find("cal.h5"), std::string::npos) << m;
      EXPECT_NE(m.find("provenance.window_prefix"), std::string::npos) << m;
      EXPECT_NE(m.find(b.says), std::string::npos) << m;
    }
  }
}
