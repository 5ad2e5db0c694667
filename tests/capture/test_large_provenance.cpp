// A calibration over a corpus folder of 600 files: the provenance lists every file with its sha256,
// more than HDF5 keeps in an attribute (64 KiB), and calib-capture used to fail when it wrote the
// file, after the whole capture ("H5Acreate2 failed"). Now the file is version 4 with the
// provenance in the root dataset /provenance. Checked with HDF5's own API (not kvq's reader): the
// version, no provenance attribute, a 1-D u8 dataset whose JSON lists the 600 files; HDF5 itself
// refuses that text as an attribute; kvq-inspect, kvq-allocate read it; a SIGKILL mid-run then
// --resume (which reads the version-4 checkpoint) gives the uninterrupted file's bytes; two window
// ranges merge into a version-4 file. Also the reader's refusals of a misplaced provenance.
#include <gtest/gtest.h>

#include <H5Cpp.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>

#include "kvq/io/calib_file.hpp"
#include "kvq/io/h5.hpp"
#include "kvq/util/error.hpp"
#include "kvq/util/sha256.hpp"
#include "h5_root.hpp"
#include "run_cmd.hpp"

namespace fs = std::filesystem;
using json = nlohmann::json;
using namespace kvq;

namespace {

constexpr int kFiles = 600;
const std::string kDemo = std::string(KVQ_SOURCE_DIR) + "/data/kvq-demo-llama";

std::string corpus_dir() {
  const std::string dir = test::temp_path("many_files"), done = dir + ".done";
  if (fs::exists(done)) return dir;
  fs::remove_all(dir);
  fs::create_directories(dir);
  std::mt19937 rng(7);
  const char* words[] = {"and", "the", "earth", "was", "without", "form", "void", "light", "day", "night"};
  char name[32];
  for (int i = 0; i < kFiles; ++i) {
    std::snprintf(name, sizeof name, "/part-%05d.txt", i);
    std::ofstream f(dir + name);
    for (int w = 0; w < 80; ++w) f << words[rng() % 10] << (w % 11 == 10 ? ".\n" : " ");
  }
  std::ofstream(done) << "written\n";  // beside the folder, not in the corpus
  return dir;
}

std::string capture(const std::string& out, const std::string& extra) {
  return "SOURCE_DATE_EPOCH=1700000000 " + test::bin("calib-capture") + " -q --threads 1 --model " + kDemo +
         " --corpus " + corpus_dir() +
         " --seq-len 64 --holdout 1 --batch 2 --out " + out + " " + extra;
}

using Raw = kvq::test::RootText;

Raw read_raw(const std::string& p) { return kvq::test::read_root_text_raw(p, "provenance"); }

std::string slurp(const std::string& p) {
  std::ifstream in(p, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

std::string refusal(const std::string& p) {
  try {
    read_calib(p, false);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST(LargeProvenance, CorpusOfManyFilesWritesVersion4) {
  const std::string full = test::temp_path("many_full.kvqcal.h5");
  fs::remove(full);
  auto r = test::run_cmd(capture(full, "--samples 8"));
  ASSERT_EQ(r.status, 0) << r.err;

  const Raw raw = read_raw(full);
  EXPECT_EQ(raw.version, 4);
  EXPECT_FALSE(raw.attr);
  EXPECT_EQ(raw.rank, 1);
  EXPECT_EQ(raw.elem, 1u);
  EXPECT_GT(raw.dataset.size(), size_t(65536));
  const json prov = json::parse(raw.dataset);
  ASSERT_EQ(prov["corpus"].size(), size_t(kFiles));
  EXPECT_NE(prov["corpus"][0]["path"].get<std::string>().find("part-00000.txt"), std::string::npos);

  // kvq's reader gives the same provenance; the tools read the file.
  const CalibFile c = read_calib(full, false);
  EXPECT_EQ(c.format_version, 4);
  ASSERT_EQ(c.prov.corpus.size(), size_t(kFiles));
  EXPECT_EQ(c.prov.corpus[kFiles - 1].sha256, prov["corpus"][kFiles - 1]["sha256"].get<std::string>());
  r = test::run_cmd(test::bin("kvq-inspect") + " " + full + " > " + full + ".txt");
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(slurp(full + ".txt").rfind("kvq-calibration v4", 0), 0u);
  const std::string alloc = test::temp_path("many.kvqalloc.h5");
  fs::remove(alloc);
  r = test::run_cmd(test::bin("kvq-allocate") + " -q --calib " + full + " --method block-gtq --bpd 3 --out " + alloc);
  ASSERT_EQ(r.status, 0) << r.err;

  // Why a dataset: HDF5 itself refuses this text as a (compact) attribute.
  const std::string probe = test::temp_path("prov_probe.h5");
  fs::remove(probe);
  bool refused = false;
  try {
    H5::H5File f(probe, H5F_ACC_TRUNC);
    H5::StrType t(H5::PredType::C_S1, raw.dataset.size());
    f.openGroup("/").createAttribute("provenance", t, H5::DataSpace(H5S_SCALAR)).write(t, raw.dataset);
  } catch (const H5::Exception&) {
    refused = true;
  }
  EXPECT_TRUE(refused);

  // SIGKILL mid-run (the checkpoint before it is version 4), then --resume: the same bytes.
  const std::string ckpt_full = test::temp_path("many_ckpt_full.kvqcal.h5"), part = test::temp_path("many_part.kvqcal.h5");
  fs::remove(ckpt_full);
  fs::remove(part);
  const std::string args = "--samples 8 --checkpoint-every 4";
  r = test::run_cmd(capture(ckpt_full, args));
  ASSERT_EQ(r.status, 0) << r.err;
  r = test::run_cmd("KVQ_TEST_KILL_AFTER_WINDOWS=6 KVQ_TEST_KILL_AT_LAYER=2 " + capture(part, args));
  ASSERT_EQ(r.status, 128 + 9) << "expected death by SIGKILL: " << r.err;
  EXPECT_EQ(read_raw(part).version, 4);
  EXPECT_EQ(read_calib(part, false).windows_done, 4);
  r = test::run_cmd(capture(part, args + " --resume"));
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(sha256_file(part), sha256_file(ckpt_full));

  // Two window ranges merge into one version-4 file.
  const std::string a = test::temp_path("many_a.kvqcal.h5"), b = test::temp_path("many_b.kvqcal.h5"),
                    ab = test::temp_path("many_ab.kvqcal.h5");
  for (const std::string& p : {a, b, ab}) fs::remove(p);
  ASSERT_EQ(test::run_cmd(capture(a, "--samples 8 --windows 0:4")).status, 0);
  ASSERT_EQ(test::run_cmd(capture(b, "--samples 8 --windows 4:8")).status, 0);
  r = test::run_cmd(test::bin("calib-capture") + " merge " + a + " " + b + " --out " + ab);
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(read_raw(ab).version, 4);
  EXPECT_EQ(read_calib(ab, false).windows_done, 8);
}

TEST(LargeProvenance, MisplacedProvenanceIsOneLine) {
  const std::string golden = std::string(KVQ_SOURCE_DIR) + "/data/golden/calib-v3.kvqcal.h5";
  H5::Exception::dontPrint();
  h5::quiet();
  auto copy_edit = [&](const std::string& name, int64_t version, bool move_to_dataset, const std::string& text) {
    const std::string p = test::temp_path(name + ".kvqcal.h5");
    fs::remove(p);
    fs::copy_file(golden, p);
    H5::H5File f(p, H5F_ACC_RDWR);
    H5::Group g = f.openGroup("/");
    g.removeAttr("version");
    h5::write_attr(g, "version", version);
    if (move_to_dataset) {
      const std::string prov = text.empty() ? h5::read_attr_str(p, g, "provenance") : text;
      g.removeAttr("provenance");
      const hsize_t n = prov.size();
      H5::DataSet ds = f.createDataSet("provenance", H5::PredType::STD_U8LE, H5::DataSpace(1, &n));
      ds.write(prov.data(), H5::PredType::NATIVE_UINT8);
    }
    return p;
  };
  // The golden's provenance moved to the dataset at version 4 reads as the same file.
  const std::string moved = copy_edit("prov_moved", 4, true, "");
  EXPECT_EQ(calib_content_digest(read_calib(moved, false)), calib_content_digest(read_calib(golden, false)));
  struct Case {
    std::string name, expect;
    std::string path;
  };
  const Case cases[] = {
      {"v4_attr", "/@provenance: a version-4 file keeps its provenance in the /provenance dataset",
       copy_edit("prov_v4_attr", 4, false, "")},
      {"v3_dataset", "/provenance: a provenance dataset needs calibration version >= 4, the file is version 3",
       copy_edit("prov_v3_dataset", 3, true, "")},
      {"v4_not_json", "/provenance: not valid JSON", copy_edit("prov_v4_bad", 4, true, "{\"corpus\": [")},
  };
  for (const Case& c : cases) {
    const std::string err = refusal(c.path);
    EXPECT_NE(err.find(c.path), std::string::npos) << c.name << ": " << err;
    EXPECT_NE(err.find(c.expect), std::string::npos) << c.name << ": " << err;
    EXPECT_EQ(err.find('\n'), std::string::npos) << c.name;
  }
  // A version-4 file without it: the dataset is missing.
  const std::string none = copy_edit("prov_v4_none", 4, false, "");
  {
    H5::H5File f(none, H5F_ACC_RDWR);
    f.openGroup("/").removeAttr("provenance");
  }
  EXPECT_NE(refusal(none).find("/provenance: dataset missing"), std::string::npos) << refusal(none);
}
