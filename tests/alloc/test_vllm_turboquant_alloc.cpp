// kvq-allocate --method vllm-turboquant's choice (lib/alloc/src/vllm_turboquant.cpp) against a brute
// force over every preset x every kept-layer subset that contains the engine's forced layers, with
// the memory of each setting counted from the engine's own slot sizes (vllm_tq::slot_layout's
// slot_bytes, not kvq's packed layout, which pads each side: they differ at d = 8) and the errors
// summed here from the per-head figures:
//  --bpd B:       the lowest total error whose bits fit floor(B * L * H * 2d), ties to fewer bits;
//  --max-error X: the fewest bits whose error is <= X, ties to the lower error.
// Plus vLLM's boundary rule (get_boundary_skip_layers(L, 2): first and last min(2, L // 2) layers).
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "kvq/alloc/vllm_turboquant.hpp"
#include "kvq/codec/vllm_turboquant.hpp"
#include "kvq/util/error.hpp"

namespace {

using kvq::alloc::VllmTqInput;
using kvq::alloc::VllmTqTarget;

VllmTqInput random_input(int L, int H, int d, uint32_t seed, std::vector<int> forced) {
  VllmTqInput in;
  in.shape = {L, H, d, d};
  for (int p = 0; p < kvq::vllm_tq::kNumPresets; ++p) {
    const auto& i = kvq::vllm_tq::info(kvq::vllm_tq::Preset(p));
    in.presets.push_back({i.name, i.key_bits, i.value_bits});
  }
  std::mt19937 rng(seed);
  std::uniform_real_distribution<double> u(0.0, 1.0);
  // Per head: K errors fall with the width (3 > 4 > 8 > kept), V errors (3 > 4 > kept); the
  // layers differ by a random sensitivity so that the order of layers matters.
  for (int l = 0; l < L; ++l) {
    const double sens = std::exp(3.0 * u(rng));
    for (int h = 0; h < H; ++h) {
      const double k3 = sens * (0.5 + u(rng)), k4 = k3 * (0.2 + 0.2 * u(rng)), k8 = k4 * 0.05 * u(rng);
      in.k_err.insert(in.k_err.end(), {k3, k4, k8, 1e-6 * u(rng)});
      const double v3 = sens * (0.5 + u(rng)), v4 = v3 * (0.2 + 0.2 * u(rng));
      in.v_err.insert(in.v_err.end(), {v3, v4, 1e-6 * u(rng)});
    }
  }
  in.forced = std::move(forced);
  return in;
}

struct Best {
  bool found = false;
  std::string preset;
  std::vector<int> kept;
  double error = 0;
  int64_t bits = 0;
};

int key_i(int b) { return b == 3 ? 0 : b == 4 ? 1 : b == 8 ? 2 : 3; }
int val_i(int b) { return b == 3 ? 0 : b == 4 ? 1 : 2; }

Best brute_force(const VllmTqInput& in, const VllmTqTarget& t) {
  const int L = in.shape.n_layers, H = in.shape.n_kv_heads, d = in.shape.head_dim;
  const int64_t budget = static_cast<int64_t>(std::floor(t.bpd * double(L) * H * 2 * d));
  Best best;
  unsigned forced_mask = 0;
  for (int l : in.forced) forced_mask |= 1u << l;
  for (const auto& p : in.presets) {
    const auto sl = kvq::vllm_tq::slot_layout(*kvq::vllm_tq::parse_preset(p.name), d);
    const int64_t coded_bits = int64_t(H) * sl.slot_bytes * 8;  // the engine's slot, padded to even
    const int64_t kept_bits = int64_t(H) * 2 * d * 2 * 8;  // K and V in BF16
    for (unsigned S = 0; S < (1u << L); ++S) {
      if ((S & forced_mask) != forced_mask) continue;
      double err = 0;
      int64_t bits = 0;
      for (int l = 0; l < L; ++l) {
        const bool kept = (S >> l) & 1u;
        for (int h = 0; h < H; ++h) {
          const size_t i = size_t(l * H + h);
          err += in.k_err[i * 4 + size_t(key_i(kept ? 16 : p.key_bits))] +
                 in.v_err[i * 3 + size_t(val_i(kept ? 16 : p.value_bits))];
        }
        bits += kept ? kept_bits : coded_bits;
      }
      bool better;
      if (t.bpd > 0) {
        if (bits > budget) continue;
        better = !best.found || err < best.error - 1e-12 * err || (std::fabs(err - best.error) <= 1e-12 * err && bits < best.bits);
      } else {
        if (err > t.max_error) continue;
        better = !best.found || bits < best.bits || (bits == best.bits && err < best.error - 1e-12 * err);
      }
      if (better) {
        best.found = true;
        best.preset = p.name;
        best.error = err;
        best.bits = bits;
        best.kept.clear();
        for (int l = 0; l < L; ++l)
          if ((S >> l) & 1u) best.kept.push_back(l);
      }
    }
  }
  return best;
}

int g_found = 0;  // cases with a feasible choice (most must be)

void expect_same(const VllmTqInput& in, const VllmTqTarget& t, const std::string& where) {
  const Best bf = brute_force(in, t);
  g_found += bf.found;
  if (!bf.found) {
    EXPECT_THROW(kvq::alloc::choose_vllm_turboquant(in, t), kvq::Error) << where;
    return;
  }
  const auto ch = kvq::alloc::choose_vllm_turboquant(in, t);
  EXPECT_EQ(in.presets[ch.preset].name, bf.preset) << where;
  EXPECT_EQ(ch.kept, bf.kept) << where;
  EXPECT_EQ(ch.bits, bf.bits) << where;
  EXPECT_NEAR(ch.error, bf.error, 1e-12 * bf.error) << where;
}

}  // namespace

