#pragma once
#include <chrono>
#include <cstdint>
#include <string>

namespace kvq {

// One-line progress on stderr: "label  done/total  rate unit/s  ETA". Silent when stderr is not a
// TTY or when quiet; redraws at most every 200 ms.
class Progress {
 public:
  Progress(std::string label, int64_t total, std::string unit, bool quiet = false);
  ~Progress();
  void update(int64_t done, int64_t units_done);  // units (e.g. tokens) drive the rate
  // The same, showing `detail` (e.g. "chunk 2/5  layer 17/32") instead of done/total.
  void update(int64_t done, int64_t units_done, const std::string& detail);
  void finish();

 private:
  std::string label_, unit_;
  int64_t total_;
  bool enabled_;
  bool finished_ = false;
  std::chrono::steady_clock::time_point start_, last_;
};

// Sets LibTorch/OpenMP intra-op threads; n <= 0 means all cores. Returns the count used.
int hardware_threads();

}  // namespace kvq
