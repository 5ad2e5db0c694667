// write_atomically: nothing at the destination until the writer finished; no temporary left when the
// writer throws or when the process is killed by SIGINT/SIGTERM/SIGHUP mid-write.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

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

// A child process is killed by `sig` while its writer is inside the temporary: it must die of that
// signal (the handler re-raises), with neither the temporary nor the destination left.
TEST(AtomicFile, FatalSignalMidWriteRemovesTheTemporary) {
  for (int sig : {SIGINT, SIGTERM, SIGHUP}) {
    SCOPED_TRACE(sig);
    const auto out = kvq::test::temp_path("atomic-signal-" + std::to_string(sig) + ".bin");
    fs::remove(out);
    int ready[2];
    ASSERT_EQ(::pipe(ready), 0);
    const pid_t pid = ::fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      ::close(ready[0]);
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
    char c = 0;
    ASSERT_EQ(::read(ready[0], &c, 1), 1);
    ::close(ready[0]);
    const std::string tmp = out + ".tmp." + std::to_string(pid);
    EXPECT_TRUE(fs::exists(tmp)) << "the child writes " << tmp;
    ::kill(pid, sig);
    // Bounded wait: a child that survives its signal is a failure, not a hang.
    int status = 0;
    pid_t got = 0;
    for (int i = 0; i < 1000 && got == 0; ++i) {
      got = ::waitpid(pid, &status, WNOHANG);
      if (got == 0) ::usleep(10000);
    }
    if (got == 0) {
      ::kill(pid, SIGKILL);
      ::waitpid(pid, &status, 0);
      FAIL() << "the writer did not end within 10 s of signal " << sig;
    }
    ASSERT_EQ(got, pid);
    EXPECT_TRUE(WIFSIGNALED(status));
    if (WIFSIGNALED(status)) EXPECT_EQ(WTERMSIG(status), sig);
    EXPECT_FALSE(fs::exists(tmp));
    EXPECT_FALSE(fs::exists(out));
  }
}
