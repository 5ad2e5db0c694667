// The layer-streamed capture (issue 13) against the whole-model one: the same batches through the
// same fp32 operations, so the calibration files must be the same bytes — on the shared models and
// on sharded BF16 Hugging Face checkpoints (dense with a sliding window, MoE with tied
// embeddings), at every chunk size, with the hidden states spilled to a file, and after a SIGKILL
// in the middle of a layer. The whole-model path is the one the reference tests (tests/model)
// check against independent forwards.
#include <gtest/gtest.h>

#include <filesystem>

#include "kvq/io/calib_file.hpp"
#include "kvq/util/sha256.hpp"
#include "run_cmd.hpp"
#include "shared_data.hpp"

using namespace kvq;
namespace fs = std::filesystem;

namespace {

const std::string kWiki = "corpora/wikitext2-train-sample.txt";

std::string capture(const std::string& model, const std::string& out, const std::string& extra) {
  return "SOURCE_DATE_EPOCH=1700000000 " + test::bin("calib-capture") + " -q --threads 2 --model " + model +
         " --corpus " + test::shared_path(kWiki) + " --seq-len 48 --holdout 2 --reservoir-tokens 40 --seed 3 --out " +
         out + " " + extra;
}

// A tiny sharded BF16 HF model of `family` (kvq-make-tiny-hf), made once per test binary run.
std::string tiny(const std::string& family) {
  const std::string dir = test::temp_path("stream_" + family);
  if (fs::exists(dir + "/config.json")) return dir;
  fs::remove_all(dir);
  auto r = test::run_cmd(std::string(KVQ_MAKE_TINY_HF) + " --family " + family + " --seed 2 --out " + dir);
  EXPECT_EQ(r.status, 0) << r.err;
  return dir;
}

// `prec`: more flags for every run (--precision bf16: the BF16 forward, streamed = whole too).
void expect_stream_equals_whole(const std::string& model, const std::string& tag, const std::string& prec = "") {
  const std::string whole = test::temp_path(tag + "_whole.kvqcal.h5");
  auto r = test::run_cmd(capture(model, whole, "--samples 7 --batch 1 --load whole " + prec));
  ASSERT_EQ(r.status, 0) << r.err;
  const std::string want = sha256_file(whole);
  // Chunks of 1 and 3 windows (7 = 3 + 3 + 1: a short last chunk), all windows, and spilled.
  for (const std::string extra : {"--chunk 1", "--chunk 3", "", "--chunk 3 --spill", "--spill"}) {
    const std::string out = test::temp_path(tag + "_stream.kvqcal.h5");
    fs::remove(out);
    r = test::run_cmd(capture(model, out, "--samples 7 --batch 1 " + extra + " " + prec));
    ASSERT_EQ(r.status, 0) << extra << ": " << r.err;
    EXPECT_EQ(sha256_file(out), want) << tag << " " << extra << ": streamed file differs from the whole-model one";
  }
  // Batches of 2 inside chunks of 4 (a batch loop's GEMM shapes, several batches per layer).
  const std::string whole2 = test::temp_path(tag + "_whole2.kvqcal.h5"), out2 = test::temp_path(tag + "_s2.kvqcal.h5");
  ASSERT_EQ(test::run_cmd(capture(model, whole2, "--samples 7 --batch 2 --load whole " + prec)).status, 0);
  r = test::run_cmd(capture(model, out2, "--samples 7 --batch 2 --chunk 4 " + prec));
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(sha256_file(out2), sha256_file(whole2)) << tag << " batch 2 chunk 4";
  CalibFile a = read_calib(whole2, false), b = read_calib(out2, false);
  EXPECT_EQ(a.moments.k.gram, b.moments.k.gram);
  EXPECT_EQ(a.reservoir.q, b.reservoir.q);
  EXPECT_EQ(a.holdout.v, b.holdout.v);
}

}  // namespace

TEST(CaptureStream, EqualsWholeOnStories260K) {
  KVQ_REQUIRE_SHARED("models/stories260K/stories260K.bin");
  expect_stream_equals_whole(test::shared_path("models/stories260K/stories260K.bin"), "stories");
}

TEST(CaptureStream, EqualsWholeOnTheDemoModel) {
  KVQ_REQUIRE_SHARED("models/kvq-demo-llama/config.json");
  expect_stream_equals_whole(test::shared_path("models/kvq-demo-llama"), "demo");
}

