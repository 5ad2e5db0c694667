#include "kvq/util/payload_memory.hpp"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <new>

#include "kvq/util/disk_space.hpp"
#include "kvq/util/error.hpp"

namespace kvq::payload {

thread_local bool detail::fresh_zero_storage = false;

namespace {

struct Registry {
  std::mutex mu;
  std::map<const char*, size_t> maps;  // start -> mapped bytes
  std::string dir;                     // non-empty while a FileBacked scope is alive
};
Registry& registry() {
  static Registry* r = new Registry;  // never destroyed: vectors may be freed during exit
  return *r;
}

size_t page_size() {
  static const size_t p = size_t(sysconf(_SC_PAGESIZE));
  return p;
}

void* map_file(const std::string& dir, size_t bytes) {
  // Reserved before it is mapped: a full disk is one line naming the directory, not a SIGBUS.
  void* p = map_reserved_temp_file(dir, ".kvq-payload-", bytes, "", "a calibration payload file");
  // A capture writes a layer's slice of every reservoir row: a few KiB strided through the
  // buffer. Without readahead (MADV_RANDOM) a fault brings in one page; otherwise the page cache
  // builds large folios and each small write makes up to megabytes resident (the whole reservoir
  // per layer, measured on ext4 with large folios).
  madvise(p, bytes, MADV_RANDOM);
  return p;
}

}  // namespace

void* allocate_bytes(size_t bytes) {
  Registry& r = registry();
  std::unique_lock<std::mutex> lock(r.mu);
  if (r.dir.empty() || bytes < page_size()) {
    lock.unlock();
    void* p = std::malloc(bytes ? bytes : 1);
    if (!p) throw std::bad_alloc();
    return p;
  }
  const size_t mapped = (bytes + page_size() - 1) / page_size() * page_size();
  void* p = map_file(r.dir, mapped);
  r.maps.emplace(static_cast<const char*>(p), mapped);
  return p;
}

void deallocate_bytes(void* p, size_t) noexcept {
  if (!p) return;
  Registry& r = registry();
  {
    std::lock_guard<std::mutex> lock(r.mu);
    auto it = r.maps.find(static_cast<const char*>(p));
    if (it != r.maps.end()) {
      munmap(p, it->second);
      r.maps.erase(it);
      return;
    }
  }
  std::free(p);
}

FileBacked::FileBacked(const std::string& dir) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  if (!r.dir.empty()) throw Error(dir, "", "a file-backed payload scope is already open");
  const int fd = open_unnamed_temp(dir, ".kvq-payload-");  // the directory takes files: said now, not mid-run
  if (fd < 0)
    throw Error(dir.empty() ? "." : dir, "", std::string("cannot create a temporary payload file: ") + std::strerror(errno));
  close(fd);
  r.dir = dir.empty() ? "." : dir;
}

FileBacked::~FileBacked() {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  r.dir.clear();
}

namespace {
// The mapping containing [p, p + bytes), or maps.end().
std::map<const char*, size_t>::const_iterator find_map(const Registry& r, const char* p, size_t bytes) {
  auto it = r.maps.upper_bound(p);
  if (it == r.maps.begin()) return r.maps.end();
  --it;
  if (p + bytes > it->first + it->second) return r.maps.end();
  return it;
}
}  // namespace

bool is_file_backed(const void* p, size_t bytes) noexcept {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  return find_map(r, static_cast<const char*>(p), bytes) != r.maps.end();
}

void release(const void* p, size_t bytes) noexcept {
  if (!p || bytes == 0) return;
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  const char* c = static_cast<const char*>(p);
  if (find_map(r, c, bytes) == r.maps.end()) return;
  const uintptr_t pg = page_size();
  const uintptr_t a = (reinterpret_cast<uintptr_t>(c) + pg - 1) / pg * pg;
  const uintptr_t b = (reinterpret_cast<uintptr_t>(c) + bytes) / pg * pg;
  if (b > a) madvise(reinterpret_cast<void*>(a), b - a, MADV_DONTNEED);
}

void release_all() noexcept {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  for (const auto& [p, n] : r.maps) madvise(const_cast<char*>(p), n, MADV_DONTNEED);
}

FloatVector zeros(size_t n) {
  FloatVector v;
  v.reserve(n);
  if (n > 0 && is_file_backed(v.data(), n * sizeof(float))) {
    detail::fresh_zero_storage = true;
    v.resize(n);
    detail::fresh_zero_storage = false;
  } else {
    v.resize(n, 0.f);
  }
  return v;
}

void grow_zeroed(FloatVector& v, size_t n) {
  if (n <= v.size()) return;
  FloatVector g = zeros(n);
  constexpr size_t kSlab = size_t(8) << 20;  // floats
  for (size_t i = 0; i < v.size(); i += kSlab) {
    const size_t m = std::min(kSlab, v.size() - i);
    std::copy_n(v.data() + i, m, g.data() + i);
    release(v.data() + i, m * sizeof(float));
    release(g.data() + i, m * sizeof(float));
  }
  v.swap(g);
}

size_t file_backed_bytes() noexcept {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  size_t n = 0;
  for (const auto& m : r.maps) n += m.second;
  return n;
}

}  // namespace kvq::payload