TEST(VllmTqAlloc, ForcedLayersAreTheEnginesBoundaryRule) {
  using V = std::vector<int>;
  EXPECT_EQ(kvq::alloc::vllm_tq_forced_layers(0), V{});
  EXPECT_EQ(kvq::alloc::vllm_tq_forced_layers(1), V{});       // n = min(2, 0)
  EXPECT_EQ(kvq::alloc::vllm_tq_forced_layers(2), (V{0, 1}));  // n = 1
  EXPECT_EQ(kvq::alloc::vllm_tq_forced_layers(3), (V{0, 2}));
  EXPECT_EQ(kvq::alloc::vllm_tq_forced_layers(4), (V{0, 1, 2, 3}));
  EXPECT_EQ(kvq::alloc::vllm_tq_forced_layers(5), (V{0, 1, 3, 4}));
  EXPECT_EQ(kvq::alloc::vllm_tq_forced_layers(32), (V{0, 1, 30, 31}));
}

TEST(VllmTqAlloc, BudgetChoiceEqualsBruteForce) {
  int cases = 0;
  for (uint32_t seed = 1; seed <= 6; ++seed)
    for (const auto& [L, forced] : std::vector<std::pair<int, std::vector<int>>>{
             {4, {}}, {4, {3}}, {8, kvq::alloc::vllm_tq_forced_layers(8)}})
      for (double bpd = 3.0; bpd <= 16.5; bpd += 0.25)
        for (int d : {8, 64}) {
        const VllmTqInput in = random_input(L, 2, d, seed, forced);
        VllmTqTarget t;
        t.bpd = bpd;
        expect_same(in, t, "seed " + std::to_string(seed) + " L " + std::to_string(L) + " d " + std::to_string(d) +
                               " bpd " + std::to_string(bpd));
        ++cases;
        }
  EXPECT_GT(cases, 300);
  EXPECT_GT(g_found, cases / 2);  // 8 layers with 4 forced need >= 9.69 bits per dim
}

