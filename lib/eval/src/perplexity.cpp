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

at::Tensor rows_tensor(const std::vector<int64_t>& ids, int64_t len, int64_t rows) {
  at::Tensor one = at::from_blob(const_cast<int64_t*>(ids.data()), {1, len}, at::kLong);
  return one.expand({rows, len}).contiguous();
}

// Plain quantized cache: codes every position >= sink of every window, once.
class CodeFrom : public KvTransform {
 public:
  CodeFrom(const KvCoder& c, int sink) : c_(c), sink_(sink) {}
  void apply(LayerKv& kv) override {
    if (kv.seq <= sink_) return;
    const size_t row = size_t(kv.n_kv_heads) * size_t(kv.head_dim);
    for (int b = 0; b < kv.batch; ++b) {
      const size_t off = (size_t(b) * size_t(kv.seq) + size_t(sink_)) * row;
      c_.code(kv.layer, kv.k + off, kv.v + off, kv.seq - sink_, kv.positions + sink_);
    }
  }

 private:
  const KvCoder& c_;
  int sink_;
};

// What a decode loop's cache holds for one window: per layer, every token's K/V as its own forward
// produced them (full precision) and their coded values (coded once, when written).
struct MixedCache {
  size_t row = 0;
  std::vector<std::vector<float>> k, v, kq, vq;  // [L][T * row]
  MixedCache(int L, int T, size_t row_) : row(row_) {
    for (auto* x : {&k, &v, &kq, &vq}) x->assign(size_t(L), std::vector<float>(size_t(T) * row));
  }
  // Stores tokens [t0, t0 + n) of layer l from src rows (stride `src_stride` floats between tokens)
  // and codes the ones at or past `sink`.
  void write(const KvCoder& coder, int l, int t0, int n, const float* ks, const float* vs, size_t src_stride,
             int sink, const int64_t* positions) {
    for (int t = 0; t < n; ++t) {
      const size_t dst = size_t(t0 + t) * row;
      std::copy_n(ks + size_t(t) * src_stride, row, k[size_t(l)].data() + dst);
      std::copy_n(vs + size_t(t) * src_stride, row, v[size_t(l)].data() + dst);
    }
    std::copy_n(k[size_t(l)].data() + size_t(t0) * row, size_t(n) * row, kq[size_t(l)].data() + size_t(t0) * row);
    std::copy_n(v[size_t(l)].data() + size_t(t0) * row, size_t(n) * row, vq[size_t(l)].data() + size_t(t0) * row);
    const int c0 = std::max(t0, sink), c1 = t0 + n;
    if (c1 > c0)
      coder.code(l, kq[size_t(l)].data() + size_t(c0) * row, vq[size_t(l)].data() + size_t(c0) * row, c1 - c0,
                 positions + (c0 - t0));
  }
};

// Phase 1: one window over the first P tokens, all of whose queries see a full-precision cache
// (P <= sink + recent); it only records what the later queries will read.
class RecordPrefix : public KvTransform {
 public:
  RecordPrefix(MixedCache& c, const KvCoder& coder, int sink) : c_(c), coder_(coder), sink_(sink) {}
  void apply(LayerKv& kv) override {
    KVQ_ASSERT(kv.batch == 1);
    c_.write(coder_, kv.layer, 0, kv.seq, kv.k, kv.v, c_.row, sink_, kv.positions);
  }

 private:
  MixedCache& c_;
  const KvCoder& coder_;
  int sink_;
};

// Phase 2: row r of the batch answers query i = r0 + r over ids[0..r1). At each layer the row's own
// position i holds token i's true K/V (its hidden state is exact by induction over layers: every
// earlier layer gave query i exactly its mixed cache), which is recorded and coded once; then
// every key j <= i of the row is overwritten with what query i's cache holds: coded when
// sink <= j <= i - recent, full precision otherwise. Keys past i are never read by query i (causal).
class MixedRows : public KvTransform {
 public:
  MixedRows(MixedCache& c, const KvCoder& coder, CachePolicy p, int r0) : c_(c), coder_(coder), p_(p), r0_(r0) {}
  void apply(LayerKv& kv) override {
    const int l = kv.layer, T = kv.seq, rows = kv.batch;
    const size_t row = c_.row, win = size_t(T) * row;
    KVQ_ASSERT(r0_ + rows <= T);
    // The diagonal: row r's position r0 + r, i.e. a stride of one window plus one token.
    const size_t diag = win + row;
    c_.write(coder_, l, r0_, rows, kv.k + size_t(r0_) * row, kv.v + size_t(r0_) * row, diag, p_.sink,
             kv.positions + r0_);
    const float *K = c_.k[size_t(l)].data(), *V = c_.v[size_t(l)].data();
    const float *Kq = c_.kq[size_t(l)].data(), *Vq = c_.vq[size_t(l)].data();
    for (int r = 0; r < rows; ++r) {
      const int i = r0_ + r;
      float* kr = kv.k + size_t(r) * win;
      float* vr = kv.v + size_t(r) * win;
      for (int j = 0; j <= i; ++j) {
        const bool coded = j >= p_.sink && j <= i - p_.recent;
        std::copy_n((coded ? Kq : K) + size_t(j) * row, row, kr + size_t(j) * row);
        std::copy_n((coded ? Vq : V) + size_t(j) * row, row, vr + size_t(j) * row);
      }
    }
  }

