#pragma once
// Memory for a calibration file's bulk payload (the reservoir's and the held-out windows' rows),
// which a large model's capture cannot keep on the heap: 8B at 16 x 512 is 4.6 GB of it, written
// one layer at a time by the layer-major forward and read back only when the file is written.
//
// payload::Vector<T> is a std::vector with an allocator that, while a FileBacked scope is alive,
// takes its storage from an unlinked temporary file mapped shared (beside the output), instead of
// the heap. Resident pages of such storage can be handed back with release(): the data stays in
// the file (the page cache writes it back) and faults in again when next touched, so a capture
// keeps about one layer's rows resident. Outside a FileBacked scope it is the heap, exactly.
// Storage made file-backed stays file-backed until freed, whatever scope is alive then.
#include <cstddef>
#include <new>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace kvq::payload {

namespace detail {
// Set by zeros() while it sizes a vector whose storage is a fresh file mapping (already zero):
// value-initialisation is then skipped, so sizing never touches (makes resident) a page.
extern thread_local bool fresh_zero_storage;
}  // namespace detail

void* allocate_bytes(size_t bytes);
void deallocate_bytes(void* p, size_t bytes) noexcept;

template <class T>
struct Allocator {
  using value_type = T;
  Allocator() = default;
  template <class U>
  Allocator(const Allocator<U>&) noexcept {}
  T* allocate(size_t n) { return static_cast<T*>(allocate_bytes(n * sizeof(T))); }
  void deallocate(T* p, size_t n) noexcept { deallocate_bytes(p, n * sizeof(T)); }
  template <class U, class... Args>
  void construct(U* p, Args&&... args) {
    if constexpr (sizeof...(Args) == 0 && std::is_trivially_default_constructible_v<U>) {
      if (detail::fresh_zero_storage) return;
    }
    ::new (static_cast<void*>(p)) U(std::forward<Args>(args)...);
  }
  template <class U>
  bool operator==(const Allocator<U>&) const noexcept { return true; }
  template <class U>
  bool operator!=(const Allocator<U>&) const noexcept { return false; }
};

template <class T>
using Vector = std::vector<T, Allocator<T>>;
using FloatVector = Vector<float>;

// While alive (one at a time per process), allocations of at least one page come from temporary
// files in `dir` (created and unlinked at once, so nothing is left behind by a crash). Throws
// kvq::Error naming `dir` when a file cannot be made there.
class FileBacked {
 public:
  explicit FileBacked(const std::string& dir);
  ~FileBacked();
  FileBacked(const FileBacked&) = delete;
  FileBacked& operator=(const FileBacked&) = delete;
};

// Whether [p, p + bytes) lies in file-backed storage.
bool is_file_backed(const void* p, size_t bytes = 1) noexcept;
// Drops the resident whole pages of [p, p + bytes) when the range is file-backed; otherwise
// nothing. The contents are unchanged.
void release(const void* p, size_t bytes) noexcept;
// Drops the resident pages of every file-backed allocation.
void release_all() noexcept;
// n zeros. File-backed (when a scope is alive and n floats fill a page) without touching a page.
FloatVector zeros(size_t n);
// Grows v to n elements, the new ones zero, its contents kept; file-backed storage is copied a
// slab at a time and released as it goes, so growing never makes the whole vector resident.
// n <= v.size() leaves v as it is.
void grow_zeroed(FloatVector& v, size_t n);

// Bytes currently held in file-backed storage.
size_t file_backed_bytes() noexcept;

}  // namespace kvq::payload
