#pragma once
// Disk space before it is needed: a file that is mapped must have its blocks reserved first (a
// store into a mapped page the filesystem cannot back is SIGBUS, not an error), and a run that
// knows how much it will write says so up front instead of failing hours in.
#include <cstddef>
#include <cstdint>
#include <string>

namespace kvq {

// Bytes an unprivileged writer can still use on the filesystem holding `dir` (statvfs f_bavail *
// f_frsize); -1 when it cannot be read.
int64_t free_disk_bytes(const std::string& dir);

// "1.50 GiB", "3.2 MiB", "512 B".
std::string human_bytes(int64_t bytes);

// Throws kvq::Error (file = dir, field = `field`) "<what> needs <need> in <dir>, <free> free" when
// the filesystem holding dir has less than `need` bytes free. Does nothing when free space is
// unknown.
void check_disk_space(const std::string& dir, int64_t need, const std::string& field, const std::string& what);

// A file in `dir` that has no name: O_TMPFILE, or where the filesystem lacks it <dir>/<prefix>XXXXXX
// unlinked at once, SIGINT/SIGTERM/SIGHUP held meanwhile — so nothing is left however the process
// ends (a SIGKILL in that instant aside, on such a filesystem). Returns the fd (O_RDWR, O_CLOEXEC),
// or -1 with errno set.
int open_unnamed_temp(const std::string& dir, const char* prefix);

// An unlinked temporary file in `dir` (open_unnamed_temp), its `bytes` reserved on disk (posix_fallocate), mapped shared
// read-write. A full disk is a kvq::Error naming dir, the bytes needed and the bytes free — never
// a SIGBUS at the first store the filesystem cannot hold. Unmap with munmap(p, bytes).
void* map_reserved_temp_file(const std::string& dir, const char* prefix, size_t bytes, const std::string& field,
                             const std::string& what);

}  // namespace kvq
