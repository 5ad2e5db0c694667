#pragma once
// Small descriptive statistics shared by the allocators and the reports.
#include <vector>

namespace kvq {

// Population standard deviation (divides by n); 0 for fewer than two values.
double population_std(const std::vector<double>& v);

}  // namespace kvq
