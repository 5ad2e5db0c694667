// KV-COBRA's vocabulary and rules shared by every solver: option names, model and spectrum
// validation, the budget rules (total, per-head floor, even split) and their checks.
#include <algorithm>
#include <cmath>

#include "cobra_internal.hpp"
#include "internal.hpp"
#include "kvq/alloc/cobra.hpp"

namespace kvq::alloc {

using detail::fail;
using detail::num;

const char* to_string(C1Rounding r) {
  switch (r) {
    case C1Rounding::kFloor: return "floor";
    case C1Rounding::kRound: return "round";
  }
  return "unknown";
}

C1Rounding c1_rounding_from_string(const std::string& s) {
  if (s == "floor") return C1Rounding::kFloor;
  if (s == "round") return C1Rounding::kRound;
  fail("c1_rounding", "unknown value '" + s + "' (valid: floor, round)");
}

const char* to_string(C2Kind k) {
  switch (k) {
    case C2Kind::kNone: return "none";
    case C2Kind::kDamped: return "damped";
    case C2Kind::kExact: return "exact";
    case C2Kind::kReference: return "reference";
  }
  return "unknown";
}

C2Kind c2_kind_from_string(const std::string& s) {
  if (s == "none") return C2Kind::kNone;
  if (s == "damped") return C2Kind::kDamped;
  if (s == "exact") return C2Kind::kExact;
  if (s == "reference") return C2Kind::kReference;
  fail("c2", "unknown value '" + s + "' (valid: none, damped, exact, reference)");
}

void validate_model(const CobraModel& m, int d) {
  if (d <= 0) fail("head_dim", "must be positive, got " + num(d));
  if (!std::isfinite(m.c) || m.c <= 0) fail("c", "q(b) = c 2^-2b needs c > 0, got " + num(m.c));
  if (m.r_min < 1 || m.r_min > d)
    fail("r_min", "must be in [1, head_dim=" + num(d) + "], got " + num(m.r_min));
  if (m.r_step < 1) fail("r_step", "must be >= 1, got " + num(m.r_step));
  if (m.b_min < 1 || m.b_min > 16) fail("b_min", "must be in [1, 16], got " + num(m.b_min));
  if (m.b_max < m.b_min || m.b_max > 16)
    fail("b_max", "must be in [b_min=" + num(m.b_min) + ", 16], got " + num(m.b_max));
  if (m.rounding != C1Rounding::kFloor && m.rounding != C1Rounding::kRound)
    fail("c1_rounding", "unknown value " + num(static_cast<int>(m.rounding)));
}

std::vector<double> checked_spectrum(const std::vector<double>& lambda, int d,
                                     const std::string& field) {
  if (static_cast<int>(lambda.size()) != d)
    fail(field, "expected " + num(d) + " values, got " + num(static_cast<long long>(lambda.size())));
  std::vector<double> out(lambda);
  double top = 0.0;
  for (int i = 0; i < d; ++i) {
    if (!std::isfinite(out[i])) fail(field, "value " + num(i) + " is not finite: " + num(out[i]));
    top = std::max(top, out[i]);
  }
  for (int i = 0; i < d; ++i) {
    if (out[i] < 0) {
      if (out[i] < -1e-12 * top) fail(field, "value " + num(i) + " is negative: " + num(out[i]));
      out[i] = 0.0;
    }
    if (i > 0 && out[i] > out[i - 1])
      fail(field, "not descending at index " + num(i) + " (" + num(out[i - 1]) + " then " +
                      num(out[i]) + ")");
  }
  return out;
}

int64_t cobra_total_budget(int n_heads, int head_dim, double bpd) {
  if (!std::isfinite(bpd) || bpd <= 0) fail("bpd", "must be a positive number, got " + num(bpd));
  return std::llround(static_cast<double>(n_heads) * head_dim * bpd);
}

int64_t cobra_reference_head_budget(int head_dim, double bpd) {
  if (!std::isfinite(bpd) || bpd <= 0) fail("bpd", "must be a positive number, got " + num(bpd));
  if (head_dim <= 0) fail("head_dim", "must be positive, got " + num(head_dim));
  return static_cast<int64_t>(bpd * static_cast<double>(head_dim));  // Python's int(): toward 0
}

int64_t cobra_min_head_budget(double bbar, const BudgetFloor& f) {
  if (f.abs < 0) fail("floor_abs", "must be >= 0, got " + num(static_cast<long long>(f.abs)));
  if (f.div < 1) fail("floor_div", "must be >= 1, got " + num(static_cast<long long>(f.div)));
  return std::max<int64_t>(f.abs, static_cast<int64_t>(std::floor(bbar / static_cast<double>(f.div))));
}

std::vector<int64_t> even_split(int64_t total, int n) {
  KVQ_ASSERT(n > 0);
  std::vector<int64_t> b(n, total / n);
  for (int64_t h = 0; h < total % n; ++h) ++b[h];
  return b;
}

namespace detail {

void check_bpd(double bpd, const CobraModel& m) {
  if (!std::isfinite(bpd) || bpd <= 0) fail("bpd", "must be a positive number, got " + num(bpd));
  if (bpd > m.b_max)
    fail("bpd", num(bpd) + " is above b_max=" + num(m.b_max) + " (no head can use it)");
}

void check_total(int64_t total, int n, int64_t floor_b) {
  if (total < static_cast<int64_t>(n) * floor_b)
    fail("bpd", "budget too small: " + num(static_cast<long long>(total)) + " bits over " +
                    num(n) + " heads is below the per-head floor B_min=" +
                    num(static_cast<long long>(floor_b)));
}

}  // namespace detail

}  // namespace kvq::alloc