 private:
  MixedCache& c_;
  const KvCoder& coder_;
  CachePolicy p_;
  int r0_;
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

// Windows of equal length T with a plain (sink-only) cache in one forward. Query positions are
// 0..T-2 (the last token only ever is a target).
void plain_batch(const Model& m, const std::vector<const std::vector<int64_t>*>& wins, const std::vector<int>& firsts,
                 const KvCoder* coder, int sink, std::vector<std::vector<double>>& out) {
  c10::InferenceMode guard;
  const int64_t B = int64_t(wins.size()), T = int64_t(wins[0]->size()), Q = T - 1;
  at::Tensor ids = at::empty({B, Q}, at::kLong);
  for (int64_t b = 0; b < B; ++b) std::copy_n(wins[size_t(b)]->data(), Q, ids[b].data_ptr<int64_t>());
  std::unique_ptr<CodeFrom> tf;
  Model::ForwardOptions fo;
  if (coder && sink < Q) fo.kv_transform = (tf = std::make_unique<CodeFrom>(*coder, sink)).get();
  at::Tensor logits = m.forward(ids, fo);  // [B, Q, V]
  out.assign(size_t(B), {});
  for (int64_t b = 0; b < B; ++b) {
    const int f = firsts[size_t(b)];
    std::vector<int64_t> tgt(wins[size_t(b)]->begin() + f, wins[size_t(b)]->end());
    out[size_t(b)].resize(tgt.size());
    nll_rows(logits[b].slice(0, f - 1, Q), tgt, out[size_t(b)].data());
  }
}

std::vector<double> mixed_window(const Model& m, const std::vector<int64_t>& ids, int first_target,
                                 const KvCoder& coder, const CachePolicy& p, int64_t max_batch_tokens,
                                 int64_t* forward_tokens) {
  c10::InferenceMode guard;
  const ModelConfig& c = m.config();
  const int T = int(ids.size()), Q = T - 1;  // queries 0..Q-1
  const int P = std::min(Q, p.sink + p.recent);
  MixedCache cache(c.n_layers, T, size_t(c.n_kv_heads) * size_t(c.head_dim));
  std::vector<double> out(size_t(T - first_target));
  // Scores the queries qs from their logit rows [qs.size(), V].
  auto score = [&](const at::Tensor& logit_rows, const std::vector<int>& qs) {
    std::vector<int64_t> tgt;
    for (int x : qs) tgt.push_back(ids[size_t(x) + 1]);
    std::vector<double> v(tgt.size());
    nll_rows(logit_rows, tgt, v.data());
    for (size_t k = 0; k < qs.size(); ++k) out[size_t(qs[k] + 1 - first_target)] = v[k];
  };
  {  // Phase 1: queries < P read only full-precision entries, so one plain forward is exact.
    RecordPrefix rec(cache, coder, p.sink);
    Model::ForwardOptions fo;
    fo.kv_transform = &rec;
    at::Tensor logits = m.forward(rows_tensor(ids, P, 1), fo)[0];  // [P, V]
    *forward_tokens += P;
    std::vector<int> qs;
    for (int q = std::max(0, first_target - 1); q < P; ++q) qs.push_back(q);
    if (!qs.empty()) score(logits.slice(0, qs.front(), P), qs);
  }
  const int per = int(std::max<int64_t>(1, max_batch_tokens / std::max(1, Q)));
  for (int r0 = P; r0 < Q; r0 += per) {
    const int r1 = std::min(Q, r0 + per), rows = r1 - r0;
    MixedRows mix(cache, coder, p, r0);
    Model::ForwardOptions fo;
    fo.kv_transform = &mix;
    at::Tensor logits = m.forward(rows_tensor(ids, r1, rows), fo);  // [rows, r1, V]
    *forward_tokens += int64_t(rows) * r1;
    std::vector<int> qs;
    std::vector<int64_t> flat;
    for (int r = 0; r < rows; ++r)
      if (r0 + r >= first_target - 1) qs.push_back(r0 + r), flat.push_back(int64_t(r) * r1 + r0 + r);
    if (qs.empty()) continue;
    at::Tensor sel = logits.view({int64_t(rows) * r1, logits.size(2)})
                         .index_select(0, at::from_blob(flat.data(), {int64_t(flat.size())}, at::kLong));
    score(sel, qs);
  }
  return out;
}

std::vector<double> window_nll_impl(const Model& m, const std::vector<int64_t>& ids, int first_target,
                                    const KvCoder* coder, const CachePolicy& p, int64_t max_batch_tokens,
                                    int64_t* forward_tokens) {
  check_window(m, ids.size(), first_target, p);
  if (coder && p.recent > 0 && p.sink + p.recent < int(ids.size()) - 1)
    return mixed_window(m, ids, first_target, *coder, p, max_batch_tokens, forward_tokens);
  // recent >= every query's context: the whole cache is full precision.
  const KvCoder* c = p.recent > 0 ? nullptr : coder;
  std::vector<std::vector<double>> out;
  plain_batch(m, {&ids}, {first_target}, c, p.sink, out);
  *forward_tokens += int64_t(ids.size()) - 1;
  return out[0];
}

}  // namespace

