#include "kvq/util/atomic_file.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
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

void write_atomically(const std::string& path, const std::function<void(const std::string&)>& writer) {
  const std::string tmp = path + ".tmp." + std::to_string(::getpid());
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
