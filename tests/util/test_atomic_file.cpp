// write_atomically: nothing at the destination until the writer finished; no temporary left when the
// writer throws, when SIGINT/SIGTERM/SIGHUP stops the process mid-write (one line, exit 128 + the
// signal: issue 27), or after a SIGKILL once the path is written again.
#include <gtest/gtest.h>
#include <pthread.h>
#include <sched.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <csignal>
#include <filesystem>
#include <fstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "kvq/util/atomic_file.hpp"
#include "kvq/util/error.hpp"
#include "run_cmd.hpp"

namespace fs = std::filesystem;

TEST(AtomicFile, WriterExceptionLeavesNothing) {
  const auto out = kvq::test::temp_path("atomic-throw.bin");
  fs::remove(out);
  std::string tmp_seen;
  EXPECT_THROW(kvq::write_atomically(out,
                                     [&](const std::string& tmp) {
                                       tmp_seen = tmp;
                                       std::ofstream(tmp) << "half";
                                       throw std::runtime_error("disk full");
                                     }),
               std::runtime_error);
  EXPECT_FALSE(fs::exists(out));
  EXPECT_FALSE(tmp_seen.empty());
  EXPECT_FALSE(fs::exists(tmp_seen));
}

TEST(AtomicFile, ContentAppearsWhole) {
  const auto out = kvq::test::temp_path("atomic-ok.bin");
  kvq::write_file_atomically(out, "first");
  kvq::write_file_atomically(out, "second version");
  EXPECT_EQ(kvq::read_file(out), "second version");
  for (const auto& e : fs::directory_iterator(fs::path(out).parent_path()))
    EXPECT_EQ(e.path().string().find(out + ".tmp."), std::string::npos) << e.path();
}

// A child process gets `sig` while its writer is inside the temporary: it must stop with exit status
// 128 + sig and one line on stderr naming the signal and the interrupt note (issue 27: never a death
// by the signal), with neither the temporary nor the destination left.
TEST(AtomicFile, FatalSignalMidWriteRemovesTheTemporary) {
  for (int sig : {SIGINT, SIGTERM, SIGHUP}) {
    SCOPED_TRACE(sig);
    const auto out = kvq::test::temp_path("atomic-signal-" + std::to_string(sig) + ".bin");
    fs::remove(out);
    int ready[2], err[2];
    ASSERT_EQ(::pipe(ready), 0);
    ASSERT_EQ(::pipe(err), 0);
    const pid_t pid = ::fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      ::close(ready[0]);
      ::close(err[0]);
      ::dup2(err[1], 2);
      kvq::set_interrupt_note("the note of the test");
      // The test relies on default dispositions: under nohup, cron or a CI runner without job
      // control SIGINT/SIGHUP arrive ignored and are inherited so, and the child would never end.
      for (int s : {SIGINT, SIGTERM, SIGHUP}) ::signal(s, SIG_DFL);
      sigset_t none;
      sigemptyset(&none);
      ::sigprocmask(SIG_SETMASK, &none, nullptr);
      kvq::write_atomically(out, [&](const std::string& tmp) {
        std::ofstream(tmp) << std::string(1 << 16, 'x');
        const char c = 1;
        (void)!::write(ready[1], &c, 1);
        for (;;) ::pause();  // "still writing" until the signal arrives
      });
      ::_exit(0);  // not reached
    }
    ::close(ready[1]);
    ::close(err[1]);
    char c = 0;
    ASSERT_EQ(::read(ready[0], &c, 1), 1);
    ::close(ready[0]);
    const std::string tmp = out + ".tmp." + std::to_string(pid);
    EXPECT_TRUE(fs::exists(tmp)) << "the child writes " << tmp;
    ::kill(pid, sig);
    // Bounded wait: a child that survives its signal is a failure, not a hang.
    int status = 0;
    if (!kvq::test::wait_bounded(pid, &status)) FAIL() << "the writer did not end within 120 s of signal " << sig;
    EXPECT_TRUE(WIFEXITED(status)) << "died of signal " << (WIFSIGNALED(status) ? WTERMSIG(status) : 0);
    if (WIFEXITED(status)) {
      EXPECT_EQ(WEXITSTATUS(status), 128 + sig);
    }
    std::string line;
    char buf[512];
    for (ssize_t n; (n = ::read(err[0], buf, sizeof buf)) > 0;) line.append(buf, size_t(n));
    ::close(err[0]);
    const char* name = sig == SIGINT ? "SIGINT" : sig == SIGTERM ? "SIGTERM" : "SIGHUP";
    EXPECT_NE(line.find(std::string("interrupted by ") + name + "; the note of the test"), std::string::npos) << line;
    EXPECT_EQ(std::count(line.begin(), line.end(), '\n'), 1) << line;
    EXPECT_FALSE(fs::exists(tmp));
    EXPECT_FALSE(fs::exists(out));
  }
}

