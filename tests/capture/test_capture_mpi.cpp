// calib-capture under a real `mpirun` on this machine (loopback): the sharded statistics equal the
// single-process run, files repeat byte for byte, mismatched inputs and a killed rank leave no file,
// and a killed run resumes per rank. Skips without the MPI build, mpirun or ../shared.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>

#include "kvq/capture/ranks.hpp"
#include "kvq/io/calib_file.hpp"
#include "kvq/util/sha256.hpp"
#include "run_cmd.hpp"
#include "shared_data.hpp"

using namespace kvq;
namespace fs = std::filesystem;

namespace {

const std::string kStories = "models/stories260K/stories260K.bin";
const std::string kWiki = "corpora/wikitext2-train-sample.txt";
constexpr int kBatch = 2;
constexpr double kRelTol = 1e-12;  // fp64 sums added in another order differ by rounding only

// The first ~200 KB of the WikiText sample, cut at a line end: every rank tokenizes the whole corpus,
// and four ranks on two cores should not spend the test doing it.
std::string small_corpus() {
  static const std::string path = [] {
    std::ifstream f(test::shared_path(kWiki), std::ios::binary);
    std::string s(200000, '\0');
    f.read(s.data(), std::streamsize(s.size()));
    s.resize(size_t(f.gcount()));
    s.resize(s.rfind('\n') + 1);
    auto p = test::temp_path("mpi_corpus.txt");
    test::write_text(p, s);
    return p;
  }();
  return path;
}

std::string capture_args(const std::string& corpus, const std::string& out, const std::string& extra) {
  return test::bin("calib-capture") + " -q --threads 1 --model " + test::shared_path(kStories) + " --corpus " +
         corpus + " --seq-len 64 --holdout 2 --batch " + std::to_string(kBatch) +
         " --reservoir-tokens 64 --seed 5 --out " + out + " " + extra;
}

// Loopback only; --oversubscribe and --threads 1 because the ranks outnumber the cores. No wall-clock
// limit here: a hung job is caught by ctest's per-test TIMEOUT (tests/CMakeLists.txt).
std::string mpirun(int n, const std::string& env = "") {
  return "mpirun --allow-run-as-root --oversubscribe --bind-to none --mca btl self,tcp "
         "--mca btl_tcp_if_include lo --mca oob_tcp_if_include lo -x SOURCE_DATE_EPOCH=1700000000 " +
         env + " -n " + std::to_string(n) + " ";
}

// Single-process and N-rank files of --samples S (and `extra` capture flags), each made once per
// test program.
std::string single_file(int samples, const std::string& extra = "") {
  static std::map<std::string, std::string> made;
  const std::string args = "--samples " + std::to_string(samples) + " " + extra;
  if (!made.count(args)) {
    auto out = test::temp_path("mpi_single_" + std::to_string(made.size()) + ".kvqcal.h5");
    fs::remove(out);
    auto r = test::run_cmd("SOURCE_DATE_EPOCH=1700000000 " + capture_args(small_corpus(), out, args));
    EXPECT_EQ(r.status, 0) << r.err;
    made[args] = out;
  }
  return made[args];
}

std::string mpi_file(int n, int samples, const std::string& extra = "") {
  static std::map<std::string, std::string> made;
  const std::string args = "--samples " + std::to_string(samples) + " " + extra;
  const std::string key = std::to_string(n) + " " + args;
  if (!made.count(key)) {
    auto out = test::temp_path("mpi_n" + std::to_string(n) + "_" + std::to_string(made.size()) + ".kvqcal.h5");
    fs::remove(out);
    auto r = test::run_cmd(mpirun(n) + capture_args(small_corpus(), out, args));
    EXPECT_EQ(r.status, 0) << r.err;
    made[key] = out;
  }
  return made[key];
}

// max |a - b| / max |b| per (layer, KV head) block of `block` elements: relative to each head's scale.
double max_rel(const std::vector<double>& a, const std::vector<double>& b, size_t block) {
  double worst = 0;
  for (size_t h = 0; h + block <= b.size(); h += block) {
    double scale = 0, diff = 0;
    for (size_t i = h; i < h + block; ++i) {
      scale = std::max(scale, std::fabs(b[i]));
      diff = std::max(diff, std::fabs(a[i] - b[i]));
    }
    if (scale > 0) worst = std::max(worst, diff / scale);
  }
  return worst;
}

// No temporary of the output or of a rank's checkpoint (`<out>[.rank<k>.partial].tmp.<pid>`).
bool no_temporaries_beside(const std::string& out) {
  const std::string stem = fs::path(out).filename().string();
  for (const auto& e : fs::directory_iterator(fs::path(out).parent_path())) {
    const std::string name = e.path().filename().string();
    if (name.rfind(stem, 0) == 0 && name.find(".tmp.") != std::string::npos) return false;
  }
  return true;
}

class CaptureMpi : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!mpi_built()) GTEST_SKIP() << "built without MPI (KVQ_MPI off, or no libopenmpi-dev at configure time)";
    if (test::run_cmd("command -v mpirun >/dev/null").status != 0) GTEST_SKIP() << "no mpirun (openmpi-bin)";
    KVQ_REQUIRE_SHARED(kStories);
    KVQ_REQUIRE_SHARED(kWiki);
  }

  // The N-rank file against the single-process one: statistics to rounding, everything else exact.
  static void expect_equal_to_single(const std::string& mpi, const std::string& single, int n, int batch = kBatch) {
    CalibFile a = read_calib(mpi), b = read_calib(single);
    EXPECT_EQ(a.prov.n_ranks, n);
    EXPECT_EQ(b.prov.n_ranks, 1);
    EXPECT_EQ(a.prov.samples, b.prov.samples);
    EXPECT_EQ(a.calib_offsets, b.calib_offsets);
    EXPECT_EQ(a.holdout_offsets, b.holdout_offsets);
    EXPECT_EQ(a.windows_done, b.windows_done);
    const auto sh = b.shape();
    const size_t d = size_t(sh.head_dim);
    double worst = 0;
    for (auto [x, y] : {std::make_pair(&a.moments.k, &b.moments.k), std::make_pair(&a.moments.v, &b.moments.v),
                        std::make_pair(&a.moments.q, &b.moments.q)}) {
      EXPECT_EQ(x->count, y->count);
      worst = std::max({worst, max_rel(x->sum, y->sum, d), max_rel(x->gram, y->gram, d * d)});
    }
    EXPECT_LE(worst, kRelTol) << "N=" << n;
    // Each rank forwards the same batches as the single process: the maxima are the same floats.
    ASSERT_TRUE(a.moments.has_amax());
    EXPECT_EQ(a.moments.k_amax, b.moments.k_amax);
    EXPECT_EQ(a.moments.v_amax, b.moments.v_amax);
    EXPECT_EQ(a.moments.q_amax, b.moments.q_amax);
    std::printf("N=%d: largest relative difference of the fp64 sums to the single process: %.3g\n", n, worst);
    // The reservoir follows the single-process draw, and rank 0 captures the held-out windows as
    // a single process does: both are bit-identical.
    EXPECT_EQ(a.reservoir.capacity, b.reservoir.capacity);
    EXPECT_EQ(a.reservoir.seen, b.reservoir.seen);
    EXPECT_EQ(a.reservoir.rng_state, b.reservoir.rng_state);
    EXPECT_EQ(a.reservoir.source, b.reservoir.source);
    EXPECT_EQ(a.reservoir.q, b.reservoir.q);
    EXPECT_EQ(a.reservoir.k, b.reservoir.k);
    EXPECT_EQ(a.reservoir.v, b.reservoir.v);
    EXPECT_EQ(a.holdout.ids, b.holdout.ids);
    EXPECT_EQ(a.holdout.q, b.holdout.q);
    EXPECT_EQ(a.holdout.k, b.holdout.k);
    EXPECT_EQ(a.holdout.v, b.holdout.v);
    // Windows go to ranks in contiguous runs of whole batches, in rank order.
    ASSERT_EQ(a.window_rank.size(), a.calib_offsets.size());
    EXPECT_TRUE(b.window_rank.empty());
    for (size_t i = 0; i < a.window_rank.size(); ++i) {
      EXPECT_GE(a.window_rank[i], 0);
      EXPECT_LT(a.window_rank[i], n);
      if (i > 0) {
        EXPECT_LE(a.window_rank[i - 1], a.window_rank[i]);
      }
      if (i % size_t(batch) != 0) {
        EXPECT_EQ(a.window_rank[i - 1], a.window_rank[i]) << "a batch split across ranks";
      }
    }
  }
};

}  // namespace

