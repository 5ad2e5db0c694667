#include "kvq/eval/probe.hpp"

#include <ATen/ATen.h>
#include <c10/core/InferenceMode.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>

#include "kvq/util/error.hpp"

namespace kvq {
namespace {

// Codes layer `layer`'s K and V (every window of the batch, every position) and no other.
class CodeOneLayer : public KvTransform {
 public:
  CodeOneLayer(const KvCoder& c, int layer) : c_(c), layer_(layer) {}
  void apply(LayerKv& kv) override {
    if (layer_ >= 0 && kv.layer != layer_) return;
    const size_t row = size_t(kv.n_kv_heads) * size_t(kv.head_dim), row_v = size_t(kv.n_kv_heads) * size_t(kv.v_dim());
    for (int b = 0; b < kv.batch; ++b) {
      const size_t tok = size_t(b) * size_t(kv.seq);
      c_.code(kv.layer, kv.k + tok * row, kv.v + tok * row_v, kv.seq, kv.positions);
    }
  }

 private:
  const KvCoder& c_;
  int layer_;  // -1: every layer
};

// Log-probabilities [B * (T - 1)][V] of the scored positions, in double.
at::Tensor scored_log_probs(const at::Tensor& logits) {
  const int64_t B = logits.size(0), T = logits.size(1), V = logits.size(2);
  return at::log_softmax(logits.narrow(1, 0, T - 1).reshape({B * (T - 1), V}).to(at::kDouble), 1);
}

// Sums over the scored positions: KL(p || q) and NLL(q) of the next tokens.
void kl_nll(const at::Tensor& lp, const at::Tensor& lq, const at::Tensor& targets, double* kl, double* nll) {
  *kl = (lp.exp() * (lp - lq)).sum().item<double>();
  *nll = -lq.gather(1, targets).sum().item<double>();
}

struct Batch {
  at::Tensor ids, targets;  // [B, T], [B * (T - 1), 1]
  int64_t B = 0;
};

std::vector<Batch> batches_of(const Model& m, const std::vector<std::vector<int64_t>>& windows, const ProbeOptions& o) {
  if (windows.empty()) throw Error("", "probe", "no windows");
  const size_t T = windows[0].size();
  if (T < 2) throw Error("", "probe", "windows need >= 2 tokens, got " + std::to_string(T));
  for (size_t w = 0; w < windows.size(); ++w)
    if (windows[w].size() != T)
      throw Error("", "probe", "window " + std::to_string(w) + " has " + std::to_string(windows[w].size()) +
                                   " tokens, window 0 has " + std::to_string(T));
  const int64_t per = std::max<int64_t>(1, o.max_batch_tokens / int64_t(T));
  std::vector<Batch> out;
  for (size_t w0 = 0; w0 < windows.size(); w0 += size_t(per)) {
    const size_t n = std::min(windows.size() - w0, size_t(per));
    Batch b;
    b.B = int64_t(n);
    b.ids = at::empty({b.B, int64_t(T)}, at::kLong);
    b.targets = at::empty({b.B * int64_t(T - 1), 1}, at::kLong);
    int64_t* ip = b.ids.data_ptr<int64_t>();
    int64_t* tp = b.targets.data_ptr<int64_t>();
    for (size_t i = 0; i < n; ++i)
      for (size_t t = 0; t < T; ++t) {
        ip[i * T + t] = windows[w0 + i][t];
        if (t > 0) tp[i * (T - 1) + t - 1] = windows[w0 + i][t];
      }
    out.push_back(std::move(b));
  }
  (void)m;
  return out;
}

double secs_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

ProbeResult probe_layers(const Model& m, const std::vector<std::vector<int64_t>>& windows,
                         const std::vector<const KvCoder*>& settings, const ProbeOptions& o,
                         const std::vector<int>& layers_in) {
  c10::InferenceMode guard;
  const auto t0 = std::chrono::steady_clock::now();
  const ModelConfig& c = m.config();
  const int L = c.n_layers, S = int(settings.size());
  std::vector<int> layers = layers_in;
  if (layers.empty())
    for (int l = 0; l < L; ++l) layers.push_back(l);
  for (int l : layers)
    if (l < 0 || l >= L) throw Error("", "probe", "layer " + std::to_string(l) + " outside 0.." + std::to_string(L - 1));
  for (const KvCoder* k : settings)
    if (!k || k->config().n_layers != L || k->config().n_kv_heads != c.n_kv_heads || k->config().head_dim != c.head_dim)
      throw Error("", "probe", "a candidate coding is not of this model's shape");
  const std::vector<Batch> batches = batches_of(m, windows, o);
  const int64_t T = int64_t(windows[0].size());
  ProbeResult r;
  r.n_layers = L;
  r.n_settings = S;
  r.kl.assign(size_t(S) * size_t(L), 0.0);
  r.dnll.assign(size_t(S) * size_t(L), 0.0);
  r.windows = int64_t(windows.size());
  // Forwards count decoder layers: a hybrid model's probe of KV layer l runs every decoder layer
  // from l's on, the cacheless ones included.
  const int Ld = c.decoder_layers();
  int64_t probe_layers_run = 0;
  for (int l : layers) probe_layers_run += Ld - c.decoder_index(l);
  if (!o.quiet)
    spdlog::info("{}: {} layer(s) x {} candidate(s) on {} window(s) of {} tokens: {} layer forwards per batch "
                 "({:.1f}x the unquantized forward's {}), {} batch(es)",
                 o.label, layers.size(), S, windows.size(), T, int64_t(S) * probe_layers_run + Ld,
                 double(int64_t(S) * probe_layers_run + Ld) / double(Ld), Ld, batches.size());
  double nll_clean = 0;
  std::vector<double> nll(size_t(S) * size_t(L), 0.0);
  const size_t H = size_t(c.hidden_size);
  for (size_t bi = 0; bi < batches.size(); ++bi) {
    const Batch& b = batches[bi];
    const size_t stream = size_t(b.B) * size_t(T) * H;
    // The residual stream at every probed layer's input and after the last decoder layer (indexed by
    // decoder layer; the cacheless layers' inputs are not kept).
    std::vector<std::vector<float>> at_input(size_t(Ld) + 1);
    at_input[size_t(Ld)].resize(stream);
    for (int l : layers) at_input[size_t(c.decoder_index(l))].resize(stream);
    std::vector<float> live(stream);
    Model::ChunkBatch cb;
    cb.ids = b.ids;
    cb.hidden = live.data();
    Model::ChunkHooks hooks;
    hooks.after_step = [&](size_t, int layer) {
      std::vector<float>& keep = at_input[size_t(layer + 1)];
      if (!keep.empty()) std::copy(live.begin(), live.end(), keep.begin());
    };
    m.forward_chunk({cb}, hooks);
    Model::ForwardOptions plain;
    const at::Tensor lp = scored_log_probs(m.forward_from(Ld, b.ids, at_input[size_t(Ld)].data(), plain));
    double kl0 = 0, n0 = 0;
    kl_nll(lp, lp, b.targets, &kl0, &n0);
    nll_clean += n0;
    r.layer_forwards += Ld;
    for (int s = 0; s < S; ++s)
      for (int l : layers) {
        CodeOneLayer code(*settings[size_t(s)], l);
        Model::ForwardOptions fo;
        fo.kv_transform = &code;
        const int dl = c.decoder_index(l);
        const at::Tensor lq = scored_log_probs(m.forward_from(dl, b.ids, at_input[size_t(dl)].data(), fo));
        double kl = 0, nq = 0;
        kl_nll(lp, lq, b.targets, &kl, &nq);
        r.kl[size_t(s) * size_t(L) + size_t(l)] += kl;
        nll[size_t(s) * size_t(L) + size_t(l)] += nq;
        r.layer_forwards += Ld - dl;
      }
    r.positions += b.B * (T - 1);
    if (!o.quiet)
      spdlog::info("{}: batch {}/{} ({} windows) done, {:.1f} s", o.label, bi + 1, batches.size(), b.B, secs_since(t0));
  }
  const double n = double(r.positions);
  r.clean_nll = nll_clean / n;
  for (size_t i = 0; i < r.kl.size(); ++i) {
    const int l = int(i % size_t(L));
    if (std::find(layers.begin(), layers.end(), l) == layers.end()) continue;
    r.kl[i] /= n;
    r.dnll[i] = nll[i] / n - r.clean_nll;
  }
  r.seconds = secs_since(t0);
  return r;
}

CompositeResult probe_composite(const Model& m, const std::vector<std::vector<int64_t>>& windows, const KvCoder& coder,
                                const ProbeOptions& o) {
  c10::InferenceMode guard;
  const std::vector<Batch> batches = batches_of(m, windows, o);
  CompositeResult r;
  double kl = 0, nll = 0, nll0 = 0;
  for (const Batch& b : batches) {
    const at::Tensor lp = scored_log_probs(m.forward(b.ids));
    CodeOneLayer all(coder, -1);
    Model::ForwardOptions fo;
    fo.kv_transform = &all;
    const at::Tensor lq = scored_log_probs(m.forward(b.ids, fo));
    double k = 0, nq = 0, k0 = 0, n0 = 0;
    kl_nll(lp, lq, b.targets, &k, &nq);
    kl_nll(lp, lp, b.targets, &k0, &n0);
    kl += k;
    nll += nq;
    nll0 += n0;
    r.positions += b.B * (b.ids.size(1) - 1);
  }
  const double n = double(r.positions);
  r.kl = kl / n;
  r.clean_nll = nll0 / n;
  r.dnll = nll / n - r.clean_nll;
  return r;
}

}  // namespace kvq
