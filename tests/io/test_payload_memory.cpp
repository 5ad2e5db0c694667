// payload::Vector (kvq/util/payload_memory.hpp): while a FileBacked scope is alive its storage is
// an unlinked file mapped shared; sizing it touches no page, release() hands resident pages back
// with the contents kept, and the HDF5 helpers write and read it a slab at a time with the same
// bytes as a heap buffer. Residency is read from the kernel (/proc/self/smaps: the Rss of the
// mapping that holds the vector), not from kvq.
#include <gtest/gtest.h>

#include <H5Cpp.h>
#include <unistd.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <sstream>
#include <string>

#include "kvq/io/h5.hpp"
#include "kvq/util/error.hpp"
#include "kvq/util/payload_memory.hpp"

using namespace kvq;
namespace fs = std::filesystem;

namespace {

// Resident KiB of the mapping containing p, from /proc/self/smaps; -1 when p is in none.
int64_t resident_kib(const void* p) {
  std::ifstream in("/proc/self/smaps");
  std::string line;
  const uintptr_t a = reinterpret_cast<uintptr_t>(p);
  bool inside = false;
  while (std::getline(in, line)) {
    uintptr_t lo = 0, hi = 0;
    char dash = 0;
    std::istringstream hs(line);
    if (line.find(':') != std::string::npos && line.find('-') < line.find(' ') &&
        (hs >> std::hex >> lo >> dash >> hi) && dash == '-') {
      inside = a >= lo && a < hi;
      continue;
    }
    if (inside && line.rfind("Rss:", 0) == 0) return std::stoll(line.substr(4));
  }
  return -1;
}

struct TempDir {
  fs::path p;
  TempDir() {
    char t[] = "/tmp/kvq-payload-test-XXXXXX";
    p = mkdtemp(t);
  }
  ~TempDir() { fs::remove_all(p); }
  size_t entries() const { return size_t(std::distance(fs::directory_iterator(p), fs::directory_iterator())); }
};

std::string file_bytes(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), {});
}

constexpr size_t kMiB = size_t(1) << 20;

}  // namespace

TEST(PayloadMemory, HeapOutsideAScopeFileInside) {
  TempDir dir;
  payload::FloatVector heap = payload::zeros(kMiB);
  EXPECT_FALSE(payload::is_file_backed(heap.data()));
  {
    payload::FileBacked scope(dir.p.string());
    payload::FloatVector small = payload::zeros(16);  // under a page: the heap
    EXPECT_FALSE(payload::is_file_backed(small.data()));
    payload::FloatVector big = payload::zeros(64 * kMiB / sizeof(float));
    EXPECT_TRUE(payload::is_file_backed(big.data(), big.size() * sizeof(float)));
    EXPECT_EQ(payload::file_backed_bytes(), 64 * kMiB);
    EXPECT_EQ(dir.entries(), 0u) << "the payload file is unlinked at once";
  }
  EXPECT_EQ(payload::file_backed_bytes(), 0u) << "freed with the vector";
  EXPECT_THROW(payload::FileBacked("/nonexistent/dir"), Error);
}

TEST(PayloadMemory, SizingTouchesNoPageAndReleaseKeepsTheContents) {
  TempDir dir;
  payload::FileBacked scope(dir.p.string());
  const size_t n = 128 * kMiB / sizeof(float);
  payload::FloatVector v = payload::zeros(n);
  ASSERT_TRUE(payload::is_file_backed(v.data(), n * sizeof(float)));
  EXPECT_LT(resident_kib(v.data()), 1024) << "zeros() must not touch the pages";
  for (size_t i = 0; i < n; i += 997) ASSERT_EQ(v[i], 0.f);
  for (size_t i = 0; i < n; ++i) v[i] = float(i % 65521) * 0.5f;
  EXPECT_GT(resident_kib(v.data()), 100 * 1024);
  payload::release_all();
  EXPECT_LT(resident_kib(v.data()), 1024) << "release_all drops the resident pages";
  for (size_t i = 0; i < n; i += 1009) ASSERT_EQ(v[i], float(i % 65521) * 0.5f) << i;
  // grow_zeroed keeps the contents, zeroes the new tail, never holds the whole vector resident.
  payload::release_all();
  payload::grow_zeroed(v, n + n / 2);
  EXPECT_LT(resident_kib(v.data()), 64 * 1024);
  ASSERT_EQ(v.size(), n + n / 2);
  for (size_t i = 0; i < n; i += 1013) ASSERT_EQ(v[i], float(i % 65521) * 0.5f) << i;
  for (size_t i = n; i < v.size(); i += 1013) ASSERT_EQ(v[i], 0.f) << i;
}

