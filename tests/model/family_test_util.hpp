#pragma once
// What the model-family tests share around a tiny checkpoint's forward: seeded prompts, kvq's logits
// of one prompt as doubles (hf_reference.hpp's layout, [T][V]) and the greedy ids of each row, the
// checkpoint of an hf::Spec with its reference model, the negative controls' measure, and a fixture
// that writes a checkpoint, loads it in kvq and compares kvq's forward with the reference's.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <iostream>
#include <random>
#include <string>
#include <vector>

#include "hf_reference.hpp"
#include "hf_tiny.hpp"
#include "kvq/model/model.hpp"
#include "model_test_util.hpp"

namespace kvq::test {

// T ids uniform over the vocabulary from `seed`.
inline std::vector<int> seeded_ids(int T, int vocab, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<int> ids(static_cast<size_t>(T));
  for (int& x : ids) x = int(rng() % uint32_t(vocab));
  return ids;
}

// kvq's logits of one prompt, [T][V] row-major in double.
inline ref::Vec kvq_logits(const Model& m, const std::vector<int>& ids,
                           const Model::ForwardOptions& opts = Model::ForwardOptions{}) {
  std::vector<int64_t> v(ids.begin(), ids.end());
  const at::Tensor l =
      m.forward(at::tensor(v, at::kLong).view({1, int64_t(v.size())}), opts)[0].to(at::kDouble).contiguous();
  return ref::Vec(l.data_ptr<double>(), l.data_ptr<double>() + l.numel());
}

// The argmax of each row of [T][V] logits.
inline std::vector<int64_t> argmax_rows(const ref::Vec& logits, int V) {
  std::vector<int64_t> out;
  for (size_t t = 0; t * size_t(V) < logits.size(); ++t) {
    auto b = logits.begin() + ptrdiff_t(t * size_t(V));
    out.push_back(std::max_element(b, b + V) - b);
  }
  return out;
}

// A prompt as the BOS-first families see it: `bos`, then seeded ids uniform over the vocabulary
// (never `bos` again), T in all.
inline std::vector<int> bos_prompt(int T, int vocab, uint32_t seed, int bos) {
  std::mt19937 rng(seed);
  std::vector<int> ids{bos};
  while (int(ids.size()) < T) {
    const int x = int(rng() % uint32_t(vocab));
    if (x != bos) ids.push_back(x);
  }
  return ids;
}

// A tiny checkpoint: its spec, its tensors as hf_tiny.hpp writes them, and the reference model read
// from those tensors.
struct Checkpoint {
  hf::Spec s;
  hf::TensorMap w;
  ref::Model m;
};

inline Checkpoint make_checkpoint(const hf::Spec& s) {
  Checkpoint ck{s, hf::make_weights(s), {}};
  ck.m = ref::from_hf(s, ck.w);
  return ck;
}

// A negative control's measure: how far the reference's logits move (relative max diff) with a
// feature switched off (`off`), or with `other` weights / a changed model, from `m`'s plain forward.
inline double control(const ref::Model& m, const std::vector<int>& ids, const ref::Options& off) {
  return ref::rel_max_diff(ref::forward(m, ids, off), ref::forward(m, ids));
}
inline double control(const ref::Model& m, const std::vector<int>& ids, const ref::Model& other) {
  return ref::rel_max_diff(ref::forward(other, ids), ref::forward(m, ids));
}
inline double control(const Checkpoint& ck, const std::vector<int>& ids, const ref::Options& off) {
  return control(ck.m, ids, off);
}
inline double control(const Checkpoint& ck, const std::vector<int>& ids, const ref::Model& other) {
  return control(ck.m, ids, other);
}

// kvq's forward of `ids` against the reference's: EXPECTs the greedy ids of every row equal and
// returns the relative max diff of the logits (to be held under the family's tolerance).
inline double compare_to_reference(const Model& model, const ref::Model& m, const std::vector<int>& ids,
                                   int vocab) {
  const ref::Vec want = ref::forward(m, ids), got = kvq_logits(model, ids);
  EXPECT_EQ(argmax_rows(got, vocab), argmax_rows(want, vocab));
  return ref::rel_max_diff(got, want);
}

// The checkpoint of `s` written to a temporary directory (hf::make_config, three shards) and loaded
// in kvq (streamed or not, at precision p).
struct Fixture {
  Checkpoint ck;
  TempDir dir;
  Model model;
  Fixture(const hf::Spec& s, bool stream = false, Precision p = Precision::kFp32)
      : ck(make_checkpoint(s)), model(load(stream, p)) {}
  Model load(bool stream, Precision p) {
    hf::write_model(dir.str(), hf::make_config(ck.s), ck.w, 3);
    Model::LoadOptions lo;
    lo.stream = stream;
    lo.precision = p;
    return Model::load(dir.str(), lo);
  }
  double compare(const std::vector<int>& ids) const { return compare_to_reference(model, ck.m, ids, ck.s.vocab); }
};

// The names a family test uses unqualified (`using namespace test::family_names;` in its file).
namespace family_names {
namespace hf = kvq::test::hf;
namespace ref = kvq::test::ref;
using kvq::test::argmax_rows;
using kvq::test::Checkpoint;
using kvq::test::control;
using kvq::test::Fixture;
using kvq::test::kvq_logits;
using kvq::test::make_checkpoint;
using nlohmann::json;
}  // namespace family_names

// kvq against the reference over each variant's checkpoint (variant_spec(v, 7 + k) for the k-th)
// and three prompts (prompt(T + seed % 3, vocab, seed), seeds 11, 12, 13): EXPECTs each relative max
// diff under tol (with the greedy ids equal) and prints the worst per variant as
// "[ info ] <family> '<what>' max rel diff <worst>".
template <class Variant, class SpecOf, class PromptOf>
void forward_matches_reference(const std::vector<Variant>& variants, SpecOf variant_spec, PromptOf prompt, int T,
                               double tol, const std::string& family) {
  uint32_t k = 0;
  for (const Variant& v : variants) {
    SCOPED_TRACE(v.what);
    Fixture f(variant_spec(v, 7 + k++));
    double worst = 0;
    for (uint32_t seed : {11u, 12u, 13u}) {
      const double d = f.compare(prompt(T + int(seed % 3), f.ck.s.vocab, seed));
      worst = std::max(worst, d);
      EXPECT_LT(d, tol) << v.what << ", prompt seed " << seed;
    }
    std::cout << "[ info ] " << family << " '" << v.what << "' max rel diff " << worst << "\n";
  }
}

// The BF16 forward against the BF16-emulated reference (bf16_bound.hpp), per prompt: kvq's distance
// to the emulation, the emulation's own move when its products are perturbed by 1e-6 relative (fp32
// accumulation's size of error) before rounding, and kvq's distance to the plain float64 reference.
struct Bf16Spread {
  std::vector<double> got, spread, plain;
  double max_got() const { return *std::max_element(got.begin(), got.end()); }
  double max_spread() const { return *std::max_element(spread.begin(), spread.end()); }
};
inline Bf16Spread measure_bf16_spread(const Model& m, const ref::Model& r, const std::vector<std::vector<int>>& prompts) {
  Bf16Spread out;
  for (const auto& ids : prompts) {
    const ref::Vec got = kvq_logits(m, ids);
    out.plain.push_back(ref::rel_max_diff(got, ref::forward(r, ids)));
    ref::Bf16Emulation on;
    const ref::Vec e0 = ref::forward(r, ids);
    ref::bf16_control().noise = 1e-6;
    const ref::Vec e1 = ref::forward(r, ids);
    ref::bf16_control().noise = 0;
    out.got.push_back(ref::rel_max_diff(got, e0));
    out.spread.push_back(ref::rel_max_diff(e1, e0));
  }
  return out;
}
// The median of an even-sized sample (the mean of the two middle values).
inline double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return 0.5 * (v[v.size() / 2 - 1] + v[v.size() / 2]);
}

}  // namespace kvq::test
