#include "kvq/util/atomic_file.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/syscall.h>
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
// Directories an OutputBatch made (hidden siblings being built, parents it created), in the order
// made: after the files above are unlinked, the handlers rmdir them newest first (only empty ones go).
constexpr int kDirSlots = 64;
Slot g_dir_slots[kDirSlots];

void remove_registered(void) {
  for (auto& s : g_slots)
    if (s.used.load()) ::unlink(s.path);
  for (int i = kDirSlots - 1; i >= 0; --i)
    if (g_dir_slots[i].used.load()) ::rmdir(g_dir_slots[i].path);
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

// What the interrupt line adds after "<tool>: interrupted by SIGTERM; " (set_interrupt_note): two
// buffers, the handler reads the one published last.
char g_notes[2][2048];
std::atomic<int> g_note{-1};
std::mutex g_note_mu;

// The process's main thread (static initialisation runs on it), where every output is written. A
// stop signal sent to the process may be taken by any thread that does not block it (a BLAS or MPI
// progress thread, the progress printer); run on such a thread, the handler would unlink the
// temporaries while the main thread goes on writing — and could create one after the unlink, left
// behind by the _exit (mpirun's SIGTERM to a rank finishing its file). So the handler runs on the
// main thread only: elsewhere it passes the signal on to it, where it waits if the main thread holds
// the stop signals (OutputBatch::commit renaming its files).
// In a forked child the thread that called fork is the only one, and its main thread.
pid_t g_main_pid = 0, g_main_tid = 0;
extern "C" void kvq_note_main_thread() {
  g_main_pid = ::getpid();
  g_main_tid = pid_t(::syscall(SYS_gettid));
}
struct MainThread {
  MainThread() {
    kvq_note_main_thread();
    ::pthread_atfork(nullptr, nullptr, kvq_note_main_thread);
  }
} g_main_thread;

// True when the signal was passed on to the main thread (the caller then returns).
bool passed_to_main_thread(int sig) {
  if (g_main_tid <= 0 || ::getpid() != g_main_pid) return false;  // a child made without fork()
  if (pid_t(::syscall(SYS_gettid)) == g_main_tid) return false;
  const int saved = errno;
  const bool sent = ::syscall(SYS_tgkill, g_main_pid, g_main_tid, sig) == 0;  // fails only when main is gone
  errno = saved;
  return sent;
}

// SIGINT / SIGTERM / SIGHUP: remove the temporaries being written, say so in one line, exit
// 128 + the signal (130, 143, 129) — a stop, not a death by the signal. Only async-signal-safe
// calls (gettid, tgkill, unlink, write, _exit) on fixed buffers.
extern "C" void kvq_remove_temporaries_and_exit(int sig) {
  if (passed_to_main_thread(sig)) return;
  remove_registered();
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
  remove_registered();
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

namespace fs = std::filesystem;

// Registers a directory for the signal handlers' rmdir (after the files) while alive; newer
// directories take higher slots, so the handler removes the innermost first.
class DirGuard {
 public:
  explicit DirGuard(const std::string& dir) {
    install_handlers_once();
    if (dir.size() >= sizeof(Slot::path)) return;
    std::lock_guard<std::mutex> lock(g_slots_mu);
    int next = 0;
    for (int i = 0; i < kDirSlots; ++i)
      if (g_dir_slots[i].used.load()) next = i + 1;
    if (next >= kDirSlots) return;
    std::memcpy(g_dir_slots[next].path, dir.c_str(), dir.size() + 1);
    g_dir_slots[next].used.store(1);
    slot_ = next;
  }
  ~DirGuard() {
    if (slot_ >= 0) g_dir_slots[slot_].used.store(0);
  }
  DirGuard(const DirGuard&) = delete;
  DirGuard& operator=(const DirGuard&) = delete;

 private:
  int slot_ = -1;
};

// The open OutputBatch: its finished temporaries (and their signal slots), the new output
// directories it builds as hidden siblings, and the parent directories it created.
struct Batch {
  struct Kept {
    std::string tmp, path, shown;  // shown: the path the tool asked for (path may be in a hidden directory)
    std::unique_ptr<TemporaryGuard> guard;
  };
  struct Building {
    std::string target, tmp, field;
    std::unique_ptr<DirGuard> guard;
  };
  struct Made {
    std::string dir;
    std::unique_ptr<DirGuard> guard;
  };
  std::vector<Kept> kept;
  std::vector<Building> building;
  std::vector<Made> made_dirs;  // outermost first

  // `path` with a directory being built replaced by its hidden sibling; `path` itself otherwise.
  std::string map(const std::string& path) const {
    if (building.empty()) return path;
    std::error_code ec;
    const std::string p = fs::absolute(path, ec).lexically_normal().string();
    for (const auto& b : building) {
      if (p == b.target || p == b.target + "/") return b.tmp;
      if (p.compare(0, b.target.size() + 1, b.target + "/") == 0) return b.tmp + p.substr(b.target.size());
    }
    return path;
  }
};
std::mutex g_batch_mu;
Batch* g_batch = nullptr;

void rename_into_place(const std::string& tmp, const std::string& path, const std::string& shown) {
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    int e = errno;
    std::remove(tmp.c_str());
    throw Error(shown, "", std::string("cannot rename temporary into place: ") + std::strerror(e));
  }
  auto slash = path.find_last_of('/');
  fsync_path(slash == std::string::npos ? "." : path.substr(0, slash + 1));
}

// An uncommitted batch's leftovers: its temporaries, its hidden directories with everything in
// them (each is this process's own), the directories it created (each only when empty).
void discard(Batch& b) {
  for (const auto& k : b.kept)
    if (k.guard) std::remove(k.tmp.c_str());
  for (const auto& d : b.building) {
    std::error_code ec;
    if (d.guard) fs::remove_all(d.tmp, ec);
  }
  for (auto it = b.made_dirs.rbegin(); it != b.made_dirs.rend(); ++it) {
    std::error_code ec;
    fs::remove(it->dir, ec);  // only when empty
  }
}

fs::path normal_dir(const std::string& dir) {
  std::error_code ec;
  fs::path p = fs::absolute(dir, ec).lexically_normal();
  if (p.filename().empty() && p.has_parent_path() && p != p.root_path()) p = p.parent_path();  // "dir/"
  return p;
}

// create_directories(dir); with a batch open, the directories it creates are recorded (removed
// when empty if the batch does not commit, and by the signal handlers). Caller holds g_batch_mu.
void create_recorded(const fs::path& dir, const std::string& shown, const std::string& field) {
  std::error_code ec;
  std::vector<fs::path> fresh;  // innermost first
  for (fs::path p = dir; !p.empty() && !fs::exists(p, ec); p = p.parent_path()) {
    fresh.push_back(p);
    if (p == p.parent_path()) break;
  }
  fs::create_directories(dir, ec);
  if (ec) throw Error(shown, field, "cannot create the directory: " + ec.message());
  if (!fs::is_directory(dir, ec)) throw Error(shown, field, "exists and is not a directory");
  if (!g_batch) return;
  for (auto it = fresh.rbegin(); it != fresh.rend(); ++it)
    g_batch->made_dirs.push_back({it->string(), std::make_unique<DirGuard>(it->string())});
}

}  // namespace

