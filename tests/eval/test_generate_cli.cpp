// kvq-generate --json against the demo model's reference.json, which a separate Python
// implementation computed (data/kvq-demo-llama/README.md): prompt ids, greedy continuation, the last
// position's top logits and the perplexity window's NLL.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "run_cmd.hpp"

using json = nlohmann::json;

namespace {

const std::string kDemo = std::string(KVQ_SOURCE_DIR) + "/data/kvq-demo-llama";

json read_json(const std::string& path) {
  std::ifstream f(path);
  return json::parse(f);
}

// The reference's figures, for a given load (whole by default; stream converts a layer per forward;
// auto with a too-small --max-memory streams too).
void expect_reference(const std::string& load_args) {
  SCOPED_TRACE(load_args);
  const json ref = read_json(kDemo + "/reference.json");
  const std::string out = kvq::test::temp_path("generate.json");
  std::filesystem::remove(out);
  const auto r = kvq::test::run_cmd(kvq::test::bin("kvq-generate") + " -q --threads 1 --model " + kDemo +
                                    " --prompt '" + ref["prompt"].get<std::string>() + "' --steps 32 --ppl-text " +
                                    kDemo + "/psalm23.txt --window 257 --json " + out + " " + load_args);
  ASSERT_EQ(r.status, 0) << r.err;
  const json got = read_json(out);
  EXPECT_EQ(got["prompt_ids"], ref["prompt_ids"]);
  EXPECT_EQ(got["generated_ids"], ref["greedy_32_ids"]);
  ASSERT_EQ(got["last_top10"].size(), 10u);
  for (size_t i = 0; i < ref["last_top5"].size(); ++i) {
    EXPECT_EQ(got["last_top10"][i]["id"], ref["last_top5"][i][0]) << "rank " << i;
    EXPECT_NEAR(got["last_top10"][i]["logit"].get<double>(), ref["last_top5"][i][1].get<double>(), 1e-3) << "rank " << i;
  }
  for (size_t i = 1; i < 10; ++i)
    EXPECT_GE(got["last_top10"][i - 1]["logit"].get<double>(), got["last_top10"][i]["logit"].get<double>());
  EXPECT_EQ(got["ppl_window_tokens"], ref["ppl_window_ids"].size());
  EXPECT_NEAR(got["ppl_mean_nll"].get<double>(), ref["ppl_window_nll"].get<double>(), 1e-4);
}

TEST(GenerateCli, JsonMatchesTheReferenceImplementation) { expect_reference(""); }

TEST(GenerateCli, StreamedLoadMatchesTheReferenceToo) {
  expect_reference("--load stream");
  expect_reference("--max-memory 1M");  // auto: the 11 MiB model does not fit, so it streams
}

// A model larger than --max-memory with --load whole is refused before it is loaded: one line
// naming the model, --load and both sizes; no output file.
TEST(GenerateCli, WholeModelOverTheMemoryIsOneLine) {
  const std::string out = kvq::test::temp_path("generate_big.json");
  std::filesystem::remove(out);
  const auto r = kvq::test::run_cmd(kvq::test::bin("kvq-generate") + " -q --model " + kDemo +
                                    " --steps 1 --load whole --max-memory 1M --json " + out);
  EXPECT_EQ(r.status, 2) << r.err;
  EXPECT_NE(r.err.find(kDemo + ": --load: whole: the model takes 11.0 MiB in fp32, more than the 1.0 MiB"),
            std::string::npos)
      << r.err;
  EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
  EXPECT_FALSE(std::filesystem::exists(out));
  const auto bad = kvq::test::run_cmd(kvq::test::bin("kvq-generate") + " -q --model " + kDemo + " --max-memory 12X");
  EXPECT_EQ(bad.status, 2);
  EXPECT_NE(bad.err.find("--max-memory"), std::string::npos) << bad.err;
}

TEST(GenerateCli, UnwritableJsonIsOneLineAndNoFile) {
  const auto r = kvq::test::run_cmd(kvq::test::bin("kvq-generate") + " -q --threads 1 --model " + kDemo +
                                    " --steps 1 --json /nonexistent-dir/x.json");
  EXPECT_NE(r.status, 0);
  EXPECT_NE(r.err.find("/nonexistent-dir/x.json"), std::string::npos) << r.err;
  EXPECT_FALSE(std::filesystem::exists("/nonexistent-dir/x.json"));
}

}  // namespace