std::vector<double> window_token_nll(const Model& m, const std::vector<int64_t>& ids, int first_target,
                                     const KvCoder* coder, const CachePolicy& policy) {
  int64_t fwd = 0;
  if (ids.size() >= 2 && (first_target < 1 || size_t(first_target) >= ids.size()))
    throw Error("", "first_target", std::to_string(first_target) + " is not in [1, " + std::to_string(ids.size()) + ")");
  return window_nll_impl(m, ids, first_target, coder, policy, 16384, &fwd);
}

double PplResult::ppl() const { return std::exp(nll()); }

PplResult sliding_perplexity(const Model& m, const std::vector<int32_t>& text, const PplOptions& o,
                             const KvCoder* coder) {
  const int W = o.window, S = o.stride;
  if (W < 2 || W > m.config().max_seq_len)
    throw Error("", "--window", std::to_string(W) + " is not in [2, " + std::to_string(m.config().max_seq_len) +
                                    "] (the model's maximum sequence length)");
  if (S < 1 || S > W - 1)
    throw Error("", "--stride", std::to_string(S) + " is not in [1, window - 1 = " + std::to_string(W - 1) + "]");
  if (o.policy.sink < 0 || o.policy.recent < 0)
    throw Error("", o.policy.sink < 0 ? "--sink" : "--recent", "must be >= 0");
  if (text.empty()) throw Error("", "text", "no tokens to score");
  if (o.bos_id < 0 && text.size() < 2)
    throw Error("", "text", "one token and no BOS (the tokenizer adds none): nothing to score");

  struct Win {
    std::vector<int64_t> ids;
    int first = 1;
  };
  std::vector<Win> wins;
  const int64_t n = int64_t(text.size());
  for (int64_t begin = 0, prev_end = 0;; begin += S) {
    const bool bos = o.bos_id >= 0;
    const int64_t end = std::min(begin + W - (bos ? 1 : 0), n);
    Win w;
    w.ids.reserve(size_t(end - begin + 1));
    if (bos) w.ids.push_back(o.bos_id);
    for (int64_t t = begin; t < end; ++t) w.ids.push_back(text[size_t(t)]);
    w.first = int(w.ids.size()) - int(end - prev_end);  // score only tokens past the previous window
    if (w.first < 1) w.first = 1;  // without a BOS the text's first token has no context to score it
    wins.push_back(std::move(w));
    prev_end = end;
    if (end == n) break;
  }

  PplResult r;
  r.windows = int64_t(wins.size());
  const auto t0 = std::chrono::steady_clock::now();
  Progress prog(o.label, r.windows, "tok", o.quiet);
  auto add = [&](const std::vector<double>& v) {
    for (double x : v) r.nll_sum += x;
    r.tokens += int64_t(v.size());
  };
  const bool mixed = coder && o.policy.recent > 0;
  const int64_t per = std::max<int64_t>(1, o.max_batch_tokens / W);
  for (size_t i = 0; i < wins.size();) {
    if (mixed) {
      add(window_nll_impl(m, wins[i].ids, wins[i].first, coder, o.policy, o.max_batch_tokens, &r.forward_tokens));
      ++i;
    } else {
      std::vector<const std::vector<int64_t>*> batch;
      std::vector<int> firsts;
      for (size_t j = i; j < wins.size() && int64_t(batch.size()) < per && wins[j].ids.size() == wins[i].ids.size(); ++j) {
        batch.push_back(&wins[j].ids);
        firsts.push_back(wins[j].first);
      }
      check_window(m, wins[i].ids.size(), wins[i].first, o.policy);
      std::vector<std::vector<double>> out;
      plain_batch(m, batch, firsts, coder, o.policy.sink, out);
      for (const auto& v : out) add(v);
      r.forward_tokens += int64_t(batch.size()) * int64_t(wins[i].ids.size() - 1);
      i += batch.size();
    }
    prog.update(int64_t(i), r.tokens);
  }
  prog.finish();
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  // Without a BOS the text's first token has no context, so it is the one token not scored.
  KVQ_ASSERT(r.tokens == (o.bos_id >= 0 ? n : n - 1));
  return r;
}

}  // namespace kvq
