#pragma once
// kvq-inspect: a terminal summary, CSV/JSON tables and plots of a calibration file, an allocation
// file, or two allocations of one model side by side.
#include <cstdio>
#include <string>
#include <vector>

#include "kvq/io/alloc_file.hpp"
#include "kvq/io/calib_file.hpp"
#include "kvq/report/table.hpp"

namespace kvq::report {

struct InspectOptions {
  std::vector<std::string> files;  // one calibration or allocation file, or two allocations (A B)
  std::string calib;               // calibration for an allocation's energy/eigen/C2 figures
                                   // (default: the path the allocation records, when it exists)
  std::string json_out;            // allocation: the manifest (allocation-manifest.schema.json);
                                   // calibration / comparison: inspect-summary.schema.json
  std::string csv_out;             // main table; further tables beside it as <stem>.<name>.csv
  std::string plots_dir;           // PNG + SVG figures
  int layer = 0, head = 0;         // the head of the energy and eigenvalue figures
  bool summary = true;             // print the terminal summary
};

struct InspectResult {
  std::string kind;                  // "calibration", "allocation", "comparison"
  std::vector<std::string> written;  // every file written, in order
  std::vector<std::string> notes;    // figures skipped and why
};

// Throws kvq::Error (one line: file, field, what) for bad input; writes every output atomically.
InspectResult run_inspect(const InspectOptions& o, std::FILE* out);

// The pieces, for tests and other tools.
std::string calib_summary_text(const CalibFile& c, const std::string& path);
// c (may be null): the calibration, for before-C2 distortions per head when the allocation does
// not store them (files written before kvq did).
std::string alloc_summary_text(const AllocFile& a, const std::string& path, const CalibFile* c = nullptr);
std::vector<Table> calib_tables(const CalibFile& c);
std::vector<Table> alloc_tables(const AllocFile& a, const CalibFile* c);  // c: as alloc_summary_text
nlohmann::json calib_summary_json(const CalibFile& c, const std::string& path);

// <dir>/<stem>.csv for table name "", <stem>.<name>.csv otherwise.
std::string csv_path(const std::string& main_path, const std::string& table_name);

}  // namespace kvq::report
