// What every tool does with a bad command line or a bad file in any file argument: exit 2 for usage
// errors (not CLI11's 100+ codes), 1 or 2 with one line for bad files, never a signal (HDF5's C++
// exceptions are not std::exceptions and used to abort kvq-inspect).
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <csignal>
#include <sys/wait.h>
#include <unistd.h>

#include "run_cmd.hpp"

namespace fs = std::filesystem;
using kvq::test::bin;
using kvq::test::run_cmd;

namespace {

const std::string kDemo = std::string(KVQ_SOURCE_DIR) + "/data/kvq-demo-llama";
const std::string kGolden = std::string(KVQ_SOURCE_DIR) + "/data/golden";
const std::vector<std::string> kTools = {"calib-capture", "kvq-allocate", "kvq-verify", "kvq-inspect", "kvq-eval",
                                         "kvq-generate", "kvq-tokenize", "kvq-probe"};

int lines(const std::string& s) { return int(std::count(s.begin(), s.end(), '\n')); }

TEST(CliUsage, UnknownFlagAndBadValueExit2WithOneLine) {
  for (const auto& tool : kTools) {
    SCOPED_TRACE(tool);
    auto r = run_cmd(bin(tool) + " --no-such-flag");
    EXPECT_EQ(r.status, 2) << r.err;
    EXPECT_EQ(lines(r.err), 1) << r.err;
    EXPECT_NE(r.err.find(tool), std::string::npos) << r.err;
    r = run_cmd(bin(tool) + " --threads -3");
    EXPECT_EQ(r.status, 2) << r.err;
    EXPECT_EQ(lines(r.err), 1) << r.err;
    r = run_cmd(bin(tool) + " --help > /dev/null");
    EXPECT_EQ(r.status, 0) << r.err;
  }
}

struct BadFiles {
  std::string empty, garbage, hdf5_corrupt, truncated_calib;
  BadFiles() {
    empty = kvq::test::temp_path("empty.bin");
    garbage = kvq::test::temp_path("garbage.bin");
    truncated_calib = kvq::test::temp_path("truncated.kvqcal.h5");
    kvq::test::write_text(empty, "");
    kvq::test::write_text(garbage, std::string("\x89HDF\r\n\x1a\n", 8) + std::string(300, '\x7f'));
    hdf5_corrupt = std::string(KVQ_SOURCE_DIR) + "/tests/fuzz/regressions/alloc/root-group-throws";
    std::ifstream in(kGolden + "/calib-v2.kvqcal.h5", std::ios::binary);
    std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    kvq::test::write_text(truncated_calib, bytes.substr(0, bytes.size() / 3));
  }
  std::vector<std::string> all() const { return {empty, garbage, hdf5_corrupt, truncated_calib}; }
};

// Each command has one placeholder {} replaced by every bad file in turn.
TEST(CliUsage, EveryFileArgumentRejectsBadFilesWithoutASignal) {
  const BadFiles bad;
  const std::string cal = kGolden + "/calib-v2.kvqcal.h5", alloc = kGolden + "/block-gtq-v1.kvqalloc.h5";
  const std::string out = kvq::test::temp_path("never-written.out");
  const std::vector<std::string> commands = {
      bin("kvq-allocate") + " -q --calib {} --method uniform --bpd 2 --out " + out,
      bin("kvq-verify") + " -q --calib {} --alloc " + alloc,
      bin("kvq-verify") + " -q --calib " + cal + " --alloc {}",
      bin("kvq-inspect") + " -q {}",
      bin("kvq-inspect") + " -q " + alloc + " --calib {}",
      bin("kvq-eval") + " -q --model " + kDemo + " --alloc {} --text " + kDemo + "/psalm23.txt",
      bin("kvq-eval") + " -q --model " + kDemo + " --alloc " + alloc + " --calib {} --text " + kDemo + "/psalm23.txt",
      bin("kvq-generate") + " -q --model {} --steps 1",
      bin("kvq-generate") + " -q --model " + kDemo + " --tokenizer {} --steps 1",
      bin("kvq-tokenize") + " -q --model " + kDemo + " --tokenizer {} --string x --json " + out,
      bin("calib-capture") + " -q --model {} --corpus " + kDemo + "/psalm23.txt --samples 1 --seq-len 16 --out " + out,
      bin("calib-capture") + " -q --model " + kDemo + " --tokenizer {} --corpus " + kDemo +
          "/psalm23.txt --samples 1 --seq-len 16 --out " + out,
  };
  for (const auto& cmd : commands)
    for (const auto& f : bad.all()) {
      std::string c = cmd;
      c.replace(c.find("{}"), 2, f);
      SCOPED_TRACE(c);
      const auto r = run_cmd(c + " > /dev/null");
      EXPECT_TRUE(r.status == 1 || r.status == 2) << "exit " << r.status << ": " << r.err;
      EXPECT_EQ(lines(r.err), 1) << r.err;
      EXPECT_FALSE(fs::exists(out));
    }
}

// A calibration file on which libhdf5 itself faults (a memcpy past its buffer while decoding the
// root group's attribute messages; found by fuzz_merge). The readers' FaultGuard turns the fault
// into the usual one-line error and exit 2; the file must never reach the readers' in-process tests
// (it would end the test process), so it lives outside regressions/calib.
TEST(CliUsage, LibraryFaultOnCorruptHdf5IsAnError) {
  const std::string f = std::string(KVQ_SOURCE_DIR) + "/tests/fuzz/regressions/hdf5-faults/calib-attr-message-memcpy.kvqcal.h5";
  ASSERT_TRUE(fs::exists(f));
  const std::string out = kvq::test::temp_path("fault-never-written.out");
  fs::remove(out);
  for (const std::string& cmd : {bin("kvq-inspect") + " -q " + f, bin("kvq-allocate") + " -q --calib " + f + " --bpd 3 --out " + out,
                                 bin("kvq-verify") + " -q --calib " + f + " --alloc " + kGolden + "/block-gtq-v1.kvqalloc.h5"}) {
    SCOPED_TRACE(cmd);
    const auto r = run_cmd(cmd + " > /dev/null");
    EXPECT_EQ(r.status, 2) << r.err;
    EXPECT_EQ(lines(r.err), 1) << r.err;
    EXPECT_NE(r.err.find("calib-attr-message-memcpy.kvqcal.h5"), std::string::npos) << r.err;
    EXPECT_FALSE(fs::exists(out));
  }
}

// Output on stdout that cannot be written is a fault of the environment like a full output disk:
// one line naming stdout, exit 2 -- not a silent exit 0 (a full disk) and not death by SIGPIPE (a
// reader that went away). The pipe's read end is closed before the tool starts, so every write fails.
int run_with_closed_pipe(const std::string& cmd, std::string* err_text) {
  const std::string err_path = kvq::test::temp_path("closed_pipe.err");
  int fds[2];
  if (::pipe(fds) != 0) return -1;
  ::close(fds[0]);
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::signal(SIGPIPE, SIG_DFL);  // as a shell would start it
    ::dup2(fds[1], 1);
    ::close(fds[1]);
    ::execl("/bin/sh", "sh", "-c", ("exec timeout -s KILL 120 " + cmd + " 2>" + err_path).c_str(), (char*)nullptr);
    ::_exit(127);
  }
  ::close(fds[1]);
  int status = 0;
  ::waitpid(pid, &status, 0);  // bounded: timeout kills the tool after 120 s
  std::ifstream in(err_path);
  err_text->assign((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

TEST(CliUsage, StdoutThatCannotBeWrittenIsAnErrorNotASignal) {
  const std::string cal = kGolden + "/calib-v2.kvqcal.h5";
  for (const std::string& cmd : {bin("kvq-inspect") + " " + cal, bin("kvq-tokenize") + " -q --model " + kDemo + " --string hello"}) {
    SCOPED_TRACE(cmd);
    auto r = run_cmd(cmd + " > /dev/full");
    EXPECT_EQ(r.status, 2) << r.err;
    EXPECT_NE(r.err.find("error: stdout: No space left on device"), std::string::npos) << r.err;
    std::string err;
    const int rc = run_with_closed_pipe(cmd, &err);
    EXPECT_EQ(rc, 2) << err;
    EXPECT_NE(err.find("error: stdout: Broken pipe"), std::string::npos) << err;
    EXPECT_EQ(std::count(err.begin(), err.end(), '\n'), 1) << err;
  }
}

}  // namespace