TEST_F(CaptureMpi, StatisticsEqualTheSingleProcess) {
  for (int n : {1, 2, 4}) {
    SCOPED_TRACE("N=" + std::to_string(n));
    expect_equal_to_single(mpi_file(n, 12), single_file(12), n);
  }
  EXPECT_EQ(read_calib(mpi_file(4, 12), false).window_rank,
            (std::vector<int64_t>{0, 0, 1, 1, 1, 1, 2, 2, 3, 3, 3, 3}));
}

TEST_F(CaptureMpi, MoreRanksThanBatches) {
  // One batch for four ranks: three ranks have no windows and only take part in the reduction.
  expect_equal_to_single(mpi_file(4, 2), single_file(2), 4);
  EXPECT_EQ(read_calib(mpi_file(4, 2), false).window_rank, (std::vector<int64_t>{3, 3}));
}

TEST_F(CaptureMpi, OddBatchesAnotherModelAndReservoirSizes) {
  // The HF demo model (GQA, head_dim 64), batches of 3 over 7 windows on 3 ranks; a reservoir larger
  // than the run's tokens, and none.
  const std::string demo = "--model " + std::string(KVQ_SOURCE_DIR) + "/data/kvq-demo-llama --seq-len 32 --batch 3 ";
  for (const char* res : {"--reservoir-tokens 1000", "--reservoir-tokens 0"}) {
    SCOPED_TRACE(res);
    expect_equal_to_single(mpi_file(3, 7, demo + res), single_file(7, demo + res), 3, 3);
  }
}

