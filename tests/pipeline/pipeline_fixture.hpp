#pragma once
// What the pipeline tests share: small calibrations of the demo model (on Genesis) and of
// stories260K (on the WikiText slice), made once per test run under a name of the test's own, and
// allocations of them. An empty path means the input is missing (`bible` or ../shared).
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "run_cmd.hpp"
#include "shared_data.hpp"

namespace kvq::test::pipeline {

inline std::string make_cal(const std::string& name, const std::string& model, const std::string& corpus,
                            int holdout = 2) {
  auto out = temp_path(name + ".kvqcal.h5");
  if (std::filesystem::exists(out)) return out;
  auto r = run_cmd(bin("calib-capture") + " -q --threads 1 --model " + model + " --corpus " + corpus +
                   " --samples 16 --seq-len 128 --holdout " + std::to_string(holdout) +
                   " --reservoir-tokens 256 --out " + out);
  EXPECT_EQ(r.status, 0) << r.err;
  return out;
}

// 16 x 128 windows of the demo model on Genesis; "" without `bible`.
inline std::string demo_cal(const std::string& prefix, int holdout = 2) {
  auto text = temp_path(prefix + "_genesis.txt");
  if (!std::filesystem::exists(text) && run_cmd("bible -p /usr/lib gen1:1-gen50:26 > " + text).status != 0) return "";
  return make_cal(prefix + "_demo", std::string(KVQ_SOURCE_DIR) + "/data/kvq-demo-llama", text, holdout);
}

// 16 x 128 windows of stories260K on the WikiText slice (../shared).
inline std::string stories_cal(const std::string& prefix, int holdout = 2) {
  return make_cal(prefix + "_stories", shared_path("models/stories260K/stories260K.bin"),
                  shared_path("corpora/wikitext2-train-sample.txt"), holdout);
}

inline std::string allocate(const std::string& cal, const std::string& args, const std::string& name) {
  auto alloc = temp_path(name + ".kvqalloc.h5");
  auto r = run_cmd(bin("kvq-allocate") + " -q --calib " + cal + " --out " + alloc + " " + args);
  EXPECT_EQ(r.status, 0) << args << ": " << r.err;
  return alloc;
}

// A file's bytes ("" when absent).
inline std::string bytes_of(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>()};
}

// kvq-verify's per-layer RoPE-logit MAE of an allocation on the calibration's held-out windows.
inline std::vector<double> layer_mae(const std::string& cal, const std::string& alloc) {
  const std::string out = alloc + ".verify.json";
  std::filesystem::remove(out);
  auto r = run_cmd(bin("kvq-verify") + " -q --calib " + cal + " --alloc " + alloc + " --json " + out);
  EXPECT_EQ(r.status, 0) << r.err;
  std::vector<double> v;
  if (!std::filesystem::exists(out)) return v;
  const nlohmann::json j = nlohmann::json::parse(std::ifstream(out));
  for (const auto& l : j["allocation"]["layers"]) v.push_back(l["logit_mae"].get<double>());
  return v;
}

}  // namespace kvq::test::pipeline
