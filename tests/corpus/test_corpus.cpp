#include <gtest/gtest.h>

#include <set>

#include "kvq/corpus/corpus.hpp"
#include "kvq/util/rng.hpp"
#include "kvq/util/error.hpp"
#include "run_cmd.hpp"

using namespace kvq;

TEST(Utf8, FindsFirstInvalidByte) {
  EXPECT_EQ(find_invalid_utf8("plain ascii"), -1);
  EXPECT_EQ(find_invalid_utf8("caf\xC3\xA9 \xE2\x82\xAC \xF0\x9F\x98\x80"), -1);  // é € 😀
  EXPECT_EQ(find_invalid_utf8("ab\xFFzz"), 2);                 // never valid
  EXPECT_EQ(find_invalid_utf8("abc\xC3"), 3);                  // truncated sequence
  EXPECT_EQ(find_invalid_utf8("x\xC0\xAF"), 1);                // overlong '/'
  EXPECT_EQ(find_invalid_utf8("xy\xED\xA0\x80"), 2);           // UTF-16 surrogate
  EXPECT_EQ(find_invalid_utf8("\xF4\x90\x80\x80"), 0);         // > U+10FFFF
}

TEST(Corpus, InvalidUtf8IsAnErrorNamingFileAndOffset) {
  auto p = test::temp_path("bad.txt");
  test::write_text(p, "In the beginning\xFF God");
  try {
    read_corpus({p}, false);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    std::string m = e.what();
    EXPECT_NE(m.find(p), std::string::npos) << m;
    EXPECT_NE(m.find("offset 16"), std::string::npos) << m;
  }
  auto c = read_corpus({p}, true);
  EXPECT_EQ(c.files[0].replaced_bytes, 1);
  EXPECT_EQ(c.texts[0], "In the beginning\xEF\xBF\xBD God");
}

TEST(Corpus, MissingPathIsAnError) {
  EXPECT_THROW(read_corpus({"/nonexistent/kvq/corpus.txt"}, false), Error);
}

TEST(Windows, SeededDisjointAndRecorded) {
  auto a = plan_windows(100000, 128, 20, 5, 7, {1}, "c");
  auto b = plan_windows(100000, 128, 20, 5, 7, {1}, "c");
  auto c = plan_windows(100000, 128, 20, 5, 8, {1}, "c");
  EXPECT_EQ(a.calib, b.calib);
  EXPECT_NE(a.calib, c.calib);
  std::set<int64_t> s(a.calib.begin(), a.calib.end());
  for (auto h : a.holdout) EXPECT_EQ(s.count(h), 0u) << "held-out window also calibrates";
  s.insert(a.holdout.begin(), a.holdout.end());
  EXPECT_EQ(s.size(), 25u);
  for (auto off : s) {
    EXPECT_EQ(off % 127, 0);  // slot aligned: windows never overlap
    EXPECT_LE(off + 127, 100000);
  }
}

TEST(Windows, BosFirstThenSlot) {
  std::vector<int32_t> stream(1000);
  for (int i = 0; i < 1000; ++i) stream[size_t(i)] = 10 + i;
  auto p = plan_windows(1000, 8, 3, 0, 1, {1}, "c");
  int64_t ids[8];
  window_ids(stream, p, p.calib[0], ids);
  EXPECT_EQ(ids[0], 1);
  for (int t = 1; t < 8; ++t) EXPECT_EQ(ids[t], stream[size_t(p.calib[0] + t - 1)]);
}

// A tokenizer that adds no BOS (Qwen): a window is seq_len stream tokens, slots of seq_len.
TEST(Windows, NoBosWindowIsAllStream) {
  std::vector<int32_t> stream(40);
  for (int i = 0; i < 40; ++i) stream[size_t(i)] = 100 + i;
  const WindowPlan p = plan_windows(40, 8, 4, 1, 3, {}, "c");
  std::set<int64_t> seen;
  for (int64_t off : p.calib) {
    EXPECT_EQ(off % 8, 0);
    EXPECT_TRUE(seen.insert(off).second);
  }
  std::vector<int64_t> w(8);
  window_ids(stream, p, p.calib[0], w.data());
  for (int t = 0; t < 8; ++t) EXPECT_EQ(w[size_t(t)], 100 + p.calib[0] + t);
  EXPECT_THROW(plan_windows(39, 8, 4, 1, 3, {}, "c"), Error);  // 4 slots of 8, 5 needed
}

// GLM-4's tokenizer starts a sequence with [gMASK] <sop> (151331, 151333): a window is those two
// ids + seq_len - 2 stream tokens, slots of seq_len - 2; the same seed and corpus give the same slot
// draw as any other prefix length (only the slot size differs).
TEST(Windows, TwoTokenPrefixThenSlot) {
  std::vector<int32_t> stream(60);
  for (int i = 0; i < 60; ++i) stream[size_t(i)] = 100 + i;
  const WindowPlan p = plan_windows(60, 8, 5, 2, 3, {151331, 151333}, "c");
  EXPECT_EQ(p.slot(), 6);
  std::set<int64_t> seen;
  for (const auto* v : {&p.calib, &p.holdout})
    for (int64_t off : *v) {
      EXPECT_EQ(off % 6, 0);
      EXPECT_LE(off + 6, 60);
      EXPECT_TRUE(seen.insert(off).second);
    }
  std::vector<int64_t> w(8);
  window_ids(stream, p, p.holdout[1], w.data());
  EXPECT_EQ(w[0], 151331);
  EXPECT_EQ(w[1], 151333);
  for (int t = 2; t < 8; ++t) EXPECT_EQ(w[size_t(t)], 100 + p.holdout[1] + t - 2);
  // 60 tokens give 10 slots of 6: 10 windows fit, 11 do not.
  EXPECT_NO_THROW(plan_windows(60, 8, 8, 2, 3, {151331, 151333}, "c"));
  EXPECT_THROW(plan_windows(60, 8, 9, 2, 3, {151331, 151333}, "c"), Error);
  // The prefix must leave room for a corpus token.
  try {
    plan_windows(60, 2, 1, 0, 3, {151331, 151333}, "c");
    ADD_FAILURE() << "a window of 2 took a 2-token prefix";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("--seq-len"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("2-token prefix"), std::string::npos) << e.what();
  }
}

TEST(Windows, TooShortCorpusIsAClearError) {
  try {
    plan_windows(1000, 256, 8, 2, 0, {1}, "tiny.txt");
    FAIL();
  } catch (const Error& e) {
    std::string m = e.what();
    EXPECT_NE(m.find("tiny.txt"), std::string::npos);
    EXPECT_NE(m.find("corpus too short"), std::string::npos) << m;
  }
}

TEST(Rng, UnbiasedBelowAndStateRoundTrip) {
  Rng r(42);
  std::vector<int> hist(6, 0);
  for (int i = 0; i < 60000; ++i) ++hist[size_t(r.below(6))];
  for (int h : hist) EXPECT_NEAR(h, 10000, 400);  // ~4.4 sigma
  uint64_t st[4];
  r.get_state(st);
  uint64_t x = r.next();
  Rng r2(0);
  r2.set_state(st);
  EXPECT_EQ(r2.next(), x);
}
