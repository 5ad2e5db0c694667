#include "kvq/alloc/block_gtq.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <numeric>

#include "internal.hpp"

namespace kvq::alloc {

using detail::fail;
using detail::num;

namespace {

void check_widths(int b_min, int b_max) {
  if (b_min < 1 || b_min > 16) fail("b_min", "must be in [1, 16], got " + num(b_min));
  if (b_max < b_min || b_max > 16)
    fail("b_max", "must be in [b_min=" + num(b_min) + ", 16], got " + num(b_max));
}

void check_energies(const std::vector<double>& s, const std::string& field) {
  if (s.empty()) fail(field, "no RoPE blocks (empty energy vector)");
  for (size_t i = 0; i < s.size(); ++i) {
    if (!std::isfinite(s[i]) || s[i] < 0)
      fail(field, "block " + num(static_cast<long long>(i)) +
                      " energy must be finite and >= 0, got " + num(s[i]));
  }
}

void check_bpd(double bpd, int b_min, int b_max) {
  if (!std::isfinite(bpd) || bpd <= 0)
    fail("bits_per_dim", "must be a positive number, got " + num(bpd));
  if (bpd < b_min) fail("bits_per_dim", num(bpd) + " is below b_min=" + num(b_min));
  if (bpd > b_max) fail("bits_per_dim", num(bpd) + " is above b_max=" + num(b_max));
}

// Increments (block i, width b -> b+1) for the 4^-b law, compared exactly. With s = m 2^e
// (m in [0.5, 1)), s 4^-b = M 4^(k-b) where M = m 2^(e mod 2) lies in [0.5, 2) and
// k = (e - e mod 2) / 2; the intervals [0.5, 2) 4^n are disjoint and increasing in n, so
// (level k - b, M) lexicographic is the value order, with no rounding and no underflow. M is
// kept as its bit pattern (positive doubles order like their bits). Writes the extra bits per
// block into add[]. Scratch is per thread: this runs once per head, hundreds of heads per model.
void select_pow4(const double* s, int n, int64_t extra, int b_min, int b_max, int* add) {
  const int32_t cap = b_max - b_min;
  // Positive blocks as parallel arrays (index order), so the counting loop below vectorises.
  thread_local std::vector<int32_t> kk_buf, idx_buf, zero_buf;
  thread_local std::vector<uint64_t> mant_buf;
  if (static_cast<int>(kk_buf.size()) < n)
    kk_buf.resize(n), idx_buf.resize(n), zero_buf.resize(n), mant_buf.resize(n);
  // Raw pointers: through the vectors every store would make the compiler reload them.
  int32_t* kk = kk_buf.data();
  int32_t* idx = idx_buf.data();
  int32_t* zero = zero_buf.data();
  uint64_t* mant = mant_buf.data();
  int np = 0, nz = 0;
  int32_t kmin = std::numeric_limits<int32_t>::max(), kmax = std::numeric_limits<int32_t>::min();
  for (int i = 0; i < n; ++i) {
    add[i] = 0;
    uint64_t u;
    std::memcpy(&u, &s[i], sizeof u);
    if (!(s[i] > 0)) {
      zero[nz++] = i;
      continue;
    }
    int e;
    const int biased = static_cast<int>(u >> 52);  // sign is 0
    if (biased != 0) {  // normal: m = the same mantissa with the exponent of [0.5, 1)
      e = biased - 1022;
    } else {
      const double m = std::frexp(s[i], &e);
      std::memcpy(&u, &m, sizeof u);
    }
    const int p = e & 1;
    const int32_t kv = (e - p) >> 1;  // e - p is even: exact
    kk[np] = kv;
    kmin = kv < kmin ? kv : kmin;
    kmax = kv > kmax ? kv : kmax;
    mant[np] = (u & 0x000fffffffffffffULL) | (static_cast<uint64_t>(1022 + p) << 52);  // M
    idx[np] = i;
    ++np;
  }
  const int64_t pos_cap = static_cast<int64_t>(np) * cap;
  if (extra >= pos_cap) {
    // Every positive gain beats every zero gain; zero-energy blocks then fill in index order (the
    // tie rule makes the greedy return to the same lowest-index block until it reaches b_max).
    for (int j = 0; j < np; ++j) add[idx[j]] = cap;
    int64_t left = extra - pos_cap;
    for (int j = 0; j < nz; ++j) {
      int64_t g = std::min<int64_t>(left, cap);
      add[zero[j]] = static_cast<int>(g);
      left -= g;
    }
    return;
  }
  if (extra == 0) return;

  // The level lo of the last increment taken: the largest N with total(N) >= extra, where
  // total(N) = increments at levels >= N. Block j has one increment at each level in
  // [k_j - b_max + 1, k_j - b_min], so the number at level N is the count of blocks with k in
  // [N + b_min, N + b_max - 1]: a sliding window over a histogram of k, walked down from the top.
  const int32_t* k = kk;
  int32_t lo;
  if (kmax - kmin <= 512) {
    thread_local std::vector<int32_t> hist_buf;
    const int32_t range = kmax - kmin + 1;
    hist_buf.assign(range, 0);
    int32_t* hist = hist_buf.data();
    for (int j = 0; j < np; ++j) ++hist[k[j] - kmin];
    auto h = [&](int32_t kv) { return kv < kmin || kv > kmax ? 0 : hist[kv - kmin]; };
    int64_t total = 0;
    int32_t window = 0;  // blocks with k in [N + b_min, N + b_max - 1]
    lo = kmax - b_min + 1;
    for (int32_t kv = lo + b_min; kv <= lo + b_max - 1; ++kv) window += h(kv);  // N = kmax-b_min+1
    while (total < extra) {
      --lo;  // window for N = lo: gains k = lo + b_min, loses k = lo + b_max
      window += h(lo + b_min) - h(lo + b_max);
      total += window;
    }
  } else {  // extreme ranges: binary search on total(N)
    auto total = [&](int32_t N) {
      const int32_t off = N + b_min - 1;
      int64_t t = 0;
      for (int j = 0; j < np; ++j) {
        int32_t c = k[j] - off;
        c = c < 0 ? 0 : c;
        t += c > cap ? cap : c;
      }
      return t;
    };
    // total(lo) = pos_cap > extra >= 1 > 0 = total(hi): the largest N with total(N) >= extra.
    lo = kmin - b_max + 1;
    int32_t hi = kmax - b_min + 1;
    while (hi - lo > 1) {
      int32_t mid = lo + (hi - lo) / 2;
      (total(mid) >= extra ? lo : hi) = mid;
    }
  }
  // Blocks with an increment exactly at level lo are tied on level; the rest is settled. The
  // tied ones (index order) get a bin from the top bits of M: 32 bins, in value order.
  thread_local std::vector<int32_t> tied_buf, tbin_buf, in_cut_buf;
  thread_local std::vector<uint64_t> tied_m_buf;
  if (static_cast<int>(tied_buf.size()) < np)
    tied_buf.resize(np), tbin_buf.resize(np), in_cut_buf.resize(np), tied_m_buf.resize(np);
  int32_t* tied = tied_buf.data();
  int32_t* tbin = tbin_buf.data();
  int32_t* in_cut = in_cut_buf.data();
  uint64_t* tied_m = tied_m_buf.data();
  int bin_count[32] = {0};
  int nt = 0;
  int64_t taken = 0;
  const int32_t off = lo + b_min;  // count(j, lo + 1)
  for (int j = 0; j < np; ++j) {
    const int32_t c = k[j] - off;
    const int32_t above = c < 0 ? 0 : (c > cap ? cap : c);
    add[idx[j]] = above;
    taken += above;
    if (c >= 0 && c < cap) {  // count(j, lo) == above + 1
      const int b = static_cast<int>((mant[j] >> 48) - (uint64_t{1022} << 4));  // 0..31
      tied[nt] = idx[j];
      tied_m[nt] = mant[j];
      tbin[nt] = b;
      ++bin_count[b];
      ++nt;
    }
  }
  int64_t need = extra - taken;
  KVQ_ASSERT(need >= 1 && need <= nt);
  // Within the level, larger M = larger gain, equal gains to the lower index: every bin above the
  // one where the count reaches `need` is taken whole; that bin's members are ranked exactly.
  int cut = 31;
  int64_t above_cut = 0;
  while (above_cut + bin_count[cut] < need) above_cut += bin_count[cut--];
  int64_t rest = need - above_cut;  // taken from bin `cut`, 1 <= rest <= its size
  int nc = 0;
  for (int j = 0; j < nt; ++j) {
    add[tied[j]] += tbin[j] > cut;
    in_cut[nc] = j;
    nc += tbin[j] == cut;
  }
  // The cut bin is small: take its `rest` largest M one at a time; in_cut is in index order, so
  // the first maximum is the lowest index (the tie rule). A taken member's M is zeroed (every M
  // is >= 0.5), which keeps the order.
  for (; rest > 0; --rest) {
    int best = 0;
    for (int t = 1; t < nc; ++t)
      if (tied_m[in_cut[t]] > tied_m[in_cut[best]]) best = t;
    add[tied[in_cut[best]]] += 1;
    tied_m[in_cut[best]] = 0;
  }
}

// Generic convex table: top `extra` marginal gains s_i (D(b) - D(b+1)) under (gain desc, index
// asc). Gains fall (weakly) with b per block, so the selected set is a prefix of every block.
void select_table(const double* s, int n, int64_t extra, int b_min, int b_max,
                  const std::vector<double>& table, int* add) {
  struct Inc {
    double gain;
    int block;
  };
  thread_local std::vector<Inc> inc;
  inc.clear();
  for (int i = 0; i < n; ++i) {
    add[i] = 0;
    for (int b = b_min; b < b_max; ++b) inc.push_back({s[i] * (table[b] - table[b + 1]), i});
  }
  auto before = [](const Inc& a, const Inc& b) {
    return a.gain > b.gain || (a.gain == b.gain && a.block < b.block);
  };
  if (extra < static_cast<int64_t>(inc.size()))
    std::nth_element(inc.begin(), inc.begin() + extra, inc.end(), before);
  for (int64_t j = 0; j < extra; ++j) add[inc[j].block] += 1;
}

// Exact 4^-b for the widths in use (b <= 16).
double pow4neg(int b) {
  static const double t[] = {1.0,
                             0.25,
                             0.0625,
                             0.015625,
                             0.00390625,
                             0.0009765625,
                             0.000244140625,
                             6.103515625e-05,
                             1.52587890625e-05,
                             3.814697265625e-06,
                             9.5367431640625e-07,
                             2.384185791015625e-07,
                             5.9604644775390625e-08,
                             1.4901161193847656e-08,
                             3.725290298461914e-09,
                             9.313225746154785e-10,
                             2.3283064365386963e-10};
  return t[b];
}

// The greedy on validated inputs.
GreedyResult greedy_core(const std::vector<double>& energies, double bits_per_dim,
                         const GreedyOptions& opt) {
  const int64_t n = static_cast<int64_t>(energies.size());
  GreedyResult r;
  // The epsilon keeps decimal budgets such as 2.3 * 10 from flooring to 22 by binary rounding.
  r.budget = static_cast<int64_t>(std::floor(static_cast<double>(n) * bits_per_dim + 1e-9));
  r.budget = std::clamp(r.budget, n * opt.b_min, n * opt.b_max);
  const int64_t extra = r.budget - n * opt.b_min;
  r.bits.resize(n);
  if (opt.distortion_table.empty())
    select_pow4(energies.data(), static_cast<int>(n), extra, opt.b_min, opt.b_max, r.bits.data());
  else
    select_table(energies.data(), static_cast<int>(n), extra, opt.b_min, opt.b_max,
                 opt.distortion_table, r.bits.data());
  double j = 0.0;
  for (int64_t i = 0; i < n; ++i) {
    r.bits[i] += opt.b_min;
    r.used += r.bits[i];
    j += energies[i] * (opt.distortion_table.empty() ? pow4neg(r.bits[i])
                                                     : opt.distortion_table[r.bits[i]]);
  }
  KVQ_ASSERT(r.used == r.budget);
  r.effective_bits_per_dim = static_cast<double>(r.used) / static_cast<double>(n);
  r.objective = j;
  return r;
}

// Groups of equal width in increasing width, dims in block order; coords[2i], coords[2i+1] =
// block i's pair. Widths must be in [0, 16]. One pass sizes the groups, one fills them.
std::vector<TqGroup> groups_from_coords(const int* bits, int nb, const int* coords) {
  int count[17] = {0};
  for (int i = 0; i < nb; ++i) ++count[bits[i]];
  int distinct = 0;
  for (int w = 0; w <= 16; ++w) distinct += count[w] > 0;
  std::vector<TqGroup> groups(distinct);
  int* at[17];
  for (int w = 0, gi = 0; w <= 16; ++w) {
    at[w] = nullptr;
    if (!count[w]) continue;
    TqGroup& grp = groups[gi++];
    grp.bits = w;
    grp.dims.resize(2 * static_cast<size_t>(count[w]));
    at[w] = grp.dims.data();
  }
  for (int i = 0; i < nb; ++i) {
    int*& p = at[bits[i]];
    p[0] = coords[2 * i];
    p[1] = coords[2 * i + 1];
    p += 2;
  }
  return groups;
}

}  // namespace

void check_distortion_table(const std::vector<double>& t, int b_min, int b_max) {
  if (static_cast<int>(t.size()) <= b_max)
    fail("distortion_table", "needs entries for widths 0.." + num(b_max) + ", got " +
                                 num(static_cast<long long>(t.size())));
  for (int b = b_min; b <= b_max; ++b)
    if (!std::isfinite(t[b]) || t[b] < 0)
      fail("distortion_table", "D(" + num(b) + ") must be finite and >= 0, got " + num(t[b]));
  for (int b = b_min; b < b_max; ++b)
    if (!(t[b + 1] < t[b]))
      fail("distortion_table", "not strictly decreasing at b=" + num(b) + " (D=" + num(t[b]) +
                                   ", D(b+1)=" + num(t[b + 1]) + ")");
  // Convexity = falling marginal gains, the condition under which the greedy is optimal.
  for (int b = b_min + 1; b < b_max; ++b)
    if (t[b - 1] - t[b] < t[b] - t[b + 1])
      fail("distortion_table", "not convex at b=" + num(b) + ": the greedy is optimal only when "
                               "D(b-1)-D(b) >= D(b)-D(b+1)");
}

double block_gtq_objective(const std::vector<double>& s, const std::vector<int>& bits,
                           const std::vector<double>& table) {
  if (s.size() != bits.size())
    fail("bits", "expected " + num(static_cast<long long>(s.size())) + " widths, got " +
                     num(static_cast<long long>(bits.size())));
  for (int b : bits)
    if (b < 0 || b > 16 || (!table.empty() && b >= static_cast<int>(table.size())))
      fail("bits", "width " + num(b) + " outside the distortion model");
  double j = 0.0;
  for (size_t i = 0; i < s.size(); ++i)
    j += s[i] * (table.empty() ? pow4neg(bits[i]) : table[bits[i]]);
  return j;
}

GreedyResult block_gtq_greedy(const std::vector<double>& energies, double bits_per_dim,
                              const GreedyOptions& opt) {
  check_widths(opt.b_min, opt.b_max);
  check_bpd(bits_per_dim, opt.b_min, opt.b_max);
  check_energies(energies, "energies");
  if (!opt.distortion_table.empty())
    check_distortion_table(opt.distortion_table, opt.b_min, opt.b_max);
  return greedy_core(energies, bits_per_dim, opt);
}

std::vector<TqGroup> groups_from_block_bits(const std::vector<int>& block_bits,
                                            RopePairing pairing, int head_dim, int rotary_dim) {
  if (head_dim <= 0 || head_dim % 2) fail("head_dim", "must be positive and even, got " + num(head_dim));
  if (rotary_dim <= 0 || rotary_dim % 2 || rotary_dim > head_dim)
    fail("rotary_dim", "must be even and in [2, head_dim=" + num(head_dim) + "], got " + num(rotary_dim));
  if (static_cast<int>(block_bits.size()) != head_dim / 2)
    fail("block_bits", "expected " + num(head_dim / 2) + " blocks, got " +
                           num(static_cast<long long>(block_bits.size())));
  for (int w : block_bits)
    if (w < 0 || w > 16) fail("block_bits", "width " + num(w) + " outside [0, 16]");
  thread_local std::vector<int> coords;
  coords.resize(block_bits.size() * 2);
  for (int i = 0; i < static_cast<int>(block_bits.size()); ++i)
    rope_block_coords(pairing, head_dim, rotary_dim, i, &coords[2 * i], &coords[2 * i + 1]);
  return groups_from_coords(block_bits.data(), static_cast<int>(block_bits.size()), coords.data());
}

namespace {

// J(A) with each width's distortion at the size of the group it forms in A.
double self_consistent_objective(const std::vector<double>& s, const std::vector<int>& bits,
                                 const GroupDistortion& D) {
  int count[17] = {0};
  for (int b : bits) ++count[b];
  double j = 0.0;
  for (size_t i = 0; i < s.size(); ++i) j += s[i] * D(bits[i], 2 * count[bits[i]]);
  return j;
}

bool table_ok(const std::vector<double>& t, int b_min, int b_max) {
  try {
    check_distortion_table(t, b_min, b_max);
    return true;
  } catch (const Error&) {
    return false;
  }
}

// BlockGtqOptions::group_distortion's fixed point for one head (see the header).
GreedyResult greedy_group_distortion(const std::vector<double>& s, double bits_per_dim,
                                     const BlockGtqOptions& opt, int head_dim) {
  GreedyOptions g = opt.greedy;
  g.distortion_table.assign(static_cast<size_t>(g.b_max) + 1, 0.0);
  for (int b = 0; b <= g.b_max; ++b) g.distortion_table[static_cast<size_t>(b)] = opt.group_distortion(b, head_dim);
  GreedyResult best;
  double best_j = std::numeric_limits<double>::infinity();
  std::vector<int> prev;
  const int iters = std::max(1, opt.max_table_iterations);
  for (int k = 0; k < iters; ++k) {
    if (!table_ok(g.distortion_table, g.b_min, g.b_max)) {
      if (k == 0) check_distortion_table(g.distortion_table, g.b_min, g.b_max);  // names the fault
      break;
    }
    GreedyResult r = greedy_core(s, bits_per_dim, g);
    if (r.bits == prev) break;  // a fixed point: this table is the allocation's own
    r.objective = self_consistent_objective(s, r.bits, opt.group_distortion);
    prev = r.bits;
    int count[17] = {0};
    for (int b : r.bits) ++count[b];
    for (int b = 0; b <= g.b_max; ++b)
      g.distortion_table[static_cast<size_t>(b)] = opt.group_distortion(b, count[b] ? 2 * count[b] : 2);
    if (r.objective < best_j) {
      best_j = r.objective;
      best = std::move(r);
    }
  }
  return best;
}

}  // namespace

Allocation allocate_block_gtq(const BlockGtqInput& in, double bits_per_dim,
                              const BlockGtqOptions& opt) {
  validate_shape(in.shape);
  const int d = in.shape.head_dim;
  const int dr = in.rotary_dim == 0 ? d : in.rotary_dim;
  if (d % 2) fail("head_dim", "must be even for RoPE blocks, got " + num(d));
  if (dr <= 0 || dr % 2 || dr > d)
    fail("rotary_dim", "must be even and in [2, head_dim=" + num(d) + "], got " + num(dr));
  const GreedyOptions& g = opt.greedy;
  check_widths(g.b_min, g.b_max);
  check_bpd(bits_per_dim, g.b_min, g.b_max);
  if (!g.distortion_table.empty()) check_distortion_table(g.distortion_table, g.b_min, g.b_max);
  const int n = in.shape.n_heads();
  if (static_cast<int>(in.energies.size()) != n)
    fail("energies", "expected " + num(n) + " heads (layers x kv heads), got " +
                         num(static_cast<long long>(in.energies.size())));

  // Every head has the same blocks: their coordinate pairs once.
  const int nb = d / 2;
  std::vector<int> coords(2 * static_cast<size_t>(nb));
  for (int i = 0; i < nb; ++i)
    rope_block_coords(in.pairing, d, dr, i, &coords[2 * i], &coords[2 * i + 1]);

  Allocation out;
  out.heads.reserve(n);
  std::vector<double> per_head;
  per_head.reserve(n);
  int64_t budget = 0;
  for (int i = 0; i < n; ++i) {
    const int layer = in.shape.layer_of(i), head = in.shape.head_of(i);
    // The field name is only built on the error path (this loop runs for every head).
    auto field = [&] { return "energies[layer " + num(layer) + ", head " + num(head) + "]"; };
    const auto& e = in.energies[i];
    if (static_cast<int>(e.size()) != d / 2)
      fail(field(), "expected " + num(d / 2) + " RoPE blocks, got " +
                        num(static_cast<long long>(e.size())));
    // Fast check: sign bit clear and exponent below all-ones = finite and >= 0 (-0.0 and the
    // rest go to the exact check, which accepts -0.0 and names anything else).
    uint64_t bad = 0;
    for (double x : e) {
      uint64_t u;
      std::memcpy(&u, &x, sizeof u);
      bad |= (u >> 52) >= 0x7ff;
    }
    if (bad) check_energies(e, field());
    GreedyResult r = opt.group_distortion ? greedy_group_distortion(in.energies[i], bits_per_dim, opt, d)
                                          : greedy_core(in.energies[i], bits_per_dim, g);

    HeadDecision& h = out.heads.emplace_back();
    h.layer = layer;
    h.kv_head = head;
    h.side = Side::kK;
    h.kind = CodingKind::kTqGroups;
    h.post_rope = true;
    h.groups = groups_from_coords(r.bits.data(), nb, coords.data());
    for (auto& grp : h.groups)
      grp.rotation_seed = derive_seed(opt.seed, layer, head, Side::kK, static_cast<uint64_t>(grp.bits));
    h.block_bits = std::move(r.bits);
    h.budget_bits = static_cast<int>(2 * r.used);  // a block's width is per dim, 2 dims per block
    h.predicted_distortion = r.objective;
    budget += 2 * r.budget;
    per_head.push_back(r.objective);
  }

  auto& s = out.summary;
  s.method = Method::kBlockGtq;
  s.nominal_bpd = bits_per_dim;
  s.budget_total = budget;
  s.budget_assigned = budget;
  s.has_prediction = true;
  s.predicted_distortion = std::accumulate(per_head.begin(), per_head.end(), 0.0);
  s.distortion_std_before = s.distortion_std_after = population_std(per_head);
  summarize_bits(out.heads, d, opt.overhead, &s);
  std::string table;
  for (double v : g.distortion_table) table += (table.empty() ? "" : ",") + num(v);
  s.params = {{"b_min", num(g.b_min)},
              {"b_max", num(g.b_max)},
              {"distortion", opt.group_distortion ? "group-fixed-point" : g.distortion_table.empty() ? "4^-b" : "table"},
              {"distortion_table", table},
              {"budget_rule", "floor(n_b * bpd + 1e-9) block-bits per head"},
              {"tie_rule", "lower block index"},
              {"rotary_dim", num(dr)},
              {"pairing", to_string(in.pairing)},
              {"seed", num(static_cast<unsigned long long>(opt.seed))}};
  return out;
}

}  // namespace kvq::alloc
