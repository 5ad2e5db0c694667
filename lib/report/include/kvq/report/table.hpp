#pragma once
// One table type for the terminal (aligned columns) and for CSV (RFC 4180 quoting), so both
// always carry the same columns.
#include <string>
#include <vector>

namespace kvq::report {

struct Table {
  std::string name;                  // CSV file suffix ("" = the main table)
  std::vector<std::string> header;
  std::vector<std::vector<std::string>> rows;
  std::vector<bool> left;            // per column: left-aligned (text) rather than right (numbers)

  void add(std::vector<std::string> row) { rows.push_back(std::move(row)); }
  std::string to_text(const std::string& indent = "  ") const;
  std::string to_csv() const;
};

// Number formatting shared by tables: %.*g with `digits` significant digits; NaN as "-".
std::string fmt(double v, int digits = 4);
std::string fmt_fixed(double v, int decimals);

}  // namespace kvq::report
