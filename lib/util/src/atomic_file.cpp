#include "kvq/util/atomic_file.hpp"

#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <mutex>
#include <vector>
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
// handler only reads fixed buffers and calls unlink/write/_exit (async-signal-safe); a slot is
// published by setting `used` after its path is complete.
namespace {
constexpr int kSlots = 256;  // an OutputBatch holds one per file until it commits (kvq-inspect --plots: dozens)
struct Slot {
  std::atomic<int> used{0};
  char path[4096];
};
Slot g_slots[kSlots];
std::mutex g_slots_mu;

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

// What the interrupt line adds after "<tool>: interrupted by SIGTERM; " (set_interrupt_note): two
// buffers, the handler reads the one published last.
char g_notes[2][2048];
std::atomic<int> g_note{-1};
std::mutex g_note_mu;

// SIGINT / SIGTERM / SIGHUP: remove the temporaries being written, say so in one line, exit
// 128 + the signal (130, 143, 129) — a stop, not a death by the signal. Only async-signal-safe
// calls (unlink, write, _exit) on fixed buffers.
extern "C" void kvq_remove_temporaries_and_exit(int sig) {
  for (auto& s : g_slots)
    if (s.used.load()) ::unlink(s.path);
  write_all(2, program_invocation_short_name);
  write_all(2, sig == SIGINT ? ": interrupted by SIGINT; " : sig == SIGTERM ? ": interrupted by SIGTERM; " : ": interrupted by SIGHUP; ");
  const int n = g_note.load();
  write_all(2, n >= 0 ? g_notes[n] : "stopped, no partial output left");
  write_all(2, "\n");
  ::_exit(128 + sig);
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
    struct sigaction sa {};
    sa.sa_handler = kvq_remove_temporaries_and_exit;
    sigemptyset(&sa.sa_mask);
    ::sigaction(sig, &sa, nullptr);
  }
}

// `<path>.tmp.<pid>` of writers that no longer run (a SIGKILL, a power cut): removed before the
// path is written again, so a rerun leaves nothing behind.
void remove_stale_temporaries(const std::string& path) {
  const std::filesystem::path p(path);
  const std::filesystem::path dir = p.parent_path().empty() ? std::filesystem::path(".") : p.parent_path();
  const std::string prefix = p.filename().string() + ".tmp.";
  std::error_code ec;
  for (std::filesystem::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (name.compare(0, prefix.size(), prefix) != 0) continue;
    const std::string pid_text = name.substr(prefix.size());
    if (pid_text.empty() || pid_text.find_first_not_of("0123456789") != std::string::npos || pid_text.size() > 9) continue;
    const pid_t pid = pid_t(std::stol(pid_text));
    if (pid == ::getpid() || ::kill(pid, 0) == 0 || errno != ESRCH) continue;  // alive, or not ours to judge
    std::error_code rm;
    std::filesystem::remove(it->path(), rm);
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

void install_interrupt_handlers() { install_handlers_once(); }

void set_interrupt_note(const std::string& note) {
  std::lock_guard<std::mutex> lock(g_note_mu);
  const int next = g_note.load() == 0 ? 1 : 0;
  const size_t n = std::min(note.size(), sizeof(g_notes[0]) - 1);
  std::memcpy(g_notes[next], note.data(), n);
  g_notes[next][n] = 0;
  g_note.store(next);
}

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

namespace {

// The open OutputBatch's finished temporaries (and their signal slots) and the directories it made.
struct Batch {
  struct Kept {
    std::string tmp, path;
    std::unique_ptr<TemporaryGuard> guard;
  };
  std::vector<Kept> kept;
  std::vector<std::string> made_dirs;
};
std::mutex g_batch_mu;
Batch* g_batch = nullptr;

void rename_into_place(const std::string& tmp, const std::string& path) {
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    int e = errno;
    std::remove(tmp.c_str());
    throw Error(path, "", std::string("cannot rename temporary into place: ") + std::strerror(e));
  }
  auto slash = path.find_last_of('/');
  fsync_path(slash == std::string::npos ? "." : path.substr(0, slash + 1));
}

}  // namespace

void write_atomically(const std::string& path, const std::function<void(const std::string&)>& writer) {
  const std::string tmp = path + ".tmp." + std::to_string(::getpid());
  remove_stale_temporaries(path);
  auto guard = std::make_unique<TemporaryGuard>(tmp);
  try {
    writer(tmp);
  } catch (...) {
    std::remove(tmp.c_str());
    throw;
  }
  fsync_path(tmp);
  {
    std::lock_guard<std::mutex> lock(g_batch_mu);
    if (g_batch) {  // renamed with the others when the batch commits
      g_batch->kept.push_back({tmp, path, std::move(guard)});
      return;
    }
  }
  rename_into_place(tmp, path);
}

OutputBatch::OutputBatch() {
  std::lock_guard<std::mutex> lock(g_batch_mu);
  KVQ_ASSERT(g_batch == nullptr);  // one at a time
  g_batch = new Batch;
}

OutputBatch::~OutputBatch() {
  Batch* b = nullptr;
  {
    std::lock_guard<std::mutex> lock(g_batch_mu);
    std::swap(b, g_batch);
  }
  if (!b) return;  // committed
  for (const auto& k : b->kept) std::remove(k.tmp.c_str());
  for (auto it = b->made_dirs.rbegin(); it != b->made_dirs.rend(); ++it) {
    std::error_code ec;
    std::filesystem::remove(*it, ec);  // only when empty
  }
  delete b;
}

void OutputBatch::commit() {
  Batch* b = nullptr;
  {
    std::lock_guard<std::mutex> lock(g_batch_mu);
    std::swap(b, g_batch);
  }
  if (!b) return;
  std::unique_ptr<Batch> own(b);
  // Signals wait while the files go into place, so a stop leaves all of them or none renamed.
  sigset_t block, old;
  sigemptyset(&block);
  for (int sig : {SIGINT, SIGTERM, SIGHUP}) sigaddset(&block, sig);
  ::pthread_sigmask(SIG_BLOCK, &block, &old);
  try {
    for (auto& k : b->kept) {
      rename_into_place(k.tmp, k.path);
      k.guard.reset();
    }
  } catch (...) {
    for (const auto& k : b->kept)
      if (k.guard) std::remove(k.tmp.c_str());
    ::pthread_sigmask(SIG_SETMASK, &old, nullptr);
    throw;
  }
  set_interrupt_note("every output was already written");
  ::pthread_sigmask(SIG_SETMASK, &old, nullptr);
}

void make_output_dir(const std::string& dir, const std::string& field) {
  namespace fs = std::filesystem;
  std::error_code ec;
  fs::path first_new;  // the outermost directory this call creates
  for (fs::path p = fs::absolute(dir, ec); !p.empty() && !fs::exists(p, ec); p = p.parent_path()) {
    first_new = p;
    if (p == p.parent_path()) break;
  }
  fs::create_directories(dir, ec);
  if (ec) throw Error(dir, field, "cannot create the directory: " + ec.message());
  if (first_new.empty()) return;
  std::lock_guard<std::mutex> lock(g_batch_mu);
  if (!g_batch) return;
  // Removed (innermost first, each only when empty) if the batch does not commit.
  std::vector<std::string> chain;
  for (fs::path p = fs::absolute(dir, ec); !p.empty(); p = p.parent_path()) {
    chain.push_back(p.string());
    if (p == first_new) break;
  }
  for (auto it = chain.rbegin(); it != chain.rend(); ++it) g_batch->made_dirs.push_back(*it);
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