TEST_F(CaptureMpi, RepeatedRunsAreByteIdentical) {
  auto again = test::temp_path("mpi_again_2.kvqcal.h5");
  fs::remove(again);
  auto r = test::run_cmd(mpirun(2) + capture_args(small_corpus(), again, "--samples 12"));
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(sha256_file(again), sha256_file(mpi_file(2, 12)));
}

TEST_F(CaptureMpi, MismatchedCorpusOnOneRankStopsWithNoFile) {
  // Rank 1 sees another text at its corpus path (as on a host with a stale copy): MPMD launch.
  std::ifstream f(small_corpus(), std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  std::string other = ss.str();
  other[other.find("the")] = 'T';
  auto corpus1 = test::temp_path("mpi_corpus_rank1.txt");
  test::write_text(corpus1, other);
  auto out = test::temp_path("mpi_mismatch.kvqcal.h5");
  fs::remove(out);
  auto r = test::run_cmd(mpirun(1) + capture_args(small_corpus(), out, "--samples 4") + " : -n 1 " +
                         capture_args(corpus1, out, "--samples 4"));
  EXPECT_NE(r.status, 0);
  EXPECT_NE(r.err.find("rank 1: provenance.corpus[0].sha256"), std::string::npos) << r.err;
  EXPECT_EQ(r.err.find("rank 1: provenance"), r.err.rfind("rank 1: provenance")) << "reported once, by rank 0";
  EXPECT_FALSE(fs::exists(out));
  EXPECT_TRUE(no_temporaries_beside(out));
}

TEST_F(CaptureMpi, KilledRankLeavesNoFileAndTheRunResumesPerRank) {
  auto out = test::temp_path("mpi_killed.kvqcal.h5");
  for (int k : {0, 1}) fs::remove(out + ".rank" + std::to_string(k) + ".partial");
  fs::remove(out);
  // Rank 1 dies by SIGKILL after 4 of its 6 windows (checkpoints every 2): mpirun stops the job.
  auto r = test::run_cmd(mpirun(2, "-x KVQ_TEST_KILL_RANK=1 -x KVQ_TEST_KILL_AFTER_WINDOWS=4") +
                         capture_args(small_corpus(), out, "--samples 12 --checkpoint-every 2"));
  EXPECT_NE(r.status, 0) << r.err;
  EXPECT_FALSE(fs::exists(out));
  EXPECT_TRUE(no_temporaries_beside(out));
  ASSERT_TRUE(fs::exists(out + ".rank1.partial"));
  EXPECT_EQ(read_calib(out + ".rank1.partial", false).windows_done, 4);

  // The checkpoints belong to two ranks: resuming on four is refused, naming the field.
  r = test::run_cmd(mpirun(4) + capture_args(small_corpus(), out, "--samples 12 --checkpoint-every 2 --resume"));
  EXPECT_NE(r.status, 0);
  EXPECT_NE(r.err.find("provenance.n_ranks"), std::string::npos) << r.err;
  EXPECT_FALSE(fs::exists(out));

  r = test::run_cmd(mpirun(2) + capture_args(small_corpus(), out, "--samples 12 --checkpoint-every 2 --resume"));
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(sha256_file(out), sha256_file(mpi_file(2, 12))) << "resumed file differs from an uninterrupted run";
  EXPECT_FALSE(fs::exists(out + ".rank0.partial"));
  EXPECT_FALSE(fs::exists(out + ".rank1.partial"));
}
