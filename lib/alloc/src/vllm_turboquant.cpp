#include "kvq/alloc/vllm_turboquant.hpp"

#include <algorithm>
#include <cstdio>
#include <cmath>
#include <limits>
#include <numeric>

#include "internal.hpp"
#include "kvq/format/decision_layout.hpp"
#include "kvq/util/error.hpp"

namespace kvq::alloc {

using detail::fail;
using detail::num;

std::vector<int> vllm_tq_forced_layers(int n_layers) {
  std::vector<int> out;
  const int n = std::min(2, n_layers / 2);
  for (int l = 0; l < n; ++l) out.push_back(l);
  for (int l = n_layers - n; l < n_layers; ++l)
    if (std::find(out.begin(), out.end(), l) == out.end()) out.push_back(l);
  return out;
}

namespace {

int key_index(int bits) {
  for (int i = 0; i < kVllmTqKeyVariants; ++i)
    if (kVllmTqKeyBits[i] == bits) return i;
  return -1;
}
int value_index(int bits) {
  for (int i = 0; i < kVllmTqValueVariants; ++i)
    if (kVllmTqValueBits[i] == bits) return i;
  return -1;
}

// Bits per token of one head at `bits` (the packed layout of coding kind vllm-turboquant).
int64_t head_bits(Side side, int bits, int d) {
  HeadDecision probe;
  probe.kind = CodingKind::kVllmTurboQuant;
  probe.side = side;
  probe.bits = bits;
  return int64_t(layout::layout_for(probe, d).block_bytes) * 8;
}

// The engine's memory per (token, KV head): a coded layer's slot, [key | value] rounded up to an
// even size (TurboQuantConfig.slot_size_aligned), or a kept layer's K and V in the model dtype
// (2 bytes each). kvq's packed layout pads each side to even instead; the two agree when d >= 16.
int64_t slot_bits(int key_bits, int value_bits, int d) {
  if (key_bits == 16) return int64_t(2) * 2 * d * 8;
  const int64_t key = key_bits == 8 ? d : (int64_t(d) * key_bits + 7) / 8 + 2;
  const int64_t value = (int64_t(d) * value_bits + 7) / 8 + 4;
  return (key + value + 1) / 2 * 2 * 8;
}

// 17 significant digits: the recorded error read back is the same double (--max-error X with the
// recorded figure meets it).
std::string exact(double x) {
  char buf[40];
  std::snprintf(buf, sizeof buf, "%.17g", x);
  return buf;
}

std::string layer_list(const std::vector<int>& v) {
  std::string s;
  for (int l : v) s += (s.empty() ? "" : ",") + std::to_string(l);
  return s.empty() ? "none" : s;
}

struct Candidate {
  std::vector<int> kept;
  double error = 0;
  int64_t bits = 0;
};

// Per preset, the candidates k = 0, 1, ...: the forced layers plus the k largest positive gains.
struct PresetScan {
  std::vector<Candidate> ks;
};

}  // namespace

static PresetScan scan_preset(const VllmTqInput& in, const VllmTqPreset& p) {  // p: an element of in.presets
  const Shape& sh = in.shape;
  const int L = sh.n_layers, H = sh.n_kv_heads, d = sh.head_dim;
  const int ki = key_index(p.key_bits), vi = value_index(p.value_bits);
  const int kk = key_index(16), vk = value_index(16);
  std::vector<double> coded(size_t(L), 0.0), kept(size_t(L), 0.0);
  if (!in.layer_err.empty()) {
    const size_t P = in.presets.size(), pi = size_t(&p - in.presets.data());
    for (int l = 0; l < L; ++l) {
      coded[size_t(l)] = in.layer_err[size_t(l) * (P + 1) + pi];
      kept[size_t(l)] = in.layer_err[size_t(l) * (P + 1) + P];
    }
  }
  for (int l = 0; l < L && in.layer_err.empty(); ++l)
    for (int h = 0; h < H; ++h) {
      const size_t i = size_t(l * H + h);
      coded[size_t(l)] += in.k_err[i * kVllmTqKeyVariants + size_t(ki)] + in.v_err[i * kVllmTqValueVariants + size_t(vi)];
      kept[size_t(l)] += in.k_err[i * kVllmTqKeyVariants + size_t(kk)] + in.v_err[i * kVllmTqValueVariants + size_t(vk)];
    }
  const int64_t coded_bits = slot_bits(p.key_bits, p.value_bits, d) * H;
  const int64_t kept_bits = slot_bits(16, 16, d) * H;
  std::vector<char> is_kept(size_t(L), 0);
  for (int l : in.forced) is_kept[size_t(l)] = 1;
  std::vector<int> order;
  for (int l = 0; l < L; ++l)
    if (!is_kept[size_t(l)] && coded[size_t(l)] - kept[size_t(l)] > 0) order.push_back(l);
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) {
    return coded[size_t(a)] - kept[size_t(a)] > coded[size_t(b)] - kept[size_t(b)];
  });
  PresetScan scan;
  for (size_t k = 0; k <= order.size(); ++k) {
    if (k > 0) is_kept[size_t(order[k - 1])] = 1;
    Candidate c;
    for (int l = 0; l < L; ++l) {
      const bool kp = is_kept[size_t(l)] != 0;
      if (kp) c.kept.push_back(l);
      c.error += kp ? kept[size_t(l)] : coded[size_t(l)];
      c.bits += kp ? kept_bits : coded_bits;
    }
    scan.ks.push_back(std::move(c));
  }
  return scan;
}

