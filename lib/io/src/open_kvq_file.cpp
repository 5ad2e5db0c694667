#include "open_kvq_file.hpp"

#include "kvq/io/alloc_versions.hpp"
#include "kvq/io/calib_versions.hpp"
#include "kvq/io/h5.hpp"
#include "kvq/util/fault_guard.hpp"
#include "kvq/util/error.hpp"

namespace kvq {
namespace {

struct Format {
  KvqFileKind kind;
  const char* name;        // @format
  const char* what;        // for "not a kvq <what> file"
  int64_t oldest, newest;  // @version range this kvq reads
};

// Every kvq file format and the versions this build reads (frozen numbers: calib_versions.hpp,
// alloc_versions.hpp).
constexpr Format kFormats[] = {
    {KvqFileKind::kCalibration, kCalibFormat, "calibration", kCalibOldestVersion, kCalibVersion},
    {KvqFileKind::kAllocation, kAllocFormat, "allocation", kAllocOldestVersion, kAllocVersion},
};

const Format& format_of(KvqFileKind k) {
  for (const auto& f : kFormats)
    if (f.kind == k) return f;
  assert_fail("a known KvqFileKind", __FILE__, __LINE__);
}

std::string quoted(const char* s) { return "'" + std::string(s) + "'"; }


H5::Group open_root(const std::string& path, const H5::H5File& f) {
  try {
    return f.openGroup("/");
  } catch (const H5::Exception&) {
    throw Error(path, "/", "unreadable root group (truncated or corrupt file)");
  }
}

KvqFileHeader check_header(const std::string& path, const H5::Group& root, std::optional<KvqFileKind> expect) {
  // The attribute readers translate their own failures; this catches what HDF5 throws around them
  // (H5::Exception is not a std::exception and would end a tool with a stack trace).
  std::string field = "/@format";
  try {
    const std::string what = expect ? format_of(*expect).what : "calibration or allocation";
    if (!h5::has_attr(root, "format")) throw Error(path, field, "missing: not a kvq " + what + " file");
    const std::string fmt = h5::read_attr_str(path, root, "format");
    const Format* found = nullptr;
    for (const auto& f : kFormats)
      if (fmt == f.name) found = &f;
    if (expect && (!found || found->kind != *expect))
      throw Error(path, field, "expected " + quoted(format_of(*expect).name) + ", found '" + fmt + "'");
    if (!found)
      throw Error(path, field,
                  "found '" + fmt + "', expected " + quoted(kCalibFormat) + " or " + quoted(kAllocFormat));
    field = "/@version";
    const int64_t ver = h5::read_attr_i64(path, root, "version");
    if (ver < found->oldest || ver > found->newest) {
      const std::string range = found->oldest == found->newest
                                    ? std::to_string(found->newest)
                                    : std::to_string(found->oldest) + ".." + std::to_string(found->newest);
      throw Error(path, field,
                  "expected version " + range + ", found " + std::to_string(ver) +
                      (ver > found->newest ? " (written by a newer kvq)" : " (no longer supported)"));
    }
    return {found->kind, ver};
  } catch (const H5::Exception&) {
    throw Error(path, field, "unreadable (truncated or corrupt file)");
  }
}

}  // namespace

const char* format_name(KvqFileKind kind) { return format_of(kind).name; }

OpenedKvqFile open_kvq_file(const std::string& path, std::optional<KvqFileKind> expect) {
  H5::H5File file = h5::open_read(path);
  H5::Group root = open_root(path, file);
  const KvqFileHeader header = check_header(path, root, expect);
  return {header, file, root};
}

KvqFileHeader read_kvq_header(const std::string& path, std::optional<KvqFileKind> expect) {
  const FaultGuard fault_guard(path);  // libhdf5 can fault on corrupt metadata: one line, exit 2
  return open_kvq_file(path, expect).header;
}

}  // namespace kvq