// The capture's pattern: one small slice of every row per layer. Only the pages written become
// resident, not the folios or readahead windows around them.
TEST(PayloadMemory, StridedWritesMakeOnlyTheirPagesResident) {
  TempDir dir;
  payload::FileBacked scope(dir.p.string());
  const size_t stride = 64 * 1024 / sizeof(float), rows = 4096;  // 64 KiB rows, 256 MiB
  payload::FloatVector v = payload::zeros(stride * rows);
  for (int layer = 0; layer < 3; ++layer) {
    for (size_t r = 0; r < rows; ++r) v[r * stride + size_t(layer) * 1024] = float(r + layer);  // 4 KiB apart
    const int64_t kib = resident_kib(v.data());
    EXPECT_LE(kib, int64_t(rows) * 4 * 2) << "layer " << layer << ": " << kib << " KiB resident for " << rows
                                           << " written pages";
    payload::release_all();
  }
  for (size_t r = 0; r < rows; r += 7) ASSERT_EQ(v[r * stride + 2048], float(r + 2)) << r;
}

// A payload of several 32 MiB slabs: the HDF5 file written from file-backed memory is byte for byte
// the file written from the heap, and reads back equal either way, without the whole dataset
// resident at the end.
TEST(PayloadMemory, Hdf5WriteAndReadInSlabsGiveTheSameBytes) {
  TempDir dir;
  const std::vector<hsize_t> dims = {9, 3, 1u << 20};  // 9 rows of 12 MiB: 3 slabs
  const size_t n = 9 * 3 * (1u << 20);
  auto fill = [&](float* x) {
    for (size_t i = 0; i < n; ++i) x[i] = float(int64_t(i * 2654435761u % 1000003) - 500000) / 7.f;
  };
  auto write = [&](const fs::path& p, const float* x) {
    H5::H5File f = h5::create(p.string());
    H5::Group root = f.openGroup("/");
    h5::write(root, "x", dims, x);
  };
  payload::FloatVector heap(n);
  fill(heap.data());
  write(dir.p / "heap.h5", heap.data());
  {
    payload::FileBacked scope(dir.p.string());
    payload::FloatVector mapped = payload::zeros(n);
    ASSERT_TRUE(payload::is_file_backed(mapped.data(), n * sizeof(float)));
    fill(mapped.data());
    payload::release_all();
    write(dir.p / "mapped.h5", mapped.data());
    EXPECT_LT(resident_kib(mapped.data()), 40 * 1024) << "each slab is released after it is written";
    EXPECT_EQ(file_bytes(dir.p / "heap.h5"), file_bytes(dir.p / "mapped.h5"));

    payload::FloatVector back;
    H5::H5File f = h5::open_read((dir.p / "mapped.h5").string());
    h5::read_f32((dir.p / "mapped.h5").string(), f.openGroup("/"), "x", dims, &back);
    ASSERT_TRUE(payload::is_file_backed(back.data(), n * sizeof(float)));
    EXPECT_LT(resident_kib(back.data()), 40 * 1024) << "each slab is released after it is read";
    ASSERT_EQ(back.size(), n);
    EXPECT_TRUE(std::equal(back.begin(), back.end(), heap.begin()));
  }
  payload::FloatVector back;
  H5::H5File f = h5::open_read((dir.p / "heap.h5").string());
  h5::read_f32((dir.p / "heap.h5").string(), f.openGroup("/"), "x", dims, &back);
  EXPECT_FALSE(payload::is_file_backed(back.data()));
  EXPECT_TRUE(std::equal(back.begin(), back.end(), heap.begin()));
}
