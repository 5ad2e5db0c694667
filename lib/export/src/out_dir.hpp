#pragma once
// The --out directory of kvq-export: created only after every check passed.
#include <filesystem>
#include <string>
#include <system_error>

#include "kvq/util/atomic_file.hpp"
#include "kvq/util/error.hpp"

namespace kvq::exporter::detail {

inline void check_out_dir(const std::string& dir) {
  if (dir.empty()) throw Error("", "--out", "is empty");
  std::error_code ec;
  if (std::filesystem::exists(dir, ec) && !std::filesystem::is_directory(dir, ec))
    throw Error(dir, "--out", "exists and is not a directory");
}

inline void make_out_dir(const std::string& dir) { make_output_dir(dir, "--out"); }

}  // namespace kvq::exporter::detail
