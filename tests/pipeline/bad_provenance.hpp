#pragma once
// The calibration-provenance refusals the per-family pipeline tests share: a good file's provenance
// edited one way per case must be refused by kvq's reader in one line naming the field, and by a tool
// with exit 2 and one line; and the family's keys in a file of the version before theirs must be
// refused naming the version they need (the same file at its own version reads).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#include "kvq/io/calib_file.hpp"
#include "kvq/util/error.hpp"
#include "h5_root.hpp"
#include "run_cmd.hpp"
#include "tiny_family_files.hpp"

namespace kvq::test {

// What read_calib says of `path` ("" when it reads).
inline std::string calib_read_error(const std::string& path) {
  try {
    read_calib(path, false);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

struct BadProvenance {
  const char* name;
  std::function<void(CalibProvenance&)> edit;
  const char* field;  // the field the one line names
  const char* what;   // and a piece of what it says
};

// The tool's command line for a calibration file (its exit status and stderr are checked).
using ToolOnCalib = std::function<std::string(const std::string& calib)>;

// Each case: `good` edited, written as <stem>_<name>.kvqcal.h5, refused by the reader and by `tool`
// (exit 2) in one line naming the field; `no_output`, when given, must not exist after the tool.
inline void expect_bad_provenance_refused(const CalibFile& good, const std::string& stem,
                                          const std::vector<BadProvenance>& cases, const ToolOnCalib& tool,
                                          const std::string& no_output = "") {
  for (const auto& cs : cases) {
    SCOPED_TRACE(cs.name);
    CalibFile c = good;
    cs.edit(c.prov);
    const std::string path = temp_path(stem + "_" + cs.name + ".kvqcal.h5");
    write_calib(path, c);
    const std::string err = calib_read_error(path);
    EXPECT_NE(err.find(cs.field), std::string::npos) << err;
    EXPECT_NE(err.find(cs.what), std::string::npos) << err;
    EXPECT_EQ(err.find('\n'), std::string::npos) << err;
    const auto r = run_cmd(tool(path));
    EXPECT_EQ(r.status, 2) << r.err;
    EXPECT_NE(r.err.find(cs.field), std::string::npos) << r.err;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
    if (!no_output.empty()) {
      EXPECT_FALSE(std::filesystem::exists(no_output)) << no_output;
    }
    std::printf("%s: %s", cs.name, r.err.c_str());
  }
}

// `good` (a file of version `own` with the family's keys) written at version own - 1: refused by the
// reader (and by `tool`, when given) naming `field`, "version >= own" and the file's version; the
// same file at version `own` reads.
inline void expect_keys_refused_below(const CalibFile& good, const std::string& stem, int64_t own, const char* field,
                                      const ToolOnCalib& tool = {}) {
  const int64_t old = own - 1;
  const std::string path = temp_path(stem + "_v" + std::to_string(old) + ".kvqcal.h5");
  write_calib(path, good);
  set_root_version(path, old);
  ASSERT_EQ(read_root_text_raw(path, "provenance").version, old);
  const std::string err = calib_read_error(path);
  EXPECT_NE(err.find(field), std::string::npos) << err;
  EXPECT_NE(err.find("version >= " + std::to_string(own)), std::string::npos) << err;
  EXPECT_NE(err.find("version " + std::to_string(old)), std::string::npos) << err;
  EXPECT_EQ(err.find('\n'), std::string::npos) << err;
  if (tool) {
    const auto r = run_cmd(tool(path));
    EXPECT_EQ(r.status, 2) << r.err;
    EXPECT_NE(r.err.find(field), std::string::npos) << r.err;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
    std::printf("version %lld: %s", static_cast<long long>(old), r.err.c_str());
  }
  set_root_version(path, own);  // control
  EXPECT_EQ(calib_read_error(path), "");
}

}  // namespace kvq::test
