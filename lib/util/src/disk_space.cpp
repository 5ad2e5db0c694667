#include "kvq/util/disk_space.hpp"

#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <new>

#include "kvq/util/error.hpp"

namespace kvq {

int64_t free_disk_bytes(const std::string& dir) {
  struct statvfs s {};
  if (::statvfs(dir.empty() ? "." : dir.c_str(), &s) != 0) return -1;
  return int64_t(s.f_bavail) * int64_t(s.f_frsize);
}

std::string human_bytes(int64_t bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double v = double(bytes);
  int u = 0;
  while (v >= 1024.0 && u < 4) v /= 1024.0, ++u;
  char buf[32];
  if (u == 0) std::snprintf(buf, sizeof buf, "%lld B", static_cast<long long>(bytes));
  else std::snprintf(buf, sizeof buf, "%.2f %s", v, units[u]);
  return buf;
}

void check_disk_space(const std::string& dir, int64_t need, const std::string& field, const std::string& what) {
  const int64_t free = free_disk_bytes(dir);
  if (free < 0 || need <= free) return;
  throw Error(dir.empty() ? "." : dir, field,
              what + ": needs " + human_bytes(need) + " (" + std::to_string(need) + " bytes) on this filesystem, " +
                  human_bytes(free) + " free");
}

int open_unnamed_temp(const std::string& dir0, const char* prefix) {
  const std::string dir = dir0.empty() ? "." : dir0;
  const int fd = ::open(dir.c_str(), O_TMPFILE | O_RDWR | O_CLOEXEC, 0600);
  if (fd >= 0 || (errno != EOPNOTSUPP && errno != EISDIR && errno != EINVAL)) return fd;
  // No O_TMPFILE here: a name for an instant, with the stop signals held so that a Ctrl-C or a
  // kill cannot end the process between mkstemp and unlink (the interrupt handler removes
  // registered temporaries, not this one).
  std::string tmpl = dir + "/" + prefix + "XXXXXX";
  sigset_t block, old;
  sigemptyset(&block);
  for (int sig : {SIGINT, SIGTERM, SIGHUP}) sigaddset(&block, sig);
  ::pthread_sigmask(SIG_BLOCK, &block, &old);
  const int tfd = ::mkostemp(tmpl.data(), O_CLOEXEC);
  const int e = errno;
  if (tfd >= 0) ::unlink(tmpl.c_str());
  ::pthread_sigmask(SIG_SETMASK, &old, nullptr);
  errno = e;
  return tfd;
}

void* map_reserved_temp_file(const std::string& dir0, const char* prefix, size_t bytes, const std::string& field,
                             const std::string& what) {
  const std::string dir = dir0.empty() ? "." : dir0;
  // Refused before the reservation: posix_fallocate on a filesystem without fallocate writes
  // zeros, and would fill the disk before failing.
  check_disk_space(dir, int64_t(bytes), field, what);
  const int fd = open_unnamed_temp(dir, prefix);  // gone with the process, however it ends
  if (fd < 0) throw Error(dir, field, "cannot create " + what + ": " + std::strerror(errno));
  const int rc = bytes > 0 ? ::posix_fallocate(fd, 0, off_t(bytes)) : 0;
  if (rc != 0) {
    ::close(fd);
    const int64_t free = free_disk_bytes(dir);
    throw Error(dir, field,
                "cannot reserve " + human_bytes(int64_t(bytes)) + " (" + std::to_string(bytes) + " bytes) for " + what +
                    ": " + std::strerror(rc) + (free >= 0 ? ", " + human_bytes(free) + " free" : std::string()));
  }
  void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  ::close(fd);  // the mapping keeps the file
  if (p == MAP_FAILED) throw std::bad_alloc();
  return p;
}

}  // namespace kvq