TEST(VllmTqAlloc, MaxErrorChoiceEqualsBruteForce) {
  for (uint32_t seed = 11; seed <= 16; ++seed)
    for (const auto& [L, forced] : std::vector<std::pair<int, std::vector<int>>>{
             {4, {}}, {4, {0}}, {8, kvq::alloc::vllm_tq_forced_layers(8)}}) {
      for (int d : {8, 64}) {
      const VllmTqInput in = random_input(L, 2, d, seed, forced);
      // Bounds from the largest error (all coded at 3 bits) down past the smallest reachable.
      double top = 0;
      for (double e : in.k_err) top += e;
      for (double e : in.v_err) top += e;
      for (double x = top; x > 1e-7; x *= 0.8) {
        VllmTqTarget t;
        t.max_error = x;
        expect_same(in, t, "seed " + std::to_string(seed) + " L " + std::to_string(L) + " d " + std::to_string(d) +
                               " max_error " + std::to_string(x));
      }
      // The recorded error read back meets its own bound: the same choice, not a dearer one.
      VllmTqTarget b;
      b.bpd = 16.0;
      const auto best = kvq::alloc::allocate_vllm_turboquant(in, b);
      VllmTqTarget again;
      again.max_error = std::stod(best.summary.params[3].second);
      ASSERT_EQ(best.summary.params[3].first, "error");
      EXPECT_EQ(kvq::alloc::choose_vllm_turboquant(in, again).error, std::stod(best.summary.params[3].second));
      }
    }
}

TEST(VllmTqAlloc, UnreachableTargetsNameWhatIsReachable) {
  const VllmTqInput in = random_input(8, 2, 64, 3, kvq::alloc::vllm_tq_forced_layers(8));
  VllmTqTarget t;
  t.bpd = 1.0;
  try {
    kvq::alloc::choose_vllm_turboquant(in, t);
    FAIL() << "1 bpd accepted";
  } catch (const kvq::Error& e) {
    EXPECT_NE(std::string(e.what()).find("below the cheapest vllm-turboquant choice: turboquant_3bit_nc"), std::string::npos)
        << e.what();
  }
  VllmTqTarget m;
  m.max_error = 0.0;
  try {
    kvq::alloc::choose_vllm_turboquant(in, m);
    FAIL() << "error 0 accepted";
  } catch (const kvq::Error& e) {
    EXPECT_NE(std::string(e.what()).find("the smallest reachable is"), std::string::npos) << e.what();
  }
  VllmTqInput mla = in;
  mla.shape.head_dim_v = 32;
  EXPECT_THROW(kvq::alloc::choose_vllm_turboquant(mla, t), kvq::Error);
}

TEST(VllmTqAlloc, AllocationWritesThePresetAndKeptLayers) {
  const VllmTqInput in = random_input(8, 2, 64, 5, kvq::alloc::vllm_tq_forced_layers(8));
  VllmTqTarget t;
  t.bpd = 11.0;  // the 4 forced layers of 8 alone cost 9.69 bits per dim
  const auto ch = kvq::alloc::choose_vllm_turboquant(in, t);
  EXPECT_GE(ch.kept.size(), 4u);
  EXPECT_LE(ch.error, ch.default_error);
  const auto a = kvq::alloc::allocate_vllm_turboquant(in, t);
  ASSERT_EQ(a.heads.size(), size_t(8 * 2 * 2));
  const auto& p = in.presets[ch.preset];
  int64_t bits = 0;
  for (const auto& h : a.heads) {
    const bool kept = std::find(ch.kept.begin(), ch.kept.end(), h.layer) != ch.kept.end();
    EXPECT_EQ(h.kind, kvq::CodingKind::kVllmTurboQuant);
    EXPECT_EQ(h.bits, kept ? 16 : h.side == kvq::Side::kK ? p.key_bits : p.value_bits);
    bits += h.budget_bits;
  }
  EXPECT_EQ(bits, ch.bits);
  EXPECT_LE(double(bits), 11.0 * 8 * 2 * 2 * 64);
}

