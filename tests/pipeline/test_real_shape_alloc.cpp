// An allocation for a model of Llama-3.1-8B's attention shape — 32 layers, 8 KV heads of 128
// dimensions (16 query heads here; a tiny hidden size and untrained weights, written by
// kvq-make-tiny-hf) — holds 512 head decisions: its manifest is larger than HDF5 keeps in an
// attribute (64 KiB), and kvq-allocate used to fail on it ("H5Acreate2 failed"). Now the file is
// version 5 with the manifest in the root dataset /manifest. Checked with HDF5's own API (not kvq's
// reader): the version, no manifest attribute, a 1-D u8 dataset whose bytes are the JSON that
// kvq-inspect --json writes; the same text as an attribute is refused by HDF5 itself (why the
// dataset); every method's file is byte-identical when made twice and reads in kvq-verify and
// kvq-inspect.
#include <gtest/gtest.h>

#include <H5Cpp.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>

#include "h5_root.hpp"
#include "run_cmd.hpp"

namespace fs = std::filesystem;
using json = nlohmann::json;
using kvq::test::bin;
using kvq::test::run_cmd;
using kvq::test::temp_path;

namespace {

constexpr int kLayers = 32, kKvHeads = 8, kHeadDim = 128;

std::string slurp(const std::string& p) {
  std::ifstream in(p, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

// The calibration of the 8B-shaped tiny model (made once per test binary run).
std::string calibration() {
  const std::string dir = temp_path("real_shape");
  const std::string cal = dir + "/c.kvqcal.h5";
  if (fs::exists(cal)) return cal;
  fs::remove_all(dir);
  fs::create_directories(dir);
  auto r = run_cmd(std::string(KVQ_MAKE_TINY_HF) + " --family llama3 --seed 3 --layers " + std::to_string(kLayers) +
                   " --kv-heads " + std::to_string(kKvHeads) + " --head-dim " + std::to_string(kHeadDim) + " --out " +
                   dir + "/m");
  EXPECT_EQ(r.status, 0) << r.err;
  {
    std::mt19937 rng(5);
    const char* words[] = {"the", "cat", "sat", "on", "a", "mat", "and", "dog", "ran", "far", "away", "from"};
    std::ofstream c(dir + "/c.txt");
    for (int i = 0; i < 6000; ++i) c << words[rng() % 12] << (i % 17 == 16 ? ".\n" : " ");
  }
  r = run_cmd(bin("calib-capture") + " -q --threads 2 --model " + dir + "/m --corpus " + dir + "/c.txt" +
              " --samples 4 --seq-len 64 --holdout 2 --reservoir-tokens 64 --out " + cal);
  EXPECT_EQ(r.status, 0) << r.err;
  return cal;
}

using Raw = kvq::test::RootText;

Raw read_raw(const std::string& p) { return kvq::test::read_root_text_raw(p, "manifest"); }

}  // namespace

TEST(RealShapeAlloc, LargeManifestLivesInTheDataset) {
  H5::Exception::dontPrint();
  const std::string cal = calibration();
  ASSERT_TRUE(fs::exists(cal));
  const std::string dir = temp_path("real_shape");
  struct Run {
    std::string name, args;
  };
  const Run runs[] = {
      {"uniform3", "--method uniform --bpd 3"},
      {"gtq3", "--method block-gtq --bpd 3"},  // compact group norms: ratio tensors too
      {"gtq2_fp16", "--method block-gtq --bpd 2 --group-norms fp16"},
      {"cobra2", "--method cobra-mse --bpd 2"},  // bases and means in /tensors
  };
  for (const Run& run : runs) {
    SCOPED_TRACE(run.name);
    const std::string a = dir + "/" + run.name + ".kvqalloc.h5", b = dir + "/" + run.name + "_again.kvqalloc.h5";
    for (const std::string& out : {a, b}) {
      fs::remove(out);
      const auto r = run_cmd(bin("kvq-allocate") + " -q --threads 2 --calib " + cal + " " + run.args + " --out " + out);
      ASSERT_EQ(r.status, 0) << r.err;
    }
    EXPECT_EQ(slurp(a), slurp(b)) << "same inputs, same bytes";

    const Raw raw = read_raw(a);
    EXPECT_EQ(raw.version, 5);
    EXPECT_FALSE(raw.attr) << "no manifest attribute in a version-5 file";
    EXPECT_EQ(raw.cls, H5T_INTEGER);
    EXPECT_EQ(raw.elem, 1u);
    EXPECT_EQ(raw.rank, 1);
    EXPECT_GT(raw.dataset.size(), size_t(65536)) << "larger than an attribute may be";
    const json m = json::parse(raw.dataset);
    EXPECT_EQ(m["version"], 5);
    EXPECT_EQ(m["heads"].size(), size_t(2 * kLayers * kKvHeads));
    EXPECT_EQ(m["calibration"]["head_dim"], kHeadDim);

    // kvq-inspect --json writes the manifest as kvq reads it: the dataset's JSON; the same run prints
    // the summary (one run for both: reading this file costs seconds at this shape).
    const std::string js = dir + "/" + run.name + ".json";
    auto r = run_cmd(bin("kvq-inspect") + " " + a + " --json " + js + " > " + js + ".txt");
    ASSERT_EQ(r.status, 0) << r.err;
    EXPECT_EQ(json::parse(slurp(js)), m);
    // ... and it validates against the manifest schema (python3-jsonschema, installed by scripts/test).
    if (run_cmd("python3 -c 'import jsonschema'").status == 0) {
      const std::string schema = std::string(KVQ_SOURCE_DIR) + "/schemas/allocation-manifest.schema.json";
      r = run_cmd("python3 -c 'import json,sys,jsonschema; jsonschema.validate(json.load(open(sys.argv[1])), "
                  "json.load(open(sys.argv[2])))' " + js + " " + schema);
      EXPECT_EQ(r.status, 0) << r.err;
    } else {
      std::printf("python3-jsonschema missing: manifest schema not checked (scripts/test installs it)\n");
    }
    const std::string txt = slurp(js + ".txt");
    EXPECT_EQ(txt.rfind("kvq-allocation v5", 0), 0u) << txt.substr(0, 200);

    // kvq-verify reads it against the held-out windows: every layer reported.
    const std::string vj = dir + "/" + run.name + ".verify.json";
    r = run_cmd(bin("kvq-verify") + " -q --threads 2 --calib " + cal + " --alloc " + a + " --json " + vj);
    ASSERT_EQ(r.status, 0) << r.err;
    const json v = json::parse(slurp(vj));
    EXPECT_EQ(v["allocation"]["layers"].size(), size_t(kLayers));
  }

  // Why a dataset: HDF5 itself refuses this text as an attribute of the default (compact) storage.
  const Raw raw = read_raw(dir + "/uniform3.kvqalloc.h5");
  const std::string p = dir + "/attr_probe.h5";
  fs::remove(p);
  H5::H5File f(p, H5F_ACC_TRUNC);
  H5::Group root = f.openGroup("/");
  H5::StrType t(H5::PredType::C_S1, raw.dataset.size());
  bool refused = false;
  try {
    root.createAttribute("manifest", t, H5::DataSpace(H5S_SCALAR)).write(t, raw.dataset);
  } catch (const H5::Exception&) {
    refused = true;
  }
  EXPECT_TRUE(refused) << raw.dataset.size() << " bytes were accepted as an attribute";
}

// Small manifests (every golden file, the demo model's files) stay in the attribute, so those files
// keep their version and bytes (their sha256 is asserted by the golden tests).
TEST(RealShapeAlloc, SmallManifestsStayInTheAttribute) {
  H5::Exception::dontPrint();
  const std::string golden = std::string(KVQ_SOURCE_DIR) + "/data/golden/block-gtq-compact-v4.kvqalloc.h5";
  const Raw raw = read_raw(golden);
  EXPECT_EQ(raw.version, 4);
  EXPECT_TRUE(raw.attr);
  EXPECT_TRUE(raw.dataset.empty());
}
