// KV-COBRA over a whole model: KL reordering of each head's basis, the head decisions and the
// summary, for one side, joint K/V and measured distortion.
#include <algorithm>
#include <cmath>
#include <numeric>
#include <string>

#include "cobra_internal.hpp"
#include "internal.hpp"
#include "kvq/alloc/cobra.hpp"

namespace kvq::alloc {

using detail::check_bpd;
using detail::fail;
using detail::num;

KlOrder kl_reorder(const std::vector<double>& lambda, const std::vector<double>& qv) {
  if (qv.size() != lambda.size())
    fail("query_variance", "expected " + num(static_cast<long long>(lambda.size())) +
                               " values (one per eigen-direction), got " +
                               num(static_cast<long long>(qv.size())));
  const int d = static_cast<int>(lambda.size());
  KlOrder o;
  std::vector<double> w(d);
  for (int i = 0; i < d; ++i) {
    if (!std::isfinite(qv[i]) || qv[i] < 0)
      fail("query_variance", "value " + num(i) + " must be finite and >= 0, got " + num(qv[i]));
    if (!std::isfinite(lambda[i]) || lambda[i] < 0)
      fail("eigenvalues", "value " + num(i) + " must be finite and >= 0, got " + num(lambda[i]));
    w[i] = qv[i] * lambda[i];
  }
  o.perm.resize(d);
  std::iota(o.perm.begin(), o.perm.end(), 0);
  std::stable_sort(o.perm.begin(), o.perm.end(), [&](int a, int b) { return w[a] > w[b]; });
  o.weights.resize(d);
  for (int j = 0; j < d; ++j) o.weights[j] = w[o.perm[j]];
  return o;
}

std::vector<double> query_variance_along(const Eigen::MatrixXd& sigma_q, const Eigen::MatrixXd& u) {
  if (sigma_q.rows() != sigma_q.cols() || sigma_q.rows() != u.rows())
    fail("sigma_q", "shape " + num(static_cast<long long>(sigma_q.rows())) + "x" +
                        num(static_cast<long long>(sigma_q.cols())) + " does not match basis rows " +
                        num(static_cast<long long>(u.rows())));
  Eigen::VectorXd v = (u.transpose() * sigma_q * u).diagonal();
  return std::vector<double>(v.data(), v.data() + v.size());
}

// ---------------------------------------------------------------------------------------------
// Whole-model allocation.

namespace {

std::string head_field(const char* what, const Shape& s, int index, const char* side = nullptr) {
  std::string f = std::string(what) + "[";
  if (side) f += std::string(side) + " ";
  return f + "layer " + num(s.layer_of(index)) + ", head " + num(s.head_of(index)) + "]";
}

// Spectra (possibly KL-reordered) and the permutation each head's basis follows.
// reference_kl: the weights as the reference forms them, max(q_var, 1e-30) * max(lambda, 1e-30)
// (its tie order, from numpy's unstable argsort, is not reproduced: kvq keeps ties in order).
void prepare(const Shape& shape, const std::vector<CobraHeadInput>& heads, bool kl,
             const char* side_name, std::vector<std::vector<double>>* spectra,
             std::vector<std::vector<int>>* perms, bool reference_kl = false) {
  const int n = shape.n_heads(), d = shape.head_dim;
  if (static_cast<int>(heads.size()) != n)
    fail(side_name, "expected " + num(n) + " heads (layers x kv heads), got " +
                        num(static_cast<long long>(heads.size())));
  for (int i = 0; i < n; ++i) {
    std::vector<double> lam =
        checked_spectrum(heads[i].eigenvalues, d, head_field("eigenvalues", shape, i, side_name));
    std::vector<int> perm(d);
    std::iota(perm.begin(), perm.end(), 0);
    if (kl) {
      if (heads[i].query_variance.empty())
        fail(head_field("query_variance", shape, i, side_name), "required when KL reordering is on");
      KlOrder o;
      if (reference_kl && heads[i].query_variance.size() == lam.size()) {
        std::vector<double> ev(lam), qv(heads[i].query_variance);
        for (size_t j = 0; j < ev.size(); ++j) {
          ev[j] = std::max(ev[j], 1e-30);
          // NaN and negatives stay as they are for kl_reorder's message.
          if (qv[j] >= 0 && qv[j] < 1e-30) qv[j] = 1e-30;
        }
        o = kl_reorder(ev, qv);
      } else {
        o = kl_reorder(lam, heads[i].query_variance);
      }
      lam = o.weights;
      perm = o.perm;
    }
    const auto& u = heads[i].eigenvectors;
    if (u.size() != 0 && (u.rows() != d || u.cols() != d))
      fail(head_field("eigenvectors", shape, i, side_name),
           "expected " + num(d) + "x" + num(d) + ", got " + num(static_cast<long long>(u.rows())) +
               "x" + num(static_cast<long long>(u.cols())));
    const auto& mu = heads[i].mean;
    if (mu.size() != 0 && mu.size() != d)
      fail(head_field("mean", shape, i, side_name),
           "expected " + num(d) + " values, got " + num(static_cast<long long>(mu.size())));
    spectra->push_back(std::move(lam));
    perms->push_back(std::move(perm));
  }
}

HeadDecision lowrank_decision(const Shape& shape, int index, Side side, int64_t budget,
                              const RankBits& rb, const CobraHeadInput* in,
                              const std::vector<int>* perm, uint64_t seed) {
  const int d = shape.head_dim;
  HeadDecision h;
  h.layer = shape.layer_of(index);
  h.kv_head = shape.head_of(index);
  h.side = side;
  h.kind = CodingKind::kLowRankHadamard;
  h.post_rope = false;
  h.rank = rb.rank;
  h.bits = rb.bits;
  h.budget_bits = static_cast<int>(budget);
  h.predicted_distortion = rb.distortion;
  h.hadamard_seed = derive_seed(seed, h.layer, h.kv_head, side, 0);
  if (in && in->eigenvectors.size() != 0) {
    h.basis.resize(static_cast<size_t>(d) * rb.rank);
    for (int i = 0; i < d; ++i)
      for (int j = 0; j < rb.rank; ++j)
        h.basis[static_cast<size_t>(i) * rb.rank + j] =
            static_cast<float>(in->eigenvectors(i, perm ? (*perm)[j] : j));
  }
  if (in && in->mean.size() != 0) {
    h.mean.resize(d);
    for (int i = 0; i < d; ++i) h.mean[i] = static_cast<float>(in->mean(i));
  }
  return h;
}

void fill_summary(const C2Result& r, const std::vector<HeadDecision>& heads, Method method,
                  double bpd, int d, const CobraOptions& opt, AllocSummary* s) {
  s->method = method;
  s->nominal_bpd = bpd;
  s->budget_total = r.total_target;
  s->budget_assigned = r.total_assigned;
  s->has_prediction = true;
  s->predicted_distortion = r.objective;
  std::vector<double> after;
  for (const auto& c : r.choice) after.push_back(c.distortion);
  s->distortion_std_before = population_std(r.uniform_distortion);
  s->distortion_before = r.uniform_distortion;
  s->distortion_std_after = population_std(after);
  for (const auto& h : heads) {
    int64_t over = static_cast<int64_t>(h.rank) * h.bits - h.budget_bits;
    if (over > 0) {
      ++s->heads_over_budget;
      s->bits_over_budget += over;
    }
  }
  summarize_bits(heads, d, opt.overhead, s);
  const CobraModel& m = opt.model;
  s->params = {{"c", num(m.c)},
               {"r_min", num(m.r_min)},
               {"r_step", num(m.r_step)},
               {"b_min", num(m.b_min)},
               {"b_max", num(m.b_max)},
               {"c1_rounding", to_string(m.rounding)},
               {"c2", to_string(opt.c2)},
               {"rounds", num(opt.damped.rounds)},
               {"damping", num(opt.damped.damping)},
               {"floor_abs", num(static_cast<long long>(opt.floor.abs))},
               {"floor_div", num(static_cast<long long>(opt.floor.div))},
               {"head_floor", num(static_cast<long long>(r.head_floor))},
               {"head_max", num(static_cast<long long>(opt.head_max))},
               {"kl", opt.kl ? "1" : "0"},
               {"budget_rule", opt.c2 == C2Kind::kReference ? "int(d * bpd) * heads"
                                                            : "llround(heads * d * bpd)"},
               {"seed", num(static_cast<unsigned long long>(opt.seed))}};
}

}  // namespace

Allocation allocate_cobra(const Shape& shape, Side side, const std::vector<CobraHeadInput>& heads,
                          double bpd, const CobraOptions& opt) {
  validate_shape(shape);
  validate_model(opt.model, shape.head_dim);
  check_bpd(bpd, opt.model);
  std::vector<std::vector<double>> spectra;
  std::vector<std::vector<int>> perms;
  const bool reference = opt.c2 == C2Kind::kReference;
  prepare(shape, heads, opt.kl, side == Side::kK ? "K" : "V", &spectra, &perms, reference);
  const int64_t total = cobra_total_budget(shape.n_heads(), shape.head_dim, bpd);
  C2Result r;
  switch (opt.c2) {
    case C2Kind::kNone: r = cobra_c2_none(spectra, total, opt.model); break;
    case C2Kind::kDamped: r = cobra_c2_damped(spectra, total, opt.model, opt.damped, opt.floor); break;
    case C2Kind::kExact: r = cobra_c2_exact(spectra, total, opt.model, opt.floor, opt.head_max); break;
    case C2Kind::kReference:
      r = cobra_c2_reference(spectra, cobra_reference_head_budget(shape.head_dim, bpd), opt.model,
                             opt.damped, opt.floor);
      break;
    default: fail("c2", "unknown value " + num(static_cast<int>(opt.c2)));
  }
  Allocation out;
  for (int i = 0; i < shape.n_heads(); ++i)
    out.heads.push_back(
        lowrank_decision(shape, i, side, r.budgets[i], r.choice[i], &heads[i], &perms[i], opt.seed));
  Method method = opt.c2 == C2Kind::kExact ? Method::kCobraDp
                  : opt.kl                 ? Method::kCobraKl
                                           : Method::kCobraMse;
  fill_summary(r, out.heads, method, bpd, shape.head_dim, opt, &out.summary);
  return out;
}

Allocation allocate_cobra_joint(const Shape& shape, const std::vector<CobraHeadInput>& k_heads,
                                const std::vector<CobraHeadInput>& v_heads, double bpd,
                                const CobraOptions& opt) {
  validate_shape(shape);
  validate_model(opt.model, shape.head_dim);
  check_bpd(bpd, opt.model);
  if (opt.c2 != C2Kind::kExact)
    fail("c2", "joint K/V needs the exact solver, got '" + std::string(to_string(opt.c2)) + "'");
  std::vector<std::vector<double>> spectra;
  std::vector<std::vector<int>> perms;
  prepare(shape, k_heads, opt.kl, "K", &spectra, &perms);
  // KL weights come from queries against keys; V keeps its MSE order.
  prepare(shape, v_heads, false, "V", &spectra, &perms);
  const int n = shape.n_heads();
  // The exact solver takes spectra of one length: K and V of different dims are refused.
  if (shape.v_dim() != shape.head_dim)
    fail("head_dim_v", "joint K/V needs K and V of one dim, got " + num(shape.head_dim) + " and " + num(shape.v_dim()));
  const int64_t total = cobra_total_budget(2 * n, shape.head_dim, bpd);
  C2Result r = cobra_c2_exact(spectra, total, opt.model, opt.floor, opt.head_max);
  Allocation out;
  for (int i = 0; i < 2 * n; ++i) {
    const bool is_k = i < n;
    const int idx = is_k ? i : i - n;
    out.heads.push_back(lowrank_decision(shape, idx, is_k ? Side::kK : Side::kV, r.budgets[i],
                                         r.choice[i], is_k ? &k_heads[idx] : &v_heads[idx],
                                         &perms[i], opt.seed));
  }
  fill_summary(r, out.heads, Method::kCobraDp, bpd, shape.head_dim, opt, &out.summary);
  out.summary.params.push_back({"joint_kv", "1"});
  return out;
}

Allocation allocate_cobra_measured(const Shape& shape, Side side,
                                   const std::vector<MeasuredTable>& tables,
                                   const std::vector<CobraHeadInput>& heads, double bpd,
                                   const CobraOptions& opt) {
  validate_shape(shape);
  const int n = shape.n_heads(), d = shape.head_dim;
  if (static_cast<int>(tables.size()) != n)
    fail("tables", "expected " + num(n) + " heads, got " + num(static_cast<long long>(tables.size())));
  if (!heads.empty() && static_cast<int>(heads.size()) != n)
    fail("heads", "expected " + num(n) + " heads (or none), got " +
                      num(static_cast<long long>(heads.size())));
  if (!std::isfinite(bpd) || bpd <= 0) fail("bpd", "must be a positive number, got " + num(bpd));
  for (int i = 0; i < n; ++i) {
    if (bpd > tables[i].b_max)
      fail("bpd", num(bpd) + " is above the table's b_max=" + num(tables[i].b_max));
    if (heads.empty()) continue;
    const auto& u = heads[i].eigenvectors;
    if (u.size() != 0 && (u.rows() != d || u.cols() != d))
      fail(head_field("eigenvectors", shape, i), "expected " + num(d) + "x" + num(d));
    if (heads[i].mean.size() != 0 && heads[i].mean.size() != d)
      fail(head_field("mean", shape, i), "expected " + num(d) + " values");
  }
  const int64_t total = cobra_total_budget(n, d, bpd);
  C2Result r = cobra_c2_exact_measured(tables, d, total, opt.floor, opt.head_max);
  Allocation out;
  for (int i = 0; i < n; ++i)
    out.heads.push_back(lowrank_decision(shape, i, side, r.budgets[i], r.choice[i],
                                         heads.empty() ? nullptr : &heads[i], nullptr, opt.seed));
  CobraOptions rec = opt;
  rec.c2 = C2Kind::kExact;
  rec.kl = false;
  fill_summary(r, out.heads, Method::kCobraMeasured, bpd, d, rec, &out.summary);
  out.summary.params.push_back({"distortion", "measured"});
  return out;
}

}  // namespace kvq::alloc
