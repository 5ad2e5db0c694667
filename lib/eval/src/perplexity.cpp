#include "kvq/eval/perplexity.hpp"

#include <c10/core/InferenceMode.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <memory>

#include "kvq/util/error.hpp"
#include "kvq/util/progress.hpp"

namespace kvq {
namespace {

// -log softmax(logits[r])[targets[r]] for the rows of a [n, V] fp32 tensor, in double.
void nll_rows(const at::Tensor& logits, const std::vector<int64_t>& targets, double* out) {
  const int64_t n = logits.size(0);
  KVQ_ASSERT(n == int64_t(targets.size()));
  if (n == 0) return;
  at::Tensor lp = at::log_softmax(logits.to(at::kDouble), 1);
  at::Tensor t = at::from_blob(const_cast<int64_t*>(targets.data()), {n, 1}, at::kLong);
  at::Tensor g = lp.gather(1, t).contiguous();
  const double* p = g.data_ptr<double>();
  for (int64_t r = 0; r < n; ++r) out[r] = -p[r];
}

// Plain quantized cache: codes every position >= sink of every window, once.
class CodeFrom : public KvTransform {
 public:
  CodeFrom(const KvCoder& c, int sink) : c_(c), sink_(sink) {}
  void apply(LayerKv& kv) override {
    if (kv.seq <= sink_) return;
    // K and V rows of their own dims (MLA's served cache: 576 and 512).
    const size_t row = size_t(kv.n_kv_heads) * size_t(kv.head_dim), row_v = size_t(kv.n_kv_heads) * size_t(kv.v_dim());
    for (int b = 0; b < kv.batch; ++b) {
      const size_t tok = size_t(b) * size_t(kv.seq) + size_t(sink_);
      c_.code(kv.layer, kv.k + tok * row, kv.v + tok * row_v, kv.seq - sink_, kv.positions + sink_);
    }
  }

 private:
  const KvCoder& c_;
  int sink_;
};

// Protected cache (sink, recent): the forward keeps the full K/V and reads this coded copy where
// the policy says; positions before the sink are never read coded, so they are not coded.
class ProtectedCoder : public ProtectedKv {
 public:
  ProtectedCoder(const KvCoder& c, const CachePolicy& p) : code_from_(c, p.sink) {
    sink = p.sink;
    recent = p.recent;
  }
  void code(LayerKv& kv) override { code_from_.apply(kv); }