VllmTqChoice choose_vllm_turboquant(const VllmTqInput& in, const VllmTqTarget& target) {
  const Shape& sh = in.shape;
  validate_shape(sh);
  const int L = sh.n_layers, H = sh.n_kv_heads, d = sh.head_dim;
  if (sh.v_dim() != d)
    fail("head_dim_v", "vLLM's TurboQuant codes K and V of one head dim (no MLA path); this model has K " + num(d) +
                           ", V " + num(sh.v_dim()));
  if (in.presets.empty()) fail("presets", "no preset to choose from");
  for (const auto& p : in.presets)
    if (key_index(p.key_bits) < 0 || p.key_bits == 16 || value_index(p.value_bits) < 0 || p.value_bits == 16)
      fail("presets", p.name + ": key bits " + num(p.key_bits) + ", value bits " + num(p.value_bits) + " is no preset");
  const size_t n_heads = size_t(L) * size_t(H);
  if (!in.layer_err.empty()) {
    if (in.layer_err.size() != size_t(L) * (in.presets.size() + 1))
      fail("error", "expected " + num(L) + " layers x " + num(static_cast<long long>(in.presets.size() + 1)) +
                        " settings of per-layer figures, got " + num(static_cast<long long>(in.layer_err.size())));
    for (double e : in.layer_err)
      if (!(std::isfinite(e) && e >= 0)) fail("error", "a per-layer figure is not finite and >= 0: " + num(e));
  } else if (in.k_err.size() != n_heads * kVllmTqKeyVariants || in.v_err.size() != n_heads * kVllmTqValueVariants) {
    fail("error", "expected " + num(static_cast<long long>(n_heads)) + " heads x widths per side");
  }
  for (double e : in.k_err)
    if (!(std::isfinite(e) && e >= 0)) fail("error", "a K figure is not finite and >= 0: " + num(e));
  for (double e : in.v_err)
    if (!(std::isfinite(e) && e >= 0)) fail("error", "a V figure is not finite and >= 0: " + num(e));
  for (int l : in.forced)
    if (l < 0 || l >= L) fail("forced", "layer " + num(l) + " outside 0.." + num(L - 1));
  const bool by_bpd = target.bpd > 0;
  if (by_bpd == (target.max_error >= 0)) fail("target", "give exactly one of a bits-per-dim budget and a largest error");
  if (by_bpd && !std::isfinite(target.bpd)) fail("bits_per_dim", "must be finite, got " + num(target.bpd));
  if (!by_bpd && !std::isfinite(target.max_error)) fail("max_error", "must be finite, got " + num(target.max_error));
  const double dims = double(L) * H * 2.0 * d;
  const int64_t budget = by_bpd ? static_cast<int64_t>(std::floor(target.bpd * dims)) : 0;

  bool found = false;
  VllmTqChoice best;
  Candidate cheapest, lowest;  // for the message when nothing meets the target
  std::string cheapest_p, lowest_p;
  bool any = false;
  for (size_t pi = 0; pi < in.presets.size(); ++pi) {
    const PresetScan scan = scan_preset(in, in.presets[pi]);
    if (!any || scan.ks.front().bits < cheapest.bits) cheapest = scan.ks.front(), cheapest_p = in.presets[pi].name;
    if (!any || scan.ks.back().error < lowest.error) lowest = scan.ks.back(), lowest_p = in.presets[pi].name;
    any = true;
    const Candidate* pick = nullptr;
    for (const Candidate& c : scan.ks) {
      if (by_bpd) {
        if (c.bits > budget) continue;
        if (!pick || c.error < pick->error || (c.error == pick->error && c.bits < pick->bits)) pick = &c;
      } else if (c.error <= target.max_error) {
        pick = &c;  // the fewest kept layers that meet the bound: the fewest bytes of this preset
        break;
      }
    }
    if (!pick) continue;
    const bool better =
        !found || (by_bpd ? (pick->error < best.error || (pick->error == best.error && pick->bits < best.bits))
                          : (pick->bits < best.bits || (pick->bits == best.bits && pick->error < best.error)));
    if (better) {
      found = true;
      best.preset = pi;
      best.kept = pick->kept;
      best.error = pick->error;
      best.bits = pick->bits;
      best.default_error = scan.ks.front().error;
      best.default_bits = scan.ks.front().bits;
    }
  }
  if (!found) {
    if (by_bpd)
      fail("bits_per_dim", num(target.bpd) + " is below the cheapest vllm-turboquant choice: " + cheapest_p +
                               " with the engine's kept layers (" + layer_list(cheapest.kept) + ") = " +
                               num(double(cheapest.bits) / dims) + " bits per dim");
    fail("max_error", "no vllm-turboquant choice has an error <= " + num(target.max_error) + ": the smallest reachable is " +
                          num(lowest.error) + " (" + lowest_p + ", layers kept " + layer_list(lowest.kept) + ")");
  }
  return best;
}

