#include <algorithm>
#include <set>

#include "kvq/capture/capture.hpp"
#include "kvq/io/h5_paths.hpp"
#include "kvq/util/rng.hpp"
#include "kvq/util/error.hpp"

namespace kvq {

CalibFile merge_calib(const CalibFile& a, const std::string& na, const CalibFile& b, const std::string& nb) {
  auto refuse = [&](const std::string& field, const std::string& va, const std::string& vb) {
    throw Error(nb, field, "cannot merge: '" + vb + "' differs from " + na + "'s '" + va + "'");
  };
  const auto &pa = a.prov, &pb = b.prov;
  if (pa.model_config_sha256 != pb.model_config_sha256)
    refuse("provenance.model_config_sha256", pa.model_config_sha256, pb.model_config_sha256);
  if (pa.pairing != pb.pairing) refuse("provenance.rope_pairing", to_string(pa.pairing), to_string(pb.pairing));
  if (pa.rotary_dim != pb.rotary_dim)
    refuse("provenance.rotary_dim", std::to_string(pa.rotary_dim), std::to_string(pb.rotary_dim));
  if (pa.rope_type != pb.rope_type || pa.rope_inv_freq != pb.rope_inv_freq ||
      pa.rope_attention_factor != pb.rope_attention_factor)
    refuse("provenance.rope_inv_freq", pa.rope_type, pb.rope_type + " (different RoPE)");
  // Gemma 3's local layers' RoPE (version 7): which layers, and their frequencies.
  auto local_rope = [](const CalibProvenance& p) {
    if (!p.has_local_rope()) return std::string("none");
    std::string s = "layers";
    for (int l : p.rope_local_layers) s += " " + std::to_string(l);
    return s + ", inv_freq[1] " + std::to_string(p.rope_local_inv_freq.size() > 1 ? p.rope_local_inv_freq[1] : 0.0) +
           ", factor " + std::to_string(p.rope_local_attention_factor);
  };
  if (pa.rope_local_inv_freq != pb.rope_local_inv_freq || pa.rope_local_attention_factor != pb.rope_local_attention_factor ||
      pa.rope_local_layers != pb.rope_local_layers) {
    const std::string va = local_rope(pa), vb = local_rope(pb);
    refuse("provenance.rope_local_inv_freq", va, va == vb ? vb + " (other values)" : vb);
  }
  if (pa.tokenizer_sha256 != pb.tokenizer_sha256)
    refuse("provenance.tokenizer_sha256", pa.tokenizer_sha256, pb.tokenizer_sha256);
  if (pa.special_tokens_mode != pb.special_tokens_mode)
    refuse("provenance.special_tokens_mode", pa.special_tokens_mode, pb.special_tokens_mode);
  if (pa.forward_precision != pb.forward_precision)
    refuse("provenance.forward_precision", pa.forward_precision, pb.forward_precision);
  if (pa.seq_len != pb.seq_len) refuse("provenance.seq_len", std::to_string(pa.seq_len), std::to_string(pb.seq_len));
  if (pa.v_dim() != pb.v_dim()) refuse("provenance.head_dim_v", std::to_string(pa.v_dim()), std::to_string(pb.v_dim()));
  if (pa.attn_scale() != pb.attn_scale())
    refuse("provenance.softmax_scale", std::to_string(pa.attn_scale()), std::to_string(pb.attn_scale()));
  if (!(a.shape() == b.shape())) refuse(h5path::kStats, "shape A", "shape B");
  // An empty layer_window (older file) means every layer full, the same as all zeros.
  for (int l = 0; l < pa.n_layers; ++l)
    if (pa.window_of(l) != pb.window_of(l))
      refuse("provenance.layer_window", "layer " + std::to_string(l) + " window " + std::to_string(pa.window_of(l)),
             "layer " + std::to_string(l) + " window " + std::to_string(pb.window_of(l)));
  if (pa.attention_sinks != pb.attention_sinks)
    refuse("provenance.attention_sinks", pa.has_sinks() ? "recorded" : "none",
           pb.has_sinks() ? (pa.has_sinks() ? "other values" : "recorded") : "none");
  if (!a.complete()) throw Error(na, h5path::kWindowsDone, "incomplete file (resume it before merging)");
  if (!b.complete()) throw Error(nb, h5path::kWindowsDone, "incomplete file (resume it before merging)");
  // Windows are identified by their token offset when the corpora are the same text.
  bool same_corpus = pa.corpus.size() == pb.corpus.size() &&
                     std::equal(pa.corpus.begin(), pa.corpus.end(), pb.corpus.begin(),
                                [](const CorpusFile& x, const CorpusFile& y) { return x.sha256 == y.sha256; });
  if (same_corpus) {
    std::set<int64_t> sa(a.calib_offsets.begin(), a.calib_offsets.end());
    for (int64_t off : b.calib_offsets)
      if (sa.count(off))
        throw Error(nb, h5path::kCalibOffsets,
                    "cannot merge: window at token offset " + std::to_string(off) + " is also in " + na);
  }

  CalibFile m = a;
  m.moments.add(b.moments);
  m.calib_offsets.insert(m.calib_offsets.end(), b.calib_offsets.begin(), b.calib_offsets.end());
  m.windows_done = a.windows_done + b.windows_done;
  m.prov.samples = pa.samples + pb.samples;
  if (!same_corpus)
    m.prov.corpus.insert(m.prov.corpus.end(), pb.corpus.begin(), pb.corpus.end());
  m.window_rank.clear();

  // Held-out windows: identical sets are kept once; otherwise both are kept.
  if (!(same_corpus && a.holdout_offsets == b.holdout_offsets) && b.holdout.windows > 0) {
    m.holdout_offsets.insert(m.holdout_offsets.end(), b.holdout_offsets.begin(), b.holdout_offsets.end());
    const auto sh = a.shape();
    const size_t T = size_t(pa.seq_len);
    const size_t Ma = size_t(a.holdout.windows), Mb = size_t(b.holdout.windows);
    auto cat = [&](const payload::FloatVector& xa, const payload::FloatVector& xb, size_t heads, size_t d) {
      payload::FloatVector out;
      const size_t per = T * heads * d;
      for (size_t l = 0; l < size_t(sh.n_layers); ++l) {
        out.insert(out.end(), xa.begin() + long(l * Ma * per), xa.begin() + long((l + 1) * Ma * per));
        out.insert(out.end(), xb.begin() + long(l * Mb * per), xb.begin() + long((l + 1) * Mb * per));
      }
      return out;
    };
    m.holdout.q = cat(a.holdout.q, b.holdout.q, size_t(sh.n_heads), size_t(sh.head_dim));
    m.holdout.k = cat(a.holdout.k, b.holdout.k, size_t(sh.n_kv_heads), size_t(sh.head_dim));
    m.holdout.v = cat(a.holdout.v, b.holdout.v, size_t(sh.n_kv_heads), size_t(sh.v_dim()));
    m.holdout.ids.insert(m.holdout.ids.end(), b.holdout.ids.begin(), b.holdout.ids.end());
    m.holdout.windows = int(Ma + Mb);
    m.prov.holdout = m.holdout.windows;
  }

  // Reservoir: a uniform sample of the union, drawn from both in proportion to what each saw.
  const auto& ra = a.reservoir;
  const auto& rb = b.reservoir;
  Reservoir r;
  r.capacity = std::max(ra.capacity, rb.capacity);
  r.seen = ra.seen + rb.seen;
  r.rng_state = ra.rng_state;
  Rng rng(uint64_t(ra.seen) * 0x9e3779b97f4a7c15ULL ^ uint64_t(rb.seen));
  // Visit each reservoir in a seeded random order: Algorithm R leaves early tokens in low slots.
  auto order = [&](int64_t n) {
    std::vector<int64_t> p(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) p[size_t(i)] = i;
    for (int64_t i = n - 1; i > 0; --i) std::swap(p[size_t(i)], p[size_t(rng.below(uint64_t(i + 1)))]);
    return p;
  };
  const std::vector<int64_t> oa = order(ra.size()), ob = order(rb.size());
  int64_t left_a = ra.size(), left_b = rb.size(), seen_a = ra.seen, seen_b = rb.seen;
  std::vector<int> from;  // 0 = a, 1 = b, in draw order
  while (int64_t(from.size()) < r.capacity && (left_a > 0 || left_b > 0)) {
    bool pick_a = left_b == 0 || (left_a > 0 && rng.below(uint64_t(seen_a + seen_b)) < uint64_t(seen_a));
    from.push_back(pick_a ? 0 : 1);
    --(pick_a ? left_a : left_b);
  }
  const auto sh = a.shape();
  const size_t L = size_t(sh.n_layers), d = size_t(sh.head_dim);
  const size_t nq = size_t(sh.n_heads) * d * L, nkv = size_t(sh.n_kv_heads) * d * L;
  const size_t nv = size_t(sh.n_kv_heads) * size_t(sh.v_dim()) * L;
  int64_t ia = 0, ib = 0;
  for (int f : from) {
    const Reservoir& src = f == 0 ? ra : rb;
    int64_t i = f == 0 ? oa[size_t(ia++)] : ob[size_t(ib++)];
    int64_t win = src.source[size_t(i) * 2] + (f == 0 ? 0 : int64_t(a.calib_offsets.size()));
    r.source.push_back(win);
    r.source.push_back(src.source[size_t(i) * 2 + 1]);
    if (!src.q.empty()) {
      r.q.insert(r.q.end(), src.q.begin() + long(size_t(i) * nq), src.q.begin() + long(size_t(i + 1) * nq));
      r.k.insert(r.k.end(), src.k.begin() + long(size_t(i) * nkv), src.k.begin() + long(size_t(i + 1) * nkv));
      r.v.insert(r.v.end(), src.v.begin() + long(size_t(i) * nv), src.v.begin() + long(size_t(i + 1) * nv));
    }
  }
  m.reservoir = std::move(r);
  m.prov.reservoir_tokens = int(m.reservoir.capacity);
  return m;
}

}  // namespace kvq
