// Disk space before it is needed (issue 27): a mapped temporary file has its blocks reserved first,
// so a full disk is one kvq::Error naming the directory, the bytes needed and the bytes free — not
// a SIGBUS at the first store. The full disk is made without root: RLIMIT_FSIZE makes the
// reservation fail (EFBIG) in a child, as ENOSPC does on a full filesystem.
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <csignal>
#include <cstring>
#include <filesystem>
#include <string>

#include "kvq/util/disk_space.hpp"
#include "kvq/util/error.hpp"
#include "run_cmd.hpp"

namespace fs = std::filesystem;

namespace {

std::string fresh_dir(const std::string& name) {
  const std::string d = kvq::test::temp_path(name);
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

bool empty_dir(const std::string& d) { return fs::directory_iterator(d) == fs::directory_iterator(); }

}  // namespace

TEST(DiskSpace, FreeBytesOfAnExistingDirectory) {
  EXPECT_GT(kvq::free_disk_bytes(::testing::TempDir()), 0);
  EXPECT_EQ(kvq::free_disk_bytes("/no/such/dir/for/kvq"), -1);
}

TEST(DiskSpace, ShortSpaceIsOneLineNamingDirectoryNeedAndFree) {
  const std::string d = fresh_dir("disk-short");
  const int64_t free = kvq::free_disk_bytes(d);
  ASSERT_GT(free, 0);
  const int64_t need = free + (int64_t(1) << 40);
  try {
    kvq::check_disk_space(d, need, "--out", "the calibration file");
    FAIL() << "no error for " << need << " bytes with " << free << " free";
  } catch (const kvq::Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find(d), std::string::npos) << m;
    EXPECT_NE(m.find("--out"), std::string::npos) << m;
    EXPECT_NE(m.find(std::to_string(need) + " bytes"), std::string::npos) << m;
    EXPECT_NE(m.find("free"), std::string::npos) << m;
    EXPECT_EQ(m.find('\n'), std::string::npos) << m;
  }
  EXPECT_NO_THROW(kvq::check_disk_space(d, 1, "--out", "x"));
  // Larger than the filesystem: refused before anything is created or reserved.
  EXPECT_THROW(kvq::map_reserved_temp_file(d, ".kvq-test-", size_t(need), "", "a test file"), kvq::Error);
  EXPECT_TRUE(empty_dir(d));
  fs::remove_all(d);
}

TEST(DiskSpace, MappedFileIsReservedUsableAndLeavesNoName) {
  const std::string d = fresh_dir("disk-map");
  const size_t n = size_t(4) << 20;
  void* p = kvq::map_reserved_temp_file(d, ".kvq-test-", n, "", "a test file");
  ASSERT_NE(p, nullptr);
  std::memset(p, 0x5a, n);  // every page is backed: no SIGBUS
  EXPECT_EQ(static_cast<unsigned char*>(p)[n - 1], 0x5a);
  EXPECT_TRUE(empty_dir(d)) << "the file is unlinked at once";
  ::munmap(p, n);
  fs::remove_all(d);
}

// The reservation itself failing (what a full filesystem does; here a file-size limit): an Error
// naming the directory and the bytes, in a child so the limit stays there.
TEST(DiskSpace, FailedReservationIsAnErrorNotASignal) {
  const std::string d = fresh_dir("disk-limit");
  int err[2];
  ASSERT_EQ(::pipe(err), 0);
  const pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    ::close(err[0]);
    ::signal(SIGXFSZ, SIG_IGN);  // the limit's signal: the call then fails with EFBIG instead
    struct rlimit rl {1 << 20, 1 << 20};
    ::setrlimit(RLIMIT_FSIZE, &rl);
    try {
      void* p = kvq::map_reserved_temp_file(d, ".kvq-test-", size_t(8) << 20, "--tmp-dir", "a test file");
      std::memset(p, 1, size_t(8) << 20);
      ::_exit(3);  // reserved past the limit
    } catch (const kvq::Error& e) {
      const std::string m = e.what();
      (void)!::write(err[1], m.data(), m.size());
      ::_exit(0);
    }
  }
  ::close(err[1]);
  int status = 0;
  if (!kvq::test::wait_bounded(pid, &status)) FAIL() << "the child did not end within 120 s";
  std::string m;
  char buf[512];
  for (ssize_t k; (k = ::read(err[0], buf, sizeof buf)) > 0;) m.append(buf, size_t(k));
  ::close(err[0]);
  ASSERT_TRUE(WIFEXITED(status)) << "signal " << (WIFSIGNALED(status) ? WTERMSIG(status) : 0);
  EXPECT_EQ(WEXITSTATUS(status), 0) << m;
  EXPECT_NE(m.find(d), std::string::npos) << m;
  EXPECT_NE(m.find("cannot reserve"), std::string::npos) << m;
  EXPECT_NE(m.find(std::to_string(size_t(8) << 20) + " bytes"), std::string::npos) << m;
  EXPECT_TRUE(empty_dir(d));
  fs::remove_all(d);
}

// The payload and spill files have no name at any moment a signal could end the process (issue 38:
// the fault table's SIGTERM at the payload probe's creation left `.kvq-payload-XXXXXX` behind).
TEST(DiskSpace, UnnamedTempLeavesNoName) {
  const std::string d = kvq::test::temp_path("unnamed");
  std::filesystem::remove_all(d);
  std::filesystem::create_directories(d);
  const int fd = kvq::open_unnamed_temp(d, ".kvq-test-");
  ASSERT_GE(fd, 0) << std::strerror(errno);
  EXPECT_EQ(::write(fd, "x", 1), 1);
  EXPECT_TRUE(empty_dir(d));
  ::close(fd);
  EXPECT_TRUE(empty_dir(d));
  EXPECT_LT(kvq::open_unnamed_temp(d + "/missing", ".kvq-test-"), 0);
}
