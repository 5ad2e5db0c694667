// Memory sizes: the --max-memory text and its default (the room calib-capture's plan and
// kvq-generate's whole-model check work within).
#include <cmath>
#include <fstream>
#include <string>

#include "kvq/capture/memory_size.hpp"
#include "kvq/util/error.hpp"

namespace kvq {

// 80 % of MemAvailable, or of the cgroup's limit less its usage when that is smaller.
int64_t default_memory_budget() {
  int64_t avail = -1;
  std::ifstream mi("/proc/meminfo");
  std::string key;
  int64_t kb = 0;
  std::string unit;
  while (mi >> key >> kb >> unit)
    if (key == "MemAvailable:") avail = kb * 1024;
  std::ifstream lim("/sys/fs/cgroup/memory.max"), cur("/sys/fs/cgroup/memory.current");
  int64_t l = 0, u = 0;
  if ((lim >> l) && (cur >> u) && l > u && (avail < 0 || l - u < avail)) avail = l - u;
  if (avail <= 0) avail = int64_t(4) << 30;
  return avail / 10 * 8;
}

int64_t parse_memory_size(const std::string& text, const std::string& field) {
  size_t used = 0;
  double v = 0;
  try {
    v = std::stod(text, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  std::string unit = text.substr(used);
  if (!unit.empty() && (unit.back() == 'B' || unit.back() == 'b')) unit.pop_back();
  if (!unit.empty() && (unit.back() == 'i')) unit.pop_back();
  double mul = 1;
  if (unit == "k" || unit == "K") mul = 1024.0;
  else if (unit == "m" || unit == "M") mul = 1024.0 * 1024;
  else if (unit == "g" || unit == "G") mul = 1024.0 * 1024 * 1024;
  else if (unit == "t" || unit == "T") mul = 1024.0 * 1024 * 1024 * 1024;
  else if (!unit.empty()) used = 0;
  if (used == 0 || !std::isfinite(v) || v <= 0 || v * mul > 9.0e18)
    throw Error("", field, "'" + text + "' is not a memory size (e.g. 6G, 1500M, 123456)");
  return int64_t(v * mul);
}

}  // namespace kvq
