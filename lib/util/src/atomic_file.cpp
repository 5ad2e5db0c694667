#include "kvq/util/atomic_file.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <mutex>
#include <sstream>

#include "kvq/util/error.hpp"

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
  std::ifstream f(path, std::ios::binary);
  if (!f) throw Error(path, "", "cannot open for reading");
  std::ostringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

}  // namespace kvq