void write_atomically(const std::string& shown, const std::function<void(const std::string&)>& writer) {
  std::string path = shown;
  {
    std::lock_guard<std::mutex> lock(g_batch_mu);
    if (g_batch) path = g_batch->map(shown);  // into the hidden sibling of a directory being built
  }
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
      g_batch->kept.push_back({tmp, path, shown, std::move(guard)});
      return;
    }
  }
  rename_into_place(tmp, path, shown);
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
  discard(*b);
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
    // Every piece still there before the first rename (an output directory removed mid-run takes
    // its temporaries with it): a failure here leaves every earlier output as it was.
    for (const auto& k : b->kept) {
      struct stat st {};
      if (::lstat(k.tmp.c_str(), &st) != 0)
        throw Error(k.shown, "", std::string("cannot rename temporary into place: ") + std::strerror(errno));
    }
    for (const auto& d : b->building) {
      std::error_code ec;
      if (!fs::is_directory(d.tmp, ec))
        throw Error(d.target, d.field, "cannot move the finished directory into place: the directory being built vanished");
    }
    for (auto& k : b->kept) {
      rename_into_place(k.tmp, k.path, k.shown);
      k.guard.reset();
    }
    for (auto& d : b->building) {
      // An empty directory made meanwhile is replaced; anything in it refuses the rename.
      if (::rename(d.tmp.c_str(), d.target.c_str()) != 0)
        throw Error(d.target, d.field, std::string("cannot move the finished directory into place: ") + std::strerror(errno));
      d.guard.reset();
      fsync_path(fs::path(d.target).parent_path().string());
    }
  } catch (...) {
    discard(*b);
    ::pthread_sigmask(SIG_SETMASK, &old, nullptr);
    throw;
  }
  b->made_dirs.clear();  // theirs now: no handler removes them
  set_interrupt_note("every output was already written");
  ::pthread_sigmask(SIG_SETMASK, &old, nullptr);
}

void make_output_dir(const std::string& dir, const std::string& field) {
  std::error_code ec;
  std::lock_guard<std::mutex> lock(g_batch_mu);
  const fs::path target = normal_dir(dir);
  if (!g_batch) return create_recorded(target, dir, field);
  const std::string mapped = g_batch->map(target.string());
  if (mapped != target.string()) return create_recorded(mapped, dir, field);  // inside one being built
  if (fs::is_directory(target, ec)) return;  // its files are renamed in one by one at commit
  if (fs::exists(target, ec)) throw Error(dir, field, "exists and is not a directory");
  create_recorded(target.parent_path(), dir, field);
  remove_dead_build_dirs(target.string());
  const std::string tmp =
      (target.parent_path() / ("." + target.filename().string() + ".kvq-tmp." + std::to_string(::getpid()))).string();
  fs::remove_all(tmp, ec);
  if (!fs::create_directory(tmp, ec) || ec)
    throw Error(dir, field, "cannot create the directory: " + (ec ? ec.message() : std::string("it exists")));
  g_batch->building.push_back({target.string(), tmp, field, std::make_unique<DirGuard>(tmp)});
}

void make_parent_dirs(const std::string& dir, const std::string& field) {
  std::lock_guard<std::mutex> lock(g_batch_mu);
  const fs::path target = normal_dir(dir);
  create_recorded(g_batch ? fs::path(g_batch->map(target.string())) : target, dir, field);
}

void remove_dead_build_dirs(const std::string& target) {
  std::error_code ec;
  const fs::path t = normal_dir(target);
  const std::string prefix = "." + t.filename().string() + ".kvq-tmp.";
  for (fs::directory_iterator it(t.parent_path(), ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (name.rfind(prefix, 0) != 0) continue;
    const std::string pid = name.substr(prefix.size());
    if (pid.empty() || pid.find_first_not_of("0123456789") != std::string::npos || pid.size() > 9) continue;
    if (pid_t(std::stol(pid)) == ::getpid() || ::kill(pid_t(std::stol(pid)), 0) == 0 || errno != ESRCH)
      continue;  // alive (or not ours to judge)
    std::error_code rm;
    fs::remove_all(it->path(), rm);
  }
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