Allocation allocate_vllm_turboquant(const VllmTqInput& in, const VllmTqTarget& target) {
  const VllmTqChoice ch = choose_vllm_turboquant(in, target);
  const Shape& sh = in.shape;
  const int L = sh.n_layers, H = sh.n_kv_heads, d = sh.head_dim;
  const VllmTqPreset& p = in.presets[ch.preset];
  std::vector<char> kept(size_t(L), 0);
  for (int l : ch.kept) kept[size_t(l)] = 1;
  Allocation out;
  for (Side side : {Side::kK, Side::kV})
    for (int l = 0; l < L; ++l)
      for (int h = 0; h < H; ++h) {
        HeadDecision dec;
        dec.layer = l;
        dec.kv_head = h;
        dec.side = side;
        dec.kind = CodingKind::kVllmTurboQuant;
        dec.post_rope = side == Side::kK;  // the engine caches post-RoPE keys
        dec.bits = kept[size_t(l)] ? 16 : side == Side::kK ? p.key_bits : p.value_bits;
        dec.budget_bits = static_cast<int>(head_bits(side, dec.bits, d));
        const size_t i = size_t(l * H + h);
        if (in.layer_err.empty())
          dec.predicted_distortion = side == Side::kK ? in.k_err[i * kVllmTqKeyVariants + size_t(key_index(dec.bits))]
                                                      : in.v_err[i * kVllmTqValueVariants + size_t(value_index(dec.bits))];
        else if (h == 0 && side == Side::kK)  // the layer's figure, once (per-layer measurement)
          dec.predicted_distortion = in.layer_err[size_t(l) * (in.presets.size() + 1) +
                                                  (kept[size_t(l)] ? in.presets.size() : ch.preset)];
        out.heads.push_back(std::move(dec));
      }
  const double dims = double(L) * H * 2.0 * d;
  auto& s = out.summary;
  s.method = Method::kVllmTurboQuant;
  s.nominal_bpd = target.bpd > 0 ? target.bpd : double(ch.bits) / dims;
  s.budget_total = target.bpd > 0 ? static_cast<int64_t>(std::floor(target.bpd * dims)) : ch.bits;
  s.budget_assigned = ch.bits;
  s.has_prediction = true;
  s.predicted_distortion = ch.error;
  summarize_bits(out.heads, d, &s, d);
  s.params = {{"preset", p.name},
              {"kept_layers", layer_list(ch.kept)},
              {"forced_layers", layer_list(in.forced)},
              {"error", exact(ch.error)},
              {"default_error", exact(ch.default_error)},
              {"default_bpd", num(double(ch.default_bits) / dims)},
              {"target", target.bpd > 0 ? "bpd " + num(target.bpd) : "max_error " + num(target.max_error)}};
  return out;
}

}  // namespace kvq::alloc