// A writer killed by SIGKILL leaves <path>.tmp.<pid>; writing the path again removes it, while a
// temporary of a writer that still runs (this test's parent) and unrelated names stay.
TEST(AtomicFile, RewriteRemovesTemporariesOfDeadWriters) {
  const auto out = kvq::test::temp_path("atomic-stale.bin");
  const pid_t dead = ::fork();
  ASSERT_GE(dead, 0);
  if (dead == 0) ::_exit(0);
  int status = 0;
  ASSERT_EQ(::waitpid(dead, &status, 0), dead);  // reaped: the pid names no process now
  const std::string stale = out + ".tmp." + std::to_string(dead);
  const std::string live = out + ".tmp." + std::to_string(::getppid());
  const std::string other = out + ".tmp.notapid";
  for (const auto& p : {stale, live, other}) std::ofstream(p) << "half";
  kvq::write_file_atomically(out, "whole");
  EXPECT_EQ(kvq::read_file(out), "whole");
  EXPECT_FALSE(fs::exists(stale));
  EXPECT_TRUE(fs::exists(live));
  EXPECT_TRUE(fs::exists(other));
  fs::remove(live);
  fs::remove(other);
  fs::remove(out);
}

// ---- OutputBatch and its directories (issue 38: kvq-inspect --plots left a `plots` directory when
// its output directory was removed mid-run and re-made).
namespace {

std::vector<std::string> listing(const fs::path& d) {
  std::vector<std::string> names;
  std::error_code ec;
  for (fs::recursive_directory_iterator it(d, ec), end; !ec && it != end; it.increment(ec))
    names.push_back(fs::relative(it->path(), d).string());
  std::sort(names.begin(), names.end());
  return names;
}

fs::path fresh_dir(const std::string& name) {
  const fs::path d = kvq::test::temp_path(name);
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

}  // namespace

// A new output directory is built aside (hidden) and appears whole at commit, with its files.
TEST(OutputBatch, NewDirectoryAppearsWholeAtCommit) {
  const fs::path d = fresh_dir("batch-new");
  {
    kvq::OutputBatch batch;
    kvq::make_output_dir((d / "plots/").string(), "--plots");
    kvq::write_file_atomically((d / "plots" / "a.png").string(), "a");
    kvq::write_file_atomically((d / "j.json").string(), "j");
    EXPECT_FALSE(fs::exists(d / "plots")) << "nothing at the target before commit";
    ASSERT_EQ(listing(d).size(), 3u);  // the hidden directory, its file, j's temporary
    batch.commit();
  }
  EXPECT_EQ(listing(d), (std::vector<std::string>{"j.json", "plots", "plots/a.png"}));
  EXPECT_EQ(kvq::read_file((d / "plots/a.png").string()), "a");
}

// An uncommitted batch takes its hidden directory and the parents it made with it; an existing
// directory's earlier files stay as they were.
TEST(OutputBatch, UncommittedLeavesOnlyWhatWasThere) {
  const fs::path d = fresh_dir("batch-drop");
  fs::create_directories(d / "old");
  kvq::write_file_atomically((d / "old/x.png").string(), "earlier");
  {
    kvq::OutputBatch batch;
    kvq::make_output_dir((d / "p/q/r").string(), "--plots");
    kvq::write_file_atomically((d / "p/q/r/a.png").string(), "a");
    kvq::make_output_dir((d / "old").string(), "--plots");
    kvq::write_file_atomically((d / "old/x.png").string(), "new");
    ASSERT_TRUE(fs::is_directory(d / "p/q")) << "parents are made at once";
  }
  EXPECT_EQ(listing(d), (std::vector<std::string>{"old", "old/x.png"}));
  EXPECT_EQ(kvq::read_file((d / "old/x.png").string()), "earlier");
}

// The output directory removed mid-run and made again (by whatever): commit fails with one error
// and leaves nothing of the run, neither in the re-made directory nor a `plots` in it.
TEST(OutputBatch, OutputDirectoryRemovedAndRemadeLeavesNothing) {
  const fs::path d = fresh_dir("batch-vanish");
  const fs::path o = d / "o";
  fs::create_directories(o);
  {
    kvq::OutputBatch batch;
    kvq::make_output_dir((o / "plots").string(), "--plots");
    kvq::write_file_atomically((o / "plots/a.png").string(), "a");
    kvq::write_file_atomically((o / "i.json").string(), "j");
    fs::remove_all(o);
    fs::create_directories(o);
    try {
      batch.commit();
      ADD_FAILURE() << "commit succeeded with its temporaries gone";
    } catch (const kvq::Error& e) {
      EXPECT_NE(std::string(e.what()).find("cannot rename temporary into place"), std::string::npos) << e.what();
    }
  }
  EXPECT_TRUE(listing(o).empty()) << listing(o).front();
}

// One temporary gone before commit (what a racing `rm -rf` of the output directory leaves: some
// files removed, a directory it could not remove): nothing is renamed and the new `plots` is gone
// too (the fault table's failure: "left behind: plots").
TEST(OutputBatch, CommitFailureLeavesNoNewDirectory) {
  const fs::path d = fresh_dir("batch-commit");
  {
    kvq::OutputBatch batch;
    kvq::make_output_dir((d / "plots").string(), "--plots");
    kvq::write_file_atomically((d / "plots/a.png").string(), "a");
    kvq::write_file_atomically((d / "i.json").string(), "j");
    fs::remove(d / ("i.json.tmp." + std::to_string(::getpid())));
    EXPECT_THROW(batch.commit(), kvq::Error);
  }
  const auto left = listing(d);
  EXPECT_TRUE(left.empty()) << left.front();
}

// Only the hidden directory gone (the file beside it still there): nothing is renamed, so the
// earlier file stays as it was.
TEST(OutputBatch, MissingPieceRenamesNothing) {
  const fs::path d = fresh_dir("batch-piece");
  kvq::write_file_atomically((d / "i.json").string(), "earlier");
  {
    kvq::OutputBatch batch;
    kvq::make_output_dir((d / "plots").string(), "--plots");
    kvq::write_file_atomically((d / "plots/a.png").string(), "a");
    kvq::write_file_atomically((d / "i.json").string(), "new");
    for (const auto& e : fs::directory_iterator(d))
      if (e.path().filename().string().rfind(".plots.kvq-tmp.", 0) == 0) fs::remove_all(e.path());
    EXPECT_THROW(batch.commit(), kvq::Error);
  }
  EXPECT_EQ(listing(d), (std::vector<std::string>{"i.json"}));
  EXPECT_EQ(kvq::read_file((d / "i.json").string()), "earlier");
}

// A hidden directory of a process that no longer runs (SIGKILL) is removed when the target is made
// again; a live one's (this test's parent) stays.
TEST(OutputBatch, DeadBuildDirectoriesAreRemoved) {
  const fs::path d = fresh_dir("batch-dead");
  const pid_t dead = ::fork();
  ASSERT_GE(dead, 0);
  if (dead == 0) ::_exit(0);
  int status = 0;
  ASSERT_EQ(::waitpid(dead, &status, 0), dead);
  const fs::path stale = d / (".plots.kvq-tmp." + std::to_string(dead));
  const fs::path live = d / (".plots.kvq-tmp." + std::to_string(::getppid()));
  fs::create_directories(stale / "sub");
  fs::create_directories(live);
  {
    kvq::OutputBatch batch;
    kvq::make_output_dir((d / "plots").string(), "--plots");
    kvq::write_file_atomically((d / "plots/a.png").string(), "a");
    batch.commit();
  }
  EXPECT_FALSE(fs::exists(stale));
  EXPECT_TRUE(fs::exists(live));
  EXPECT_TRUE(fs::exists(d / "plots/a.png"));
}

// SIGTERM while the batch is open: the handler removes the temporaries, the hidden directory and
// the parents the batch made; exit 143 with one line.
TEST(OutputBatch, SignalRemovesHiddenDirectoryAndMadeParents) {
  const fs::path d = fresh_dir("batch-signal");
  int ready[2], err[2];
  ASSERT_EQ(::pipe(ready), 0);
  ASSERT_EQ(::pipe(err), 0);
  const pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    ::close(ready[0]);
    ::close(err[0]);
    ::dup2(err[1], 2);
    for (int s : {SIGINT, SIGTERM, SIGHUP}) ::signal(s, SIG_DFL);  // explicit: nohup/CI may ignore them
    sigset_t none;
    sigemptyset(&none);
    ::sigprocmask(SIG_SETMASK, &none, nullptr);
    kvq::OutputBatch batch;
    kvq::make_output_dir((d / "x/y/plots").string(), "--plots");
    kvq::make_output_dir((d / "x/y/plots/sub").string(), "--plots");
    kvq::write_file_atomically((d / "x/y/plots/sub/a.png").string(), "a");
    kvq::write_file_atomically((d / "j.json").string(), "j");
    const char c = 1;
    (void)!::write(ready[1], &c, 1);
    for (;;) ::pause();
  }
  ::close(ready[1]);
  ::close(err[1]);
  char c = 0;
  ASSERT_EQ(::read(ready[0], &c, 1), 1);
  ::close(ready[0]);
  EXPECT_FALSE(listing(d).empty());
  ::kill(pid, SIGTERM);
  int status = 0;
  if (!kvq::test::wait_bounded(pid, &status)) FAIL() << "the child did not end after SIGTERM";
  std::string line;
  char buf[512];
  for (ssize_t n; (n = ::read(err[0], buf, sizeof buf)) > 0;) line.append(buf, size_t(n));
  ::close(err[0]);
  ASSERT_TRUE(WIFEXITED(status)) << "died of signal " << (WIFSIGNALED(status) ? WTERMSIG(status) : 0);
  EXPECT_EQ(WEXITSTATUS(status), 128 + SIGTERM);
  EXPECT_EQ(std::count(line.begin(), line.end(), '\n'), 1) << line;
  const auto left = listing(d);
  EXPECT_TRUE(left.empty()) << left.front();
}