// The BF16 forward: a streamed layer's weights converted to BF16 as the whole load converts them,
// embedding rows rounded as the whole BF16 table holds them: the same bytes again.
TEST(CaptureStream, Bf16StreamEqualsWhole) {
  KVQ_REQUIRE_SHARED(kWiki);
  expect_stream_equals_whole(std::string(KVQ_SOURCE_DIR) + "/data/kvq-demo-llama", "demo_bf16", "--precision bf16");
  expect_stream_equals_whole(tiny("qwen3-moe"), "moe_bf16", "--precision bf16");
  const CalibFile c = read_calib(test::temp_path("moe_bf16_whole.kvqcal.h5"), false);
  EXPECT_EQ(c.prov.forward_precision, "bf16");
}

TEST(CaptureStream, EqualsWholeOnShardedBf16Checkpoints) {
  KVQ_REQUIRE_SHARED(kWiki);
  expect_stream_equals_whole(tiny("mistral-swa"), "swa");  // sliding window, two BF16 shards
  expect_stream_equals_whole(tiny("qwen3-moe"), "moe");    // q/k norm, experts, tied embeddings
  expect_stream_equals_whole(tiny("qwen2"), "qwen2");      // q/k/v projection biases
}

TEST(CaptureStream, ResumeAfterKillMidLayerIsByteIdentical) {
  KVQ_REQUIRE_SHARED("models/kvq-demo-llama/config.json");
  const std::string model = test::shared_path("models/kvq-demo-llama");
  const std::string full = test::temp_path("stream_full.kvqcal.h5"), part = test::temp_path("stream_part.kvqcal.h5");
  fs::remove(full);
  fs::remove(part);
  const std::string args = "--samples 12 --batch 2 --checkpoint-every 4";
  auto r = test::run_cmd(capture(model, full, args));
  ASSERT_EQ(r.status, 0) << r.err;
  // Killed inside layer 2 of the chunk of windows 4..7: the file holds the 4 windows of the
  // checkpoint before it, and the chunk's partial layers are lost with the process.
  r = test::run_cmd("KVQ_TEST_KILL_AFTER_WINDOWS=6 KVQ_TEST_KILL_AT_LAYER=2 " + capture(model, part, args));
  ASSERT_EQ(r.status, 128 + 9) << "expected death by SIGKILL: " << r.err;
  ASSERT_TRUE(fs::exists(part));
  EXPECT_EQ(read_calib(part, false).windows_done, 4);
  r = test::run_cmd(capture(model, part, args + " --resume"));
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(sha256_file(part), sha256_file(full));
  for (const auto& e : fs::directory_iterator(fs::path(part).parent_path()))
    EXPECT_EQ(e.path().filename().string().rfind(".kvq-spill-", 0), std::string::npos) << "spill file left behind";
}

TEST(CaptureStream, BudgetBelowOneLayerIsAOneLineError) {
  KVQ_REQUIRE_SHARED("models/kvq-demo-llama/config.json");
  const std::string model = test::shared_path("models/kvq-demo-llama");
  const std::string out = test::temp_path("stream_small.kvqcal.h5");
  fs::remove(out);
  auto r = test::run_cmd(capture(model, out, "--samples 4 --max-memory 1M"));
  EXPECT_EQ(r.status, 2) << r.err;
  EXPECT_NE(r.err.find("--max-memory"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("layer"), std::string::npos) << r.err;
  EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
  EXPECT_FALSE(fs::exists(out));
  for (const std::string bad : {"abc", "0", "-5G", "12X", "1e30G"}) {
    r = test::run_cmd(capture(model, out, "--samples 4 --max-memory " + bad));
    EXPECT_EQ(r.status, 2) << bad << ": " << r.err;
    EXPECT_NE(r.err.find("--max-memory"), std::string::npos) << r.err;
    EXPECT_FALSE(fs::exists(out));
  }
  r = test::run_cmd(capture(model, out, "--samples 4 --batch 2 --chunk 3"));
  EXPECT_EQ(r.status, 2) << r.err;
  EXPECT_NE(r.err.find("--chunk"), std::string::npos) << r.err;
  r = test::run_cmd(capture(model, out, "--samples 4 --load whole --spill"));
  EXPECT_EQ(r.status, 2) << r.err;
  EXPECT_FALSE(fs::exists(out));
}
