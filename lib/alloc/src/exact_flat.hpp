#pragma once
// Internal: the exact solver on curves stored back to back (one allocation for every head), which
// keeps the 8B/70B panels out of the allocator and off fresh pages.
#include <cstddef>
#include <cstdint>
#include <vector>

#include "kvq/alloc/exact.hpp"

namespace kvq::alloc::detail {

struct FlatCurves {
  std::vector<CurvePoint> pts;
  std::vector<size_t> start;  // head h: pts[start[h] .. start[h+1])
  std::vector<int64_t> b_min, b_max;

  void clear() {
    pts.clear();
    start.assign(1, 0);
    b_min.clear();
    b_max.clear();
  }
  // Close the head whose points were just appended.
  void close_head(int64_t lo, int64_t hi) {
    start.push_back(pts.size());
    b_min.push_back(lo);
    b_max.push_back(hi);
  }
  int n() const { return static_cast<int>(b_min.size()); }
  const CurvePoint* of(int h) const { return pts.data() + start[h]; }
  int size(int h) const { return static_cast<int>(start[h + 1] - start[h]); }
  // D*_h(budget) (+inf when nothing fits); *k = the point index within the head, or -1.
  double value(int h, int64_t budget, int* k = nullptr) const;
};

ExactSolution solve_flat(const FlatCurves& c, int64_t total);

}  // namespace kvq::alloc::detail