 private:
  CodeFrom code_from_;
};

void check_window(const Model& m, size_t T, int first_target, const CachePolicy& p) {
  if (T < 2) throw Error("", "window", "needs at least 2 tokens, got " + std::to_string(T));
  if (int64_t(T) > m.config().max_seq_len)
    throw Error(m.path(), "window", std::to_string(T) + " tokens exceed the model's maximum " +
                                        std::to_string(m.config().max_seq_len));
  KVQ_ASSERT(first_target >= 1 && size_t(first_target) < T);
  if (p.sink < 0 || p.recent < 0)
    throw Error("", p.sink < 0 ? "--sink" : "--recent", "must be >= 0");
}

// True when some query of a window of T tokens (queries 0..T-2) reads a coded entry.
bool any_coded(int64_t T, const CachePolicy& p) { return p.sink + p.recent < T - 1; }

// Windows of equal length T in one forward. Query positions are 0..T-2 (the last token only ever
// is a target). Plain cache (recent == 0): positions >= sink coded once; protected (recent > 0):
// the forward's per-pair selection; a cache that is full precision for every query: fp32.
void window_batch(const Model& m, const std::vector<const std::vector<int64_t>*>& wins, const std::vector<int>& firsts,
                  const KvCoder* coder, const CachePolicy& p, std::vector<std::vector<double>>& out,
                  double* kl_sum = nullptr) {
  c10::InferenceMode guard;
  const int64_t B = int64_t(wins.size()), T = int64_t(wins[0]->size()), Q = T - 1;
  at::Tensor ids = at::empty({B, Q}, at::kLong);
  for (int64_t b = 0; b < B; ++b) std::copy_n(wins[size_t(b)]->data(), Q, ids[b].data_ptr<int64_t>());
  std::unique_ptr<CodeFrom> plain;
  std::unique_ptr<ProtectedCoder> prot;
  Model::ForwardOptions fo;
  if (coder && any_coded(T, p)) {
    if (p.recent == 0)
      fo.kv_transform = (plain = std::make_unique<CodeFrom>(*coder, p.sink)).get();
    else
      fo.protected_kv = (prot = std::make_unique<ProtectedCoder>(*coder, p)).get();
  }
  at::Tensor logits = m.forward(ids, fo);  // [B, Q, V]
  // The end-to-end KL of the scored rows against the unquantized forward (0 when nothing is coded).
  if (kl_sum && (fo.kv_transform || fo.protected_kv)) {
    const at::Tensor ref = m.forward(ids);
    for (int64_t b = 0; b < B; ++b) {
      const int f = firsts[size_t(b)];
      const at::Tensor lp = at::log_softmax(ref[b].slice(0, f - 1, Q).to(at::kDouble), 1);
      const at::Tensor lq = at::log_softmax(logits[b].slice(0, f - 1, Q).to(at::kDouble), 1);
      *kl_sum += (lp.exp() * (lp - lq)).sum().item<double>();
    }
  }
  out.assign(size_t(B), {});
  for (int64_t b = 0; b < B; ++b) {
    const int f = firsts[size_t(b)];
    std::vector<int64_t> tgt(wins[size_t(b)]->begin() + f, wins[size_t(b)]->end());
    out[size_t(b)].resize(tgt.size());
    nll_rows(logits[b].slice(0, f - 1, Q), tgt, out[size_t(b)].data());
  }
}

}  // namespace

std::vector<double> window_token_nll(const Model& m, const std::vector<int64_t>& ids, int first_target,
                                     const KvCoder* coder, const CachePolicy& policy) {
  if (ids.size() >= 2 && (first_target < 1 || size_t(first_target) >= ids.size()))
    throw Error("", "first_target", std::to_string(first_target) + " is not in [1, " + std::to_string(ids.size()) + ")");
  check_window(m, ids.size(), first_target, policy);
  std::vector<std::vector<double>> out;
  window_batch(m, {&ids}, {first_target}, coder, policy, out);
  return out[0];
}

double PplResult::ppl() const { return std::exp(nll()); }

PplResult sliding_perplexity(const Model& m, const std::vector<int32_t>& text, const PplOptions& o,
                             const KvCoder* coder) {
  const int W = o.window, S = o.stride;
  if (W < 2 || W > m.config().max_seq_len)
    throw Error("", "--window", std::to_string(W) + " is not in [2, " + std::to_string(m.config().max_seq_len) +
                                    "] (the model's maximum sequence length)");
  const int P = int(o.prefix.size());
  if (P >= W)
    throw Error("", "--window", std::to_string(W) + " leaves no text token after the tokenizer's " + std::to_string(P) +
                                    "-token prefix");
  // A window holds W - P text tokens; a longer stride would skip some.
  const int max_stride = W - std::max(1, P);
  if (S < 1 || S > max_stride)
    throw Error("", "--stride", std::to_string(S) + " is not in [1, window - " + std::to_string(std::max(1, P)) +
                                    " = " + std::to_string(max_stride) + "]");
  if (o.policy.sink < 0 || o.policy.recent < 0)
    throw Error("", o.policy.sink < 0 ? "--sink" : "--recent", "must be >= 0");
  if (text.empty()) throw Error("", "text", "no tokens to score");
  if (P == 0 && text.size() < 2)
    throw Error("", "text", "one token and no BOS (the tokenizer adds none): nothing to score");

  struct Win {
    std::vector<int64_t> ids;
    int first = 1;
  };
  std::vector<Win> wins;
  const int64_t n = int64_t(text.size());
  for (int64_t begin = 0, prev_end = 0;; begin += S) {
    const int64_t end = std::min(begin + W - P, n);
    Win w;
    w.ids.reserve(size_t(end - begin + P));
    w.ids.assign(o.prefix.begin(), o.prefix.end());
    for (int64_t t = begin; t < end; ++t) w.ids.push_back(text[size_t(t)]);
    w.first = int(w.ids.size()) - int(end - prev_end);  // score only tokens past the previous window
    if (w.first < 1) w.first = 1;  // without a prefix the text's first token has no context to score it
    wins.push_back(std::move(w));
    prev_end = end;
    if (end == n) break;
  }

  PplResult r;
  r.windows = int64_t(wins.size());
  r.has_kl = o.kl && coder;
  const auto t0 = std::chrono::steady_clock::now();
  Progress prog(o.label, r.windows, "tok", o.quiet);
  auto add = [&](const std::vector<double>& v) {
    for (double x : v) r.nll_sum += x;
    r.tokens += int64_t(v.size());
  };
  const int64_t per = std::max<int64_t>(1, o.max_batch_tokens / W);
  for (size_t i = 0; i < wins.size();) {
    std::vector<const std::vector<int64_t>*> batch;
    std::vector<int> firsts;
    for (size_t j = i; j < wins.size() && int64_t(batch.size()) < per && wins[j].ids.size() == wins[i].ids.size(); ++j) {
      batch.push_back(&wins[j].ids);
      firsts.push_back(wins[j].first);
    }
    check_window(m, wins[i].ids.size(), wins[i].first, o.policy);
    std::vector<std::vector<double>> out;
    window_batch(m, batch, firsts, coder, o.policy, out, o.kl && coder ? &r.kl_sum : nullptr);
    for (const auto& v : out) add(v);
    r.forward_tokens += int64_t(batch.size()) * int64_t(wins[i].ids.size() - 1);
    ++r.forwards;
    i += batch.size();
    prog.update(int64_t(i), r.tokens);
  }
  prog.finish();
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  // Without a prefix the text's first token has no context, so it is the one token not scored.
  KVQ_ASSERT(r.tokens == (P > 0 ? n : n - 1));
  return r;
}

}  // namespace kvq
