#pragma once
// The protected cache (sink, recent) computed the slow way, with no help from the forward's
// protected path: only plain forwards whose K/V a KvTransform rewrites. This was kvq-eval's method
// before the one-forward path; tests keep it as a second implementation.
//
// Query i must attend to key j coded when sink <= j <= i - recent and in full precision otherwise,
// and its hidden state at every layer must be the one its own decode step would have. Row r of a
// batch answers query i = r0 + r over ids[0..i]: at each layer the row's own position i holds
// token i's true K/V (by induction over layers: every earlier layer gave query i exactly its mixed
// cache); they are recorded and coded once, then every key j <= i of the row is overwritten with
// what query i's cache holds. The first P = sink + recent queries read no coded entry, so one
// plain forward over them records their K/V. Cost: about (T - P) * T / 2 tokens of forward per
// window of T.
#include <c10/core/InferenceMode.h>

#include <algorithm>
#include <vector>

#include "kvq/eval/kv_coder.hpp"
#include "kvq/eval/perplexity.hpp"
#include "kvq/model/model.hpp"

namespace kvq::test {

struct MultiForwardCache {
  size_t row = 0;
  std::vector<std::vector<float>> k, v, kq, vq;  // [layer][token * row]
  MultiForwardCache(int L, int T, size_t row_) : row(row_) {
    for (auto* x : {&k, &v, &kq, &vq}) x->assign(size_t(L), std::vector<float>(size_t(T) * row));
  }
  // Stores tokens [t0, t0 + n) of layer l from rows `src_stride` floats apart; codes those >= sink.
  void write(const KvCoder& coder, int l, int t0, int n, const float* ks, const float* vs, size_t src_stride,
             int sink, const int64_t* positions) {
    for (int t = 0; t < n; ++t) {
      const size_t dst = size_t(t0 + t) * row;
      std::copy_n(ks + size_t(t) * src_stride, row, k[size_t(l)].data() + dst);
      std::copy_n(vs + size_t(t) * src_stride, row, v[size_t(l)].data() + dst);
      std::copy_n(ks + size_t(t) * src_stride, row, kq[size_t(l)].data() + dst);
      std::copy_n(vs + size_t(t) * src_stride, row, vq[size_t(l)].data() + dst);
    }
    // One token at a time, as a decode loop writes them.
    for (int t = std::max(t0, sink); t < t0 + n; ++t)
      coder.code(l, kq[size_t(l)].data() + size_t(t) * row, vq[size_t(l)].data() + size_t(t) * row, 1,
                 positions + (t - t0));
  }
};

class RecordPrefix : public KvTransform {
 public:
  RecordPrefix(MultiForwardCache& c, const KvCoder& coder, int sink) : c_(c), coder_(coder), sink_(sink) {}
  void apply(LayerKv& kv) override {
    c_.write(coder_, kv.layer, 0, kv.seq, kv.k, kv.v, c_.row, sink_, kv.positions);
  }

 private:
  MultiForwardCache& c_;
  const KvCoder& coder_;
  int sink_;
};

class MixedRows : public KvTransform {
 public:
  MixedRows(MultiForwardCache& c, const KvCoder& coder, CachePolicy p, int r0) : c_(c), coder_(coder), p_(p), r0_(r0) {}
  void apply(LayerKv& kv) override {
    const int l = kv.layer, rows = kv.batch;
    const size_t row = c_.row, win = size_t(kv.seq) * row;
    // Row r's own position r0 + r: a stride of one window plus one token.
    c_.write(coder_, l, r0_, rows, kv.k + size_t(r0_) * row, kv.v + size_t(r0_) * row, win + row, p_.sink,
             kv.positions + r0_);
    for (int r = 0; r < rows; ++r) {
      const int i = r0_ + r;
      for (int j = 0; j <= i; ++j) {
        const bool coded = j >= p_.sink && j <= i - p_.recent;
        const auto& K = coded ? c_.kq[size_t(l)] : c_.k[size_t(l)];
        const auto& V = coded ? c_.vq[size_t(l)] : c_.v[size_t(l)];
        std::copy_n(K.data() + size_t(j) * row, row, kv.k + size_t(r) * win + size_t(j) * row);
        std::copy_n(V.data() + size_t(j) * row, row, kv.v + size_t(r) * win + size_t(j) * row);
      }
    }
  }

 private:
  MultiForwardCache& c_;
  const KvCoder& coder_;
  CachePolicy p_;
  int r0_;
};

// NLL of ids[t + 1] for every query t in [0, T - 1), in double. forwards: Model::forward calls made.
inline std::vector<double> multi_forward_nll(const Model& m, const std::vector<int64_t>& ids, const KvCoder& coder,
                                             const CachePolicy& p, int rows_per_forward = 16,
                                             int* forwards = nullptr) {
  c10::InferenceMode guard;
  const ModelConfig& c = m.config();
  const int T = int(ids.size()), Q = T - 1;
  const int P = std::min(Q, p.sink + p.recent);
  MultiForwardCache cache(c.n_layers, T, size_t(c.n_kv_heads) * size_t(c.head_dim));
  std::vector<double> out(static_cast<size_t>(Q));
  auto nll = [&](const at::Tensor& logit_row, int q) {
    out[size_t(q)] = -at::log_softmax(logit_row.to(at::kDouble), 0)[ids[size_t(q) + 1]].item<double>();
  };
  int calls = 0;
  if (P > 0) {
    RecordPrefix rec(cache, coder, p.sink);
    Model::ForwardOptions fo;
    fo.kv_transform = &rec;
    const std::vector<int64_t> prefix(ids.begin(), ids.begin() + P);
    at::Tensor logits = m.forward(at::tensor(prefix, at::kLong), fo)[0];
    ++calls;
    for (int q = 0; q < P; ++q) nll(logits[q], q);
  }
  for (int r0 = P; r0 < Q; r0 += rows_per_forward) {
    const int r1 = std::min(Q, r0 + rows_per_forward), rows = r1 - r0;
    MixedRows mix(cache, coder, p, r0);
    Model::ForwardOptions fo;
    fo.kv_transform = &mix;
    const std::vector<int64_t> prefix(ids.begin(), ids.begin() + r1);
    at::Tensor x = at::tensor(prefix, at::kLong).unsqueeze(0).expand({rows, r1}).contiguous();
    at::Tensor logits = m.forward(x, fo);  // [rows, r1, V]
    ++calls;
    for (int r = 0; r < rows; ++r) nll(logits[r][r0 + r], r0 + r);
  }
  if (forwards) *forwards = calls;
  return out;
}

}  // namespace kvq::test
