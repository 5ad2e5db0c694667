#pragma once
// Runs a tool as a child process and captures its exit status, stderr and peak RSS, so tests check
// what a user sees (one-line errors, exit codes, no partial files).
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <csignal>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>

namespace kvq::test {

struct CmdResult {
  int status = -1;        // exit code, or 128+signal
  std::string err;        // stderr
  long max_rss_kb = 0;
};

inline CmdResult run_cmd(const std::string& cmd) {
  static int counter = 0;
  const std::string errf = ::testing::TempDir() + "kvq_cmd_err_" + std::to_string(::getpid()) + "_" +
                           std::to_string(counter++) + ".txt";
  pid_t pid = ::fork();
  if (pid == 0) {
    std::string full = cmd + " 2>" + errf;
    ::execl("/bin/sh", "sh", "-c", full.c_str(), static_cast<char*>(nullptr));
    ::_exit(127);
  }
  int st = 0;
  struct rusage ru {};
  ::wait4(pid, &st, 0, &ru);
  CmdResult r;
  r.status = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
  r.max_rss_kb = ru.ru_maxrss;
  std::ifstream f(errf);
  std::stringstream ss;
  ss << f.rdbuf();
  r.err = ss.str();
  std::remove(errf.c_str());
  return r;
}

inline std::string bin(const std::string& tool) { return std::string(KVQ_BIN_DIR) + "/" + tool; }

// waitpid bounded by `seconds`: true when the child ended (its status in *status); otherwise it is
// killed, reaped and false — a child that does not end is a failure, never a hang. The bound is
// far above what any caller needs (a child that has been signalled, or ends at once), so a loaded
// machine does not reach it.
inline bool wait_bounded(pid_t pid, int* status, int seconds = 120) {
  for (int i = 0; i < seconds * 100; ++i) {
    const pid_t got = ::waitpid(pid, status, WNOHANG);
    if (got == pid) return true;
    if (got < 0) return false;
    ::usleep(10000);
  }
  ::kill(pid, SIGKILL);
  ::waitpid(pid, status, 0);
  return false;
}

inline std::string temp_path(const std::string& name) {
  return ::testing::TempDir() + "kvq_" + std::to_string(::getpid()) + "_" + name;
}

inline void write_text(const std::string& path, const std::string& s) {
  std::ofstream f(path, std::ios::binary);
  f << s;
}

}  // namespace kvq::test
