// KV-COBRA exact C2's staircase engine: per head, D*(B) over the model's (r, b) grid and its
// lower convex hull, built straight from the spectrum's prefix sums into the exact solver's flat
// staircases (exact_flat.hpp).
#include <algorithm>
#include <limits>

#include "cobra_internal.hpp"

namespace kvq::alloc::detail {

ModelGrid::ModelGrid(int d, const CobraModel& m, const std::vector<double>& qt, int64_t floor_b,
                     int64_t cap) {
  for (int r = m.r_min; r <= d; r += m.r_step) rank.push_back(r);
  J = static_cast<int>(rank.size());
  K = m.b_max - m.b_min + 1;
  JS = J + 2;
  struct Item {
    int64_t weight;
    int r, b, k, j;
  };
  std::vector<Item> items;
  chains.assign(J, 0);
  q_last.assign(J, 0.0);
  for (int k = 0; k < K; ++k) {
    const int b = m.b_min + k;
    q.push_back(qt[b]);
    int l = 0;
    while (l < J && int64_t{rank[l]} * b <= cap) ++l;
    len.push_back(l);
    for (int j = 0; j < l; ++j) {
      items.push_back({int64_t{rank[j]} * b, rank[j], b, k, j});
      chains[j] = k + 1;
      q_last[j] = qt[b];
    }
  }
  dom.assign(static_cast<size_t>(K) * J, J);
  dom_prev.assign(static_cast<size_t>(K) * J, J);
  auto heaviest = [&](int k, int64_t w) {  // in chain k, no heavier than w (J: none)
    int best = J;
    for (int jj = 0; jj < len[k] && int64_t{rank[jj]} * (m.b_min + k) <= w; ++jj) best = jj;
    return best;
  };
  for (int k = 1; k < K; ++k)
    for (int j = 0; j < len[k]; ++j) {
      const int64_t w = int64_t{rank[j]} * (m.b_min + k);
      dom[static_cast<size_t>(k) * J + j] = heaviest(0, w);
      if (k >= 2) dom_prev[static_cast<size_t>(k) * J + j] = heaviest(k - 1, w);
    }
  dom1.assign(J, J + 1);
  for (int j = 0; j < J; ++j)
    if (chains[j] > 1) dom1[j] = dom[static_cast<size_t>(J) + j];
  std::sort(items.begin(), items.end(), [](const Item& a, const Item& b) {
    if (a.weight != b.weight) return a.weight < b.weight;
    if (a.r != b.r) return a.r < b.r;
    return a.b > b.b;
  });
  pos.assign(static_cast<size_t>(K) * J, -1);
  words = static_cast<int>((items.size() + 63) / 64);
  for (size_t p = 0; p < items.size(); ++p) {
    const Item& it = items[p];
    slot.push_back(it.k * JS + it.j);
    cost.push_back(std::max(it.weight, floor_b));
    pos[static_cast<size_t>(it.k) * J + it.j] = static_cast<int32_t>(p);
  }
  for (int j = 0; j < len[0]; ++j) {
    cost0.push_back(std::max(int64_t{rank[j]} * m.b_min, floor_b));
    cost0d.push_back(static_cast<double>(cost0.back()));
    pos0.push_back(pos[j]);
    if (int64_t{rank[j]} * m.b_min <= floor_b) j_floor = j;
  }
  before0.assign(items.size() + 1, 0);
  for (size_t p = 0; p < items.size(); ++p) before0[p + 1] = before0[p] + (items[p].k == 0);
}

// One head's staircase D*(B) = min over grid options with r b <= B (plus rank 0 = S), each option
// charged max(r b, floor), its lower hull and the hull's slopes, appended to `st`. The same
// staircase as sorting all options by weight and keeping each that beats everything lighter (one
// that beats a step of its own cost replaces it), without visiting most options:
//  - D(r, b) = (S - P_r) + q(b) P_r, the expression every path uses (so all of them agree to the
//    bit). Chain 0 (b = b_min) is evaluated whole.
//  - An option (r, b), b > b_min, no better than an option of no greater weight is dominated
//    (that one costs no more and is no worse): neither a step nor a hull vertex. Tested against
//    the heaviest such option of chain 0 and of chain b - 1. Rank by rank, widths upward, a rank
//    stops as soon as even its lowest D (its widest b; computed D falls with q exactly, rounding
//    being monotone) is no better than that option, which weighs no more than any wider b of the
//    rank either. A rank is not visited at all when that holds at b_min + 1 against chain 0. With
//    q = c 4^-b small (c = 1/12) only a few ranks near d have options above chain 0 that survive
//    (the "extras").
//  - Steps and the hull (monotone chain, top two points in registers) are built in weight order,
//    merging chain 0 with the extras (a bitmap over the precomputed order). Where chain 0's slopes
//    fall strictly (the usual case past the floor: lambda falls), a run of chain-0 points between
//    two extras is appended without tests once its first two are on the hull. A step that
//    replaces the last one replaces the hull top: lowering a point never brings back points it
//    removed.
void model_stairs(const Prefix& pr, const ModelGrid& g, int64_t floor_b, int64_t cap,
                  bool merge_extras, StairScratch* sc, detail::Stairs* st) {
  const int J = g.J, JS = g.JS;
  const double S = pr.total();
  const double* P = pr.p;
  const double inf = std::numeric_limits<double>::infinity();
  double* vals = sc->vals.data();  // row k = chain k; row 0 = chain 0
  double* v0 = vals;
  v0[J] = inf;        // "no dominator": everything beats it
  v0[J + 1] = -inf;   // "no chain 1": nothing beats it
  const double q0 = g.q[0];
  int32_t* cand = sc->cand.data();
  int32_t* done = sc->done.data();  // chains evaluated per rank (chain 0 always; J: none)
  done[J] = 0;
  // Chain 0, and the ranks that may hold something better above it (the dominance rule below
  // at k = 1), heaviest first: dominators have ranks >= j, so their values are ready. On the way,
  // chain 0's slopes past the floor and the first rank from which they fall strictly and stay
  // positive: from there on every chain-0 point is a step and makes a left turn with the two
  // before it, so a run of them goes onto the staircase and the hull without tests (below).
  const int L0 = g.len[0];
  const int j0 = std::max(g.j_floor, 0);
  double* e0 = sc->e0.data();
  int convex_from = L0;  // none: no run goes in bulk
  bool convex = true;
  if (L0 >= 1) e0[L0 - 1] = 0.0;  // so that the last slope must be > 0
  int nc = 0;
  for (int j = J - 1; j >= 0; --j) {
    const double p = P[g.rank[j]];
    const double t = S - p;
    v0[j] = t + q0 * p;  // ranks beyond len[0] are never read through chain 0
    done[j] = 1;
    const double low = t + g.q_last[j] * p;
    cand[nc] = j;
    nc += !(low >= v0[g.dom1[j]]);
    if (j >= j0 && j + 1 < L0) {  // the slope to the next chain-0 point (as the hull computes it)
      const double e = (v0[j] - v0[j + 1]) / (g.cost0d[j + 1] - g.cost0d[j]);
      e0[j] = e;
      convex &= e > e0[j + 1];
      convex_from = convex ? j : convex_from;
    }
  }
  uint64_t* bm = sc->bm.data();  // the extras: options above chain 0 that survive
  std::fill(bm, bm + g.words, uint64_t{0});
  for (int i = 0; i < nc; ++i) {  // heaviest first: the chain k - 1 bound of (j, k) has rank >= j
    const int j = cand[i];
    const int nk = g.chains[j];
    const double p = P[g.rank[j]];
    const double t = S - p;
    const double low = t + g.q_last[j] * p;
    for (int k = 1; k < nk; ++k) {
      const size_t at = static_cast<size_t>(k) * J + j;
      // The better of the heaviest chain-0 and chain-(k-1) options no heavier than (j, k); the
      // latter only if it was evaluated (J for k = 1: chain 0 is the other one).
      const int ja = g.dom_prev[at];
      double dv = v0[g.dom[at]];
      if (done[ja] > k - 1) dv = std::min(dv, vals[static_cast<size_t>(k - 1) * JS + ja]);
      if (low >= dv) break;  // that option also bounds every wider b of this rank
      const double v = t + g.q[k] * p;
      vals[static_cast<size_t>(k) * JS + j] = v;
      done[j] = k + 1;
      if (v < dv) {
        const int p_at = g.pos[at];
        bm[p_at >> 6] |= uint64_t{1} << (p_at & 63);
      }
    }
  }
  st->reserve_more(g.slot.size() + 1);
  int64_t* oc = st->cost.data() + st->used();
  double* od = st->dist.data() + st->used();
  const size_t hs = st->hstart.back();
  int32_t* oh = st->hull.data() + hs;
  int64_t* hc = st->hcost.data() + hs;
  double* hd = st->hdist.data() + hs;
  double* he = st->eff.data() + hs;
  oc[0] = floor_b;  // rank 0: nothing stored, D = S
  od[0] = S;
  oh[0] = 0;
  hc[0] = floor_b;
  hd[0] = S;
  int np = 1, nh = 1;
  double best = S;
  int64_t last = floor_b;
  // The top two hull points in registers: (bx, by) = top, (ax, ay) = the one below (nh >= 2);
  // tj / aj = their chain-0 ranks (-1: not a chain-0 point, or not known). Everything here is a
  // plain local so that it stays in registers.
  double ax = 0.0, ay = 0.0, bx = static_cast<double>(floor_b), by = S;
  int tj = -1, aj = -1;
  bool rises = false;             // some slope rose (a bulk run's slopes fall by construction)
  int j = 0;                      // next chain-0 rank
  int w = 0;                      // extras: bitmap word, its remaining bits, next position
  if (!merge_extras) {  // set the extras aside (st->ex_*) and build chain 0 alone
    for (int wi = 0; wi < g.words; ++wi) {
      for (uint64_t x = bm[wi]; x; x &= x - 1) {
        const int p = (wi << 6) + __builtin_ctzll(x);
        st->ex_cost.push_back(g.cost[p]);
        st->ex_dist.push_back(vals[g.slot[p]]);
      }
      bm[wi] = 0;
    }
  }
  uint64_t bits = g.words > 0 ? bm[0] : 0;
  const int kNone = std::numeric_limits<int>::max();
  int pe = kNone;
  auto next_extra = [&bm, &w, &bits, &g, kNone]() {
    while (bits == 0 && ++w < g.words) bits = bm[w];
    if (bits == 0) return kNone;
    const int p = (w << 6) + __builtin_ctzll(bits);
    bits &= bits - 1;
    return p;
  };
  pe = next_extra();
  // Chain-0 ranks up to j_floor are all charged the floor: only their lowest D can be the step
  // there (whatever the order among equal costs), so the others are not visited.
  int j_first = -1;  // that rank, taken first
  if (g.j_floor >= 1) {
    j_first = 0;
    for (int t = 1; t <= g.j_floor; ++t) j_first = v0[t] < v0[j_first] ? t : j_first;
  }
  for (;;) {
    int64_t cst;
    double cx, v;
    int rank0;  // chain-0 rank of this point, -1 for an extra
    if (j_first >= 0) {
      cst = g.cost0[j_first], cx = g.cost0d[j_first], v = v0[j_first], rank0 = j_first;
      j_first = -1;
      j = g.j_floor + 1;
    } else if (j < L0 && g.pos0[j] < pe) {
      // Bulk: once the hull top is chain-0 point j - 1 and j turns left after it, every
      // chain-0 point up to the next extra is a step and a left turn (slopes fall from there).
      const bool prev2 = aj == j - 2 && j - 2 >= convex_from;  // that turn is already known
      if (tj == j - 1 && j - 1 >= convex_from &&
          (prev2 || nh < 2 || detail::left_turn(ax, ay, bx, by, g.cost0d[j], v0[j]))) {
        if (!prev2 && nh >= 2) rises |= e0[j - 1] > he[nh - 2];
        const int jb = pe == kNone ? L0 : g.before0[pe];
        int lnp = np, lnh = nh;
        for (int t = j; t < jb; ++t) {
          oc[lnp] = g.cost0[t];
          od[lnp] = v0[t];
          he[lnh - 1] = e0[t - 1];
          hc[lnh] = g.cost0[t];
          hd[lnh] = v0[t];
          oh[lnh++] = lnp++;
        }
        np = lnp, nh = lnh;
        ax = g.cost0d[jb - 2], ay = v0[jb - 2], bx = g.cost0d[jb - 1], by = v0[jb - 1];
        tj = jb - 1, aj = jb - 2;
        best = v0[jb - 1];
        last = g.cost0[jb - 1];
        j = jb;
        continue;
      }
      cst = g.cost0[j], cx = g.cost0d[j], v = v0[j], rank0 = j++;
    } else if (pe != kNone) {
      cst = g.cost[pe], cx = static_cast<double>(cst), v = vals[g.slot[pe]], rank0 = -1;
      pe = next_extra();
    } else {
      break;
    }
    // One step of the staircase and of the monotone-chain hull.
    if (!(v < best)) continue;
    best = v;
    if (cst == last) {  // same cost as the last step (the hull top): replace it
      --np, --nh;
      bx = ax, by = ay, tj = aj, aj = -1;
      if (nh >= 2) ax = static_cast<double>(hc[nh - 2]), ay = hd[nh - 2];
    }
    oc[np] = cst;
    od[np] = v;
    while (nh >= 2 && !detail::left_turn(ax, ay, bx, by, cx, v)) {
      --nh;
      bx = ax, by = ay, tj = aj, aj = -1;
      if (nh >= 2) ax = static_cast<double>(hc[nh - 2]), ay = hd[nh - 2];
    }
    if (nh >= 1) {  // the new segment's slope (the solver needs them non-increasing)
      const double e = (by - v) / (cx - bx);
      he[nh - 1] = e;
      rises |= nh >= 2 && e > he[nh - 2];
    }
    hc[nh] = cst;
    hd[nh] = v;
    oh[nh++] = np++;
    ax = bx, ay = by, bx = cx, by = v;
    aj = tj, tj = rank0;
    last = cst;
  }
  st->close_head(static_cast<size_t>(np), static_cast<size_t>(nh), floor_b, cap, !rises);
}

}  // namespace kvq::alloc::detail