// A stop signal sent to the process is taken by whichever thread does not block it. Taken by a
// worker (a BLAS or MPI progress thread) while the main thread writes, the handler used to unlink the
// temporaries and exit under the writer's feet — or before the writer created its file, which was
// then left behind (the fault table's mpirun SIGTERM case, on CI). The handler now runs on the main
// thread only: here the main thread holds the stop signals (as OutputBatch::commit does) while a
// worker that does not is the signal's only taker; the signal must wait for the main thread, whose
// output is then whole, and the process ends 143 with one line.
TEST(AtomicFile, SignalTakenByAWorkerWaitsForTheMainThread) {
  const auto out = kvq::test::temp_path("atomic-worker-signal.bin");
  fs::remove(out);
  int ready[2], go[2], err[2];
  ASSERT_EQ(::pipe(ready), 0);
  ASSERT_EQ(::pipe(go), 0);
  ASSERT_EQ(::pipe(err), 0);
  const pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    ::dup2(err[1], 2);
    for (int s : {SIGINT, SIGTERM, SIGHUP}) ::signal(s, SIG_DFL);
    kvq::install_interrupt_handlers();
    sigset_t stop;
    sigemptyset(&stop);
    for (int s : {SIGINT, SIGTERM, SIGHUP}) sigaddset(&stop, s);
    ::pthread_sigmask(SIG_BLOCK, &stop, nullptr);
    int worker_up[2];
    if (::pipe(worker_up) != 0) ::_exit(4);
    std::thread([&] {
      ::pthread_sigmask(SIG_UNBLOCK, &stop, nullptr);
      const char c = 1;
      (void)!::write(worker_up[1], &c, 1);
      for (;;) ::pause();
    }).detach();
    char c = 0;
    if (::read(worker_up[0], &c, 1) != 1) ::_exit(4);
    kvq::write_atomically(out, [&](const std::string& tmp) {
      std::ofstream(tmp) << "first half, ";
      (void)!::write(ready[1], &c, 1);
      if (::read(go[0], &c, 1) != 1) ::_exit(5);  // the parent has sent the signal
      // The signal, passed on by the worker, waits for this thread (a signal that never arrives here
      // is the parent's bounded wait failing, with this child killed).
      for (;;) {
        sigset_t pending;
        sigpending(&pending);
        if (sigismember(&pending, SIGTERM)) break;
        sched_yield();
      }
      std::ofstream(tmp, std::ios::app) << "second half";
    });
    ::pthread_sigmask(SIG_UNBLOCK, &stop, nullptr);  // the pending SIGTERM is taken here
    ::_exit(0);
  }
  ::close(ready[1]);
  ::close(go[0]);
  ::close(err[1]);
  char c = 0;
  ASSERT_EQ(::read(ready[0], &c, 1), 1);
  ::kill(pid, SIGTERM);
  ASSERT_EQ(::write(go[1], &c, 1), 1);
  int status = 0;
  if (!kvq::test::wait_bounded(pid, &status)) {
    ::kill(pid, SIGKILL);
    ::waitpid(pid, &status, 0);
    FAIL() << "the signal never reached the main thread (the writer did not end within 120 s)";
  }
  ASSERT_TRUE(WIFEXITED(status)) << "died of signal " << (WIFSIGNALED(status) ? WTERMSIG(status) : 0);
  EXPECT_EQ(WEXITSTATUS(status), 128 + SIGTERM);
  std::string line;
  char buf[512];
  for (ssize_t n; (n = ::read(err[0], buf, sizeof buf)) > 0;) line.append(buf, size_t(n));
  EXPECT_NE(line.find("interrupted by SIGTERM"), std::string::npos) << line;
  EXPECT_EQ(std::count(line.begin(), line.end(), '\n'), 1) << line;
  EXPECT_TRUE(fs::exists(out)) << "the handler ran beside the writer, not after it";
  if (fs::exists(out)) {
    EXPECT_EQ(kvq::read_file(out), "first half, second half");
  }
  EXPECT_FALSE(fs::exists(out + ".tmp." + std::to_string(pid)));
  for (int fd : {ready[0], go[1], err[0]}) ::close(fd);
  fs::remove(out);
}
