#include "kvq/util/atomic_file.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <sstream>

#include "kvq/util/error.hpp"
#include "kvq/util/fault_guard.hpp"

namespace kvq {

static void fsync_path(const std::string& p) {
  int fd = ::open(p.c_str(), O_RDONLY);
  if (fd >= 0) {
    ::fsync(fd);
    ::close(fd);
  }
}

// Temporaries being written, removed by the handler when SIGINT / SIGTERM / SIGHUP ends the process
// mid-write (Ctrl-C, `kill`, mpirun stopping a job), so no `<path>.tmp.<pid>` is left behind. The
// handler only reads fixed buffers and calls unlink/signal/raise (async-signal-safe); a slot is
// published by setting `used` after its path is complete.
namespace {
constexpr int kSlots = 8;
struct Slot {
  std::atomic<int> used{0};
  char path[4096];
};
Slot g_slots[kSlots];
std::mutex g_slots_mu;

extern "C" void kvq_remove_temporaries_and_die(int sig) {
  for (auto& s : g_slots)
    if (s.used.load()) ::unlink(s.path);
  std::signal(sig, SIG_DFL);
  std::raise(sig);
}

// Fault guard (fault_guard.hpp): the file being read when a fault is turned into an error.
char g_fault_file[4096];
std::atomic<int> g_fault_depth{0};

void write_all(int fd, const char* s) {
  size_t n = 0;
  while (s[n]) ++n;
  while (n > 0) {
    const ssize_t w = ::write(fd, s, n);
    if (w <= 0) return;
    s += w;
    n -= size_t(w);
  }
}

extern "C" void kvq_fault_to_error(int sig) {
  if (g_fault_depth.load() <= 0) {  // not inside a guarded read: an ordinary crash
    std::signal(sig, SIG_DFL);
    std::raise(sig);
    return;
  }
  for (auto& s : g_slots)
    if (s.used.load()) ::unlink(s.path);
  write_all(2, program_invocation_short_name);
  write_all(2, ": error: ");
  write_all(2, g_fault_file);
  write_all(2, ": corrupt file: the HDF5 library faulted reading its metadata (");
  write_all(2, sig == SIGSEGV ? "SIGSEGV" : sig == SIGBUS ? "SIGBUS" : "SIGFPE");
  write_all(2, ")\n");
  ::_exit(2);
}

void install_fault_handlers_once() {
  static std::mutex mu;
  std::lock_guard<std::mutex> lock(mu);
  for (int sig : {SIGSEGV, SIGBUS, SIGFPE}) {
    struct sigaction old {};
    if (::sigaction(sig, nullptr, &old) != 0) continue;
    if (old.sa_handler == kvq_fault_to_error) continue;
    // Leave a handler someone else installed alone (ASan, libFuzzer, a debugger's runtime).
    if ((old.sa_flags & SA_SIGINFO) != 0 || old.sa_handler != SIG_DFL) continue;
    struct sigaction sa {};
    sa.sa_handler = kvq_fault_to_error;
    sigemptyset(&sa.sa_mask);
    ::sigaction(sig, &sa, nullptr);
  }
}

// Checked at every write rather than once per process: a forked child may have restored default
// dispositions that its parent (started under nohup, say) had ignored. Three sigaction calls per
// file written cost nothing beside the fsync.
void install_handlers_once() {
  static std::mutex mu;
  std::lock_guard<std::mutex> lock(mu);
  for (int sig : {SIGINT, SIGTERM, SIGHUP}) {
    struct sigaction old {};
    if (::sigaction(sig, nullptr, &old) != 0) continue;
    // Leave a handler someone else installed (or an ignored signal) alone.
    if ((old.sa_flags & SA_SIGINFO) != 0 || old.sa_handler != SIG_DFL) continue;
    std::signal(sig, kvq_remove_temporaries_and_die);
  }
}

// Registers `tmp` for removal on a fatal signal while alive; no-op when every slot is taken or the
// path is too long (the temporary is then only removed on exceptions, as before).
class TemporaryGuard {
 public:
  explicit TemporaryGuard(const std::string& tmp) {
    install_handlers_once();
    if (tmp.size() >= sizeof(Slot::path)) return;
    std::lock_guard<std::mutex> lock(g_slots_mu);
    for (int i = 0; i < kSlots; ++i)
      if (!g_slots[i].used.load()) {
        std::memcpy(g_slots[i].path, tmp.c_str(), tmp.size() + 1);
        g_slots[i].used.store(1);
        slot_ = i;
        return;
      }
  }
  ~TemporaryGuard() {
    if (slot_ >= 0) g_slots[slot_].used.store(0);
  }
  TemporaryGuard(const TemporaryGuard&) = delete;
  TemporaryGuard& operator=(const TemporaryGuard&) = delete;

 private:
  int slot_ = -1;
};
}  // namespace

FaultGuard::FaultGuard(const std::string& file) {
  install_fault_handlers_once();
  std::memcpy(previous_, g_fault_file, sizeof(previous_));
  const size_t n = std::min(file.size(), sizeof(g_fault_file) - 1);
  g_fault_depth.fetch_add(1);
  std::memcpy(g_fault_file, file.data(), n);
  g_fault_file[n] = 0;
  active_ = true;
}

FaultGuard::~FaultGuard() {
  if (!active_) return;
  std::memcpy(g_fault_file, previous_, sizeof(previous_));
  g_fault_depth.fetch_sub(1);
}

void write_atomically(const std::string& path, const std::function<void(const std::string&)>& writer) {
  const std::string tmp = path + ".tmp." + std::to_string(::getpid());
  TemporaryGuard guard(tmp);
  try {
    writer(tmp);
  } catch (...) {
    std::remove(tmp.c_str());
    throw;
  }
  fsync_path(tmp);
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    int e = errno;
    std::remove(tmp.c_str());
    throw Error(path, "", std::string("cannot rename temporary into place: ") + std::strerror(e));
  }
  auto slash = path.find_last_of('/');
  fsync_path(slash == std::string::npos ? "." : path.substr(0, slash + 1));
}

void write_file_atomically(const std::string& path, const std::string& bytes) {
  write_atomically(path, [&](const std::string& tmp) {
    std::ofstream f(tmp, std::ios::binary);
    if (!f) throw Error(tmp, "", "cannot open for writing");
    f.write(bytes.data(), std::streamsize(bytes.size()));
    f.close();
    if (!f) throw Error(tmp, "", "write failed");
  });
}

std::string read_file(const std::string& path) {
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec)) throw Error(path, "", "is a directory, not a file");
  std::ifstream f(path, std::ios::binary);
  if (!f) throw Error(path, "", "cannot open for reading");
  std::ostringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

}  // namespace kvq
