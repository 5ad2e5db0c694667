#include "kvq/util/progress.hpp"

#include <unistd.h>

#include <cstdio>
#include <thread>

namespace kvq {

Progress::Progress(std::string label, int64_t total, std::string unit, bool quiet)
    : label_(std::move(label)), unit_(std::move(unit)), total_(total),
      enabled_(!quiet && ::isatty(STDERR_FILENO)) {
  start_ = last_ = std::chrono::steady_clock::now();
}

Progress::~Progress() { finish(); }

void Progress::update(int64_t done, int64_t units_done) { update(done, units_done, std::string()); }

void Progress::update(int64_t done, int64_t units_done, const std::string& detail) {
  if (!enabled_) return;
  auto now = std::chrono::steady_clock::now();
  if (done < total_ && now - last_ < std::chrono::milliseconds(200)) return;
  last_ = now;
  double secs = std::chrono::duration<double>(now - start_).count();
  double rate = secs > 0 ? units_done / secs : 0.0;
  double eta = done > 0 ? secs * double(total_ - done) / double(done) : 0.0;
  if (detail.empty())
    std::fprintf(stderr, "\r%s  %lld/%lld  %.0f %s/s  ETA %.0f s   ", label_.c_str(), (long long)done,
                 (long long)total_, rate, unit_.c_str(), eta);
  else
    std::fprintf(stderr, "\r%s  %s  %.0f %s/s  ETA %.0f s   ", label_.c_str(), detail.c_str(), rate, unit_.c_str(),
                 eta);
  std::fflush(stderr);
}

void Progress::finish() {
  if (enabled_ && !finished_) std::fprintf(stderr, "\n");
  finished_ = true;
}

int hardware_threads() {
  unsigned n = std::thread::hardware_concurrency();
  return n == 0 ? 1 : int(n);
}

}  // namespace kvq