// The end-to-end probe's per-layer figures (a layer's K and V coded together, one figure per preset
// and one kept) in place of the per-head sums: the same brute force, errors from the layer table.
TEST(VllmTqAlloc, PerLayerFiguresChoiceEqualsBruteForce) {
  for (uint32_t seed = 21; seed <= 26; ++seed) {
    VllmTqInput in = random_input(8, 2, 64, seed, kvq::alloc::vllm_tq_forced_layers(8));
    std::mt19937 rng(seed);
    std::uniform_real_distribution<double> u(0.0, 1.0);
    const size_t P = in.presets.size();
    in.layer_err.assign(8 * (P + 1), 0.0);
    for (int l = 0; l < 8; ++l) {
      const double sens = std::exp(2.0 * u(rng));
      for (size_t p = 0; p < P; ++p) in.layer_err[size_t(l) * (P + 1) + p] = sens * (0.1 + u(rng));
      in.layer_err[size_t(l) * (P + 1) + P] = 1e-4 * u(rng);
    }
    // Brute force over presets x subsets, errors from the table, the engine's slot sizes.
    auto brute = [&](const VllmTqTarget& t) {
      Best best;
      const int64_t budget = static_cast<int64_t>(std::floor(t.bpd * 8.0 * 2 * 2 * 64));
      for (size_t p = 0; p < P; ++p) {
        const auto sl = kvq::vllm_tq::slot_layout(*kvq::vllm_tq::parse_preset(in.presets[p].name), 64);
        for (unsigned S = 0; S < 256u; ++S) {
          if ((S & 0xC3u) != 0xC3u) continue;  // layers 0, 1, 6, 7 always kept
          double err = 0;
          int64_t bits = 0;
          for (int l = 0; l < 8; ++l) {
            const bool kept = (S >> l) & 1u;
            err += in.layer_err[size_t(l) * (P + 1) + (kept ? P : p)];
            bits += kept ? int64_t(2) * 2 * 2 * 64 * 8 : int64_t(2) * sl.slot_bytes * 8;
          }
          const bool ok = t.bpd > 0 ? bits <= budget : err <= t.max_error;
          if (!ok) continue;
          const bool better = !best.found || (t.bpd > 0 ? (err < best.error || (err == best.error && bits < best.bits))
                                                        : (bits < best.bits || (bits == best.bits && err < best.error)));
          if (better) {
            best = Best{true, in.presets[p].name, {}, err, bits};
            for (int l = 0; l < 8; ++l)
              if ((S >> l) & 1u) best.kept.push_back(l);
          }
        }
      }
      return best;
    };
    for (double bpd = 9.75; bpd <= 16.0; bpd += 0.25) {  // the 4 forced layers alone need 9.69
      VllmTqTarget t;
      t.bpd = bpd;
      const Best bf = brute(t);
      ASSERT_TRUE(bf.found);
      const auto ch = kvq::alloc::choose_vllm_turboquant(in, t);
      EXPECT_EQ(in.presets[ch.preset].name, bf.preset) << bpd;
      EXPECT_EQ(ch.kept, bf.kept) << bpd;
      EXPECT_NEAR(ch.error, bf.error, 1e-12 * bf.error) << bpd;
    }
    for (double x = 20; x > 1e-3; x *= 0.7) {
      VllmTqTarget t;
      t.max_error = x;
      const Best bf = brute(t);
      if (!bf.found) {
        EXPECT_THROW(kvq::alloc::choose_vllm_turboquant(in, t), kvq::Error);
        continue;
      }
      const auto ch = kvq::alloc::choose_vllm_turboquant(in, t);
      EXPECT_EQ(ch.bits, bf.bits) << x;
      EXPECT_NEAR(ch.error, bf.error, 1e-12 * bf.error) << x;
    }
  }
}
