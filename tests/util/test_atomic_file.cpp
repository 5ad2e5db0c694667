// write_atomically: nothing at the destination until the writer finished; no temporary left when the
// writer throws, when SIGINT/SIGTERM/SIGHUP stops the process mid-write (one line, exit 128 + the
// signal: issue 27), or after a SIGKILL once the path is written again.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <csignal>
#include <filesystem>
#include <fstream>
#include <stdexcept>

#include "kvq/util/atomic_file.hpp"
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
    if (!kvq::test::wait_bounded(pid, &status)) FAIL() << "the writer did not end within 10 s of signal " << sig;
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
