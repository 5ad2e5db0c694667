#include "kvq/report/table.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>

namespace kvq::report {

std::string fmt(double v, int digits) {
  if (std::isnan(v)) return "-";
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*g", digits, v);
  return buf;
}

std::string fmt_fixed(double v, int decimals) {
  if (std::isnan(v)) return "-";
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*f", decimals, v);
  return buf;
}

std::string Table::to_text(const std::string& indent) const {
  std::vector<size_t> w(header.size(), 0);
  for (size_t c = 0; c < header.size(); ++c) w[c] = header[c].size();
  for (const auto& r : rows)
    for (size_t c = 0; c < r.size() && c < w.size(); ++c) w[c] = std::max(w[c], r[c].size());
  auto line = [&](const std::vector<std::string>& r) {
    std::string s = indent;
    for (size_t c = 0; c < w.size(); ++c) {
      const std::string& v = c < r.size() ? r[c] : std::string();
      const std::string pad(w[c] - std::min(w[c], v.size()), ' ');
      const bool l = c < left.size() && left[c];
      s += (c ? "  " : "") + (l ? v + pad : pad + v);
    }
    while (!s.empty() && s.back() == ' ') s.pop_back();
    return s + "\n";
  };
  std::string out = line(header);
  for (const auto& r : rows) out += line(r);
  return out;
}

std::string Table::to_csv() const {
  auto cell = [](const std::string& v) {
    if (v == "-") return std::string();  // the terminal's "no value"
    if (v.find_first_of(",\"\n") == std::string::npos) return v;
    std::string q = "\"";
    for (char ch : v) q += ch == '"' ? std::string("\"\"") : std::string(1, ch);
    return q + "\"";
  };
  auto line = [&](const std::vector<std::string>& r) {
    std::string s;
    for (size_t c = 0; c < r.size(); ++c) s += (c ? "," : "") + cell(r[c]);
    return s + "\n";
  };
  std::string out = line(header);
  for (const auto& r : rows) out += line(r);
  return out;
}

}  // namespace kvq::report
