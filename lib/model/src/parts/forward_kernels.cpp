// The forward's kernels (see forward_kernels.hpp): RoPE, RMSNorm, the Workspace and attention,
// in fp32.
#include "forward_kernels.hpp"

#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "kvq/util/error.hpp"

namespace kvq::detail {

namespace {

// One row's rotary dims, turned by rope_rotate_pair at the coordinates rope_stride gives. The
// pairing is a template argument so that the stride and (interleaved) the partner are constants
// and the loop over i vectorises.
template <RopePairing kPairing>
void rope_row(float* row, int half, const float* c, const float* s, float sign) {
  const RopeStride st = rope_stride(kPairing, 2 * half);
  for (int i = 0; i < half; ++i) {
    float* a = row + st.stride * i;
    float* b = a + st.partner;
    rope_rotate_pair<float>(*a, *b, c[i], sign * s[i], a, b);
  }
}

// Sliding-window mask of one query block: s is [n][len*G][t1 - k0] over keys k0..t1-1; row
// r (query i = t0 + r/G) keeps keys i - W < j <= i and the rest become -inf.
void mask_window(at::Tensor& s, int64_t t0, int64_t k0, int64_t G, int64_t W) {
  const int64_t n = s.size(0), rows = s.size(1), cols = s.size(2);
  float* sp = s.data_ptr<float>();
  const float ninf = -std::numeric_limits<float>::infinity();
  at::parallel_for(0, n * rows, std::max<int64_t>(1, 16384 / cols), [&](int64_t begin, int64_t end) {
    for (int64_t nr = begin; nr < end; ++nr) {
      const int64_t i = t0 + (nr % rows) / G;
      const int64_t lo = std::max<int64_t>(0, i - W + 1 - k0), hi = std::min<int64_t>(cols, i - k0 + 1);
      float* row = sp + nr * cols;
      std::fill(row, row + lo, ninf);
      std::fill(row + hi, row + cols, ninf);
    }
  });
}

}  // namespace

RopeTable make_rope_table(const int64_t* positions, int seq, const RopeParams& rp, bool inverse) {
  RopeTable tab;
  tab.half = int(rp.inv_freq.size());
  const double af = inverse ? 1.0 / rp.attention_factor : rp.attention_factor;
  tab.cos.resize(size_t(seq) * tab.half);
  tab.sin.resize(size_t(seq) * tab.half);
  for (int t = 0; t < seq; ++t)
    for (int i = 0; i < tab.half; ++i) {
      const double angle = double(positions[t]) * rp.inv_freq[size_t(i)];  // double: exact at long positions
      tab.cos[size_t(t) * tab.half + i] = float(af * std::cos(angle));
      tab.sin[size_t(t) * tab.half + i] = float(af * std::sin(angle));
    }
  return tab;
}

// x: [n_windows][seq][rows_per_pos][head_dim]. The forward's single RoPE kernel (fp32): the
// forward and apply_rope both run it, so they agree bit for bit.
void rope_rows(float* x, int64_t n_windows, int seq, int64_t rows_per_pos, int head_dim,
               const RopeTable& tab, RopePairing pairing, bool inverse) {
  const int half = tab.half;
  const float sign = inverse ? -1.f : 1.f;
  const int64_t n_pos = n_windows * seq;
  const int64_t grain = std::max<int64_t>(1, 8192 / std::max<int64_t>(1, rows_per_pos * head_dim));
  at::parallel_for(0, n_pos, grain, [&](int64_t begin, int64_t end) {
    for (int64_t wt = begin; wt < end; ++wt) {
      const int t = int(wt % seq);
      const float* c = tab.cos.data() + size_t(t) * half;
      const float* s = tab.sin.data() + size_t(t) * half;
      for (int64_t r = 0; r < rows_per_pos; ++r) {
        float* row = x + (wt * rows_per_pos + r) * head_dim;
        if (pairing == RopePairing::kSplitHalf)
          rope_row<RopePairing::kSplitHalf>(row, half, c, s, sign);
        else
          rope_row<RopePairing::kInterleaved>(row, half, c, s, sign);
      }
    }
  });
}

namespace {

// A [rows, cols] BF16 view of the first rows * cols elements of buf, grown when too short.
at::Tensor bf16_view(at::Tensor& buf, int64_t rows, int64_t cols) {
  const int64_t n = rows * cols;
  if (!buf.defined() || buf.numel() < n) {
    buf = at::Tensor();  // the old buffer freed before the new one is taken
    buf = at::empty({n}, at::kBFloat16);
  }
  return buf.narrow(0, 0, n).view({rows, cols});
}

// The BF16 product in · Wᵀ in ws.bf16_out ([N, out] view).
at::Tensor bf16_product(Workspace& ws, const at::Tensor& in, const at::Tensor& W) {
  const int64_t N = in.size(0);
  at::Tensor in16 = bf16_view(ws.bf16_in, N, in.size(1));
  in16.copy_(in);  // fp32 -> BF16, nearest even
  at::Tensor out16 = bf16_view(ws.bf16_out, N, W.size(0));
  at::mm_out(out16, in16, W.t());
  return out16;
}

}  // namespace

void linear(Workspace& ws, at::Tensor& out, const at::Tensor& in, const at::Tensor& W, const at::Tensor& b) {
  if (W.scalar_type() == at::kFloat) {
    if (b.defined())
      at::addmm_out(out, b, in, W.t());
    else
      at::mm_out(out, in, W.t());
    return;
  }
  if (b.defined())
    at::add_out(out, bf16_product(ws, in, W), b);  // widened and biased in one pass
  else
    out.copy_(bf16_product(ws, in, W));
}

void linear_add(Workspace& ws, at::Tensor& x, const at::Tensor& in, const at::Tensor& W) {
  if (W.scalar_type() == at::kFloat) {
    x.addmm_(in, W.t());
    return;
  }
  x.add_(bf16_product(ws, in, W));
}

at::Tensor head_logits(const at::Tensor& h, const at::Tensor& head) {
  if (head.scalar_type() == at::kFloat) return at::mm(h, head.t());
  const int64_t N = h.size(0), V = head.size(0);
  at::Tensor logits = at::empty({N, V}, at::kFloat);
  constexpr int64_t kRows = 4096;  // 4096 x D fp32 at a time, in one buffer
  at::Tensor block = at::empty({std::min(kRows, V), head.size(1)}, at::kFloat);
  for (int64_t r = 0; r < V; r += kRows) {
    const int64_t n = std::min(kRows, V - r);
    at::Tensor rows = block.narrow(0, 0, n);
    rows.copy_(head.narrow(0, r, n));
    logits.narrow(1, r, n).copy_(at::mm(h, rows.t()));
  }
  return logits;
}

// out = x / rms(x) * w over the last dim of contiguous [N, D] tensors.
void rms_norm(const at::Tensor& x, const at::Tensor& w, double eps, at::Tensor& out) {
  const int64_t n = x.size(0), d = x.size(1);
  const float* xp = x.data_ptr<float>();
  const float* wp = w.data_ptr<float>();
  float* op = out.data_ptr<float>();
  at::parallel_for(0, n, std::max<int64_t>(1, 16384 / d), [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const float* xr = xp + r * d;
      float* yr = op + r * d;
      // Eight independent partial sums let the compiler vectorise without -ffast-math.
      float part[8] = {0, 0, 0, 0, 0, 0, 0, 0};
      int64_t j = 0;
      for (; j + 8 <= d; j += 8)
        for (int u = 0; u < 8; ++u) part[u] += xr[j + u] * xr[j + u];
      double ss = 0;
      for (int u = 0; u < 8; ++u) ss += part[u];
      for (; j < d; ++j) ss += double(xr[j]) * xr[j];
      const float inv = float(1.0 / std::sqrt(ss / double(d) + eps));
      for (int64_t k = 0; k < d; ++k) yr[k] = (xr[k] * inv) * wp[k];
    }
  });
}

Workspace::Workspace(const ModelConfig& c, int64_t B, int64_t T) : batch(B), seq(T) {
  const int64_t N = B * T, H = c.n_heads, Hk = c.n_kv_heads, G = H / Hk, d = c.head_dim, dv = c.v_dim();
  auto f = [](std::initializer_list<int64_t> shape) { return at::empty(shape, at::kFloat); };
  h = f({N, c.hidden_size});
  if (c.is_mla()) {
    const int64_t qk = c.qk_nope_head_dim + c.qk_rope_head_dim, R = c.kv_lora_rank;
    qkv = f({N, (c.q_lora_rank > 0 ? c.q_lora_rank : H * qk) + R + c.qk_rope_head_dim});
    if (c.q_lora_rank > 0) mla_qa = f({N, c.q_lora_rank});
    mla_q = f({N, H * qk});
    mla_nope = f({H, N, c.qk_nope_head_dim});
    mla_lat = f({H, N, R});
    mla_out = f({H, N, c.v_head_dim});
    mla_o = f({N, H * c.v_head_dim});
  } else {
    qkv = f({N, ((c.attn_output_gate ? 2 : 1) * H + 2 * Hk) * d});
    if (c.attn_output_gate) attn_gate = f({N, H * d});
  }
  if (c.hybrid()) {
    const int64_t Vd = c.linear_v_dim();
    gdn_proj = f({N, c.linear_conv_dim() + Vd + 2 * int64_t(c.linear_value_heads)});
    gdn_conv = f({N, c.linear_conv_dim()});
    gdn_out = f({N, Vd});
  }
  q = f({N, H * d});
  k = f({N, Hk * d});
  v = f({N, Hk * dv});
  attn = f({N, H * dv});
  bool any_dense = false, any_moe = false;
  for (int l = 0; l < c.decoder_layers(); ++l) (c.is_moe_layer(l) ? any_moe : any_dense) = true;
  if (any_dense) {
    gate_up = f({N, 2 * int64_t(c.intermediate_size)});
    act = f({N, c.intermediate_size});
  }
  if (any_moe) {
    // An expert sees at most every token once (top-k picks distinct experts).
    moe_x = f({N, c.hidden_size});
    moe_gate_up = f({N, 2 * int64_t(c.moe_intermediate_size)});
    moe_act = f({N, c.moe_intermediate_size});
    moe_out = f({N, c.hidden_size});
    if (c.shared_width() > 0) {
      const int64_t Is = c.shared_width();
      shared_gate_up = f({N, 2 * Is});
      shared_act = f({N, Is});
    }
  }
  // Query blocks of tb positions only score the keys up to their end (about half of T x T);
  // a few windows per chunk keep each block's scores cache-resident.
  tb = std::min<int64_t>(T, std::max<int64_t>(64, (T + 7) / 8));
  const int64_t per_window = H * tb * T * int64_t(sizeof(float));
  chunk = std::max<int64_t>(1, std::min<int64_t>(B, (int64_t(4) << 20) / per_window));
  qh = f({chunk * Hk, T * G, d});
  kh = f({chunk * Hk, T, d});
  vh = f({chunk * Hk, T, dv});
  scores = f({chunk * Hk * tb * G * T});
  probs = f({chunk * Hk * tb * G * T});
  out = f({chunk * Hk * tb * G * dv});
  // Row i*G + g (query i of the block, head g of the group) may see keys j <= i of the block.
  mask_diag = at::full({tb, tb}, -std::numeric_limits<float>::infinity(), at::kFloat)
                  .triu_(1)
                  .unsqueeze(1)
                  .expand({tb, G, tb})
                  .reshape({tb * G, tb});
}

void Workspace::ensure_protected() {
  if (kq.defined()) return;
  kq = at::empty_like(k);
  vq = at::empty_like(v);
  khq = at::empty_like(kh);
  vhq = at::empty_like(vh);
  scores_q = at::empty_like(scores);
  probs_q = at::empty_like(probs);
}

namespace {

// Softmax of the block's masked scores s into p ([n = nb·Hk, rows = len·G, nk]); with sinks, each
// row of query head h = hk·G + g is scaled by sigmoid(logsumexp(row) - sinks[h]): exp(sink) joins
// the denominator and has no value.
void block_softmax(at::Tensor& p, const at::Tensor& s, const at::Tensor& sinks, int64_t nb, int64_t Hk, int64_t len,
                   int64_t G) {
  at::softmax_out(p, s, -1);
  if (!sinks.defined()) return;
  at::Tensor f = at::logsumexp(s, {-1}, true).view({nb, Hk, len, G});
  f.sub_(sinks.view({1, Hk, 1, G})).sigmoid_();
  p.view({nb, Hk, len, G, -1}).mul_(f.unsqueeze(-1));
}

}  // namespace

// Causal attention of ws.q (post-RoPE, [B*T, H*d]) over ws.k, ws.v ([B*T, Hkv*d]) into ws.attn.
// The G query heads of a KV head are stacked as extra rows (t*G + g), so K and V are never
// repeated and each query block is a contiguous row range. window > 0: query i sees only keys
// j > i - window; a block whose keys all lie inside every row's window takes the plain causal path.
void attention(Workspace& ws, int64_t B, int64_t T, const ModelConfig& c, int64_t window, const at::Tensor& sinks) {
  const int64_t H = c.n_heads, Hk = c.n_kv_heads, G = H / Hk, d = c.head_dim, dv = c.v_dim();
  const double scale = c.attn_scale();
  const at::Tensor q5 = ws.q.view({B, T, Hk, G, d}), k4 = ws.k.view({B, T, Hk, d}), v4 = ws.v.view({B, T, Hk, dv});
  at::Tensor attn5 = ws.attn.view({B, T, Hk, G, dv});
  for (int64_t b0 = 0; b0 < B; b0 += ws.chunk) {
    const int64_t nb = std::min(ws.chunk, B - b0), n = nb * Hk;
    at::Tensor qh = ws.qh.narrow(0, 0, n), kh = ws.kh.narrow(0, 0, n), vh = ws.vh.narrow(0, 0, n);
    qh.view({nb, Hk, T, G, d}).copy_(q5.narrow(0, b0, nb).permute({0, 2, 1, 3, 4}));
    qh.mul_(scale);  // on q rather than on the larger score blocks
    kh.view({nb, Hk, T, d}).copy_(k4.narrow(0, b0, nb).permute({0, 2, 1, 3}));
    vh.view({nb, Hk, T, dv}).copy_(v4.narrow(0, b0, nb).permute({0, 2, 1, 3}));
    for (int64_t t0 = 0; t0 < T; t0 += ws.tb) {
      const int64_t len = std::min(ws.tb, T - t0), t1 = t0 + len, rows = len * G;
      // Sliding: the block's keys start at its first query's window (t1 - 1 < W: none cut off).
      const bool windowed = window > 0 && t1 - 1 >= window;
      const int64_t k0 = windowed ? std::max<int64_t>(0, t0 - window + 1) : 0, nk = t1 - k0;
      at::Tensor s = ws.scores.narrow(0, 0, n * rows * nk).view({n, rows, nk});
      at::Tensor p = ws.probs.narrow(0, 0, n * rows * nk).view({n, rows, nk});
      at::Tensor o = ws.out.narrow(0, 0, n * rows * dv).view({n, rows, dv});
      at::bmm_out(s, qh.narrow(1, t0 * G, rows), kh.narrow(1, k0, nk).transpose(1, 2));
      if (windowed)
        mask_window(s, t0, k0, G, window);
      else
        s.narrow(2, t0, len).add_(ws.mask_diag.narrow(0, 0, rows).narrow(1, 0, len));
      block_softmax(p, s, sinks, nb, Hk, len, G);
      at::bmm_out(o, p, vh.narrow(1, k0, nk));
      attn5.narrow(0, b0, nb).narrow(1, t0, len).copy_(o.view({nb, Hk, len, G, dv}).permute({0, 2, 1, 3, 4}));
    }
  }
}

// attention() with a protected cache (see ProtectedKv): ws.kq, ws.vq hold the coded K (post-RoPE)
// and V. Pair (i, j) reads the coded side when sink <= j <= i - recent, else the full one. Per
// query block the full scores cover its keys k0..t1-1 as in attention(); the coded ones only the
// keys some row of the block reads coded, [c0, c1). The selected scores go through one softmax;
// the probabilities of coded pairs move to a second matrix, so that the output is
// P_full·V + P_coded·V_coded. A block without coded pairs is attention()'s block, unchanged.
void attention_protected(Workspace& ws, int64_t B, int64_t T, const ModelConfig& c, int64_t window, int64_t sink,
                         int64_t recent, const at::Tensor& sinks) {
  const int64_t H = c.n_heads, Hk = c.n_kv_heads, G = H / Hk, d = c.head_dim, dv = c.v_dim();
  const double scale = c.attn_scale();
  const float ninf = -std::numeric_limits<float>::infinity();
  const at::Tensor q5 = ws.q.view({B, T, Hk, G, d}), k4 = ws.k.view({B, T, Hk, d}), v4 = ws.v.view({B, T, Hk, dv});
  const at::Tensor kq4 = ws.kq.view({B, T, Hk, d}), vq4 = ws.vq.view({B, T, Hk, dv});
  at::Tensor attn5 = ws.attn.view({B, T, Hk, G, dv});
  for (int64_t b0 = 0; b0 < B; b0 += ws.chunk) {
    const int64_t nb = std::min(ws.chunk, B - b0), n = nb * Hk;
    at::Tensor qh = ws.qh.narrow(0, 0, n), kh = ws.kh.narrow(0, 0, n), vh = ws.vh.narrow(0, 0, n);
    at::Tensor khq = ws.khq.narrow(0, 0, n), vhq = ws.vhq.narrow(0, 0, n);
    qh.view({nb, Hk, T, G, d}).copy_(q5.narrow(0, b0, nb).permute({0, 2, 1, 3, 4}));
    qh.mul_(scale);
    kh.view({nb, Hk, T, d}).copy_(k4.narrow(0, b0, nb).permute({0, 2, 1, 3}));
    vh.view({nb, Hk, T, dv}).copy_(v4.narrow(0, b0, nb).permute({0, 2, 1, 3}));
    khq.view({nb, Hk, T, d}).copy_(kq4.narrow(0, b0, nb).permute({0, 2, 1, 3}));
    vhq.view({nb, Hk, T, dv}).copy_(vq4.narrow(0, b0, nb).permute({0, 2, 1, 3}));
    for (int64_t t0 = 0; t0 < T; t0 += ws.tb) {
      const int64_t len = std::min(ws.tb, T - t0), t1 = t0 + len, rows = len * G;
      const bool windowed = window > 0 && t1 - 1 >= window;
      const int64_t k0 = windowed ? std::max<int64_t>(0, t0 - window + 1) : 0, nk = t1 - k0;
      // Row i reads j coded for sink <= j <= i - recent: over the block, j in [c0, c1).
      const int64_t c0 = std::max(k0, sink), c1 = t1 - recent, nc = c1 - c0;
      at::Tensor s = ws.scores.narrow(0, 0, n * rows * nk).view({n, rows, nk});
      at::Tensor p = ws.probs.narrow(0, 0, n * rows * nk).view({n, rows, nk});
      at::Tensor o = ws.out.narrow(0, 0, n * rows * dv).view({n, rows, dv});
      at::bmm_out(s, qh.narrow(1, t0 * G, rows), kh.narrow(1, k0, nk).transpose(1, 2));
      if (nc <= 0) {  // every pair of the block is full precision
        if (windowed)
          mask_window(s, t0, k0, G, window);
        else
          s.narrow(2, t0, len).add_(ws.mask_diag.narrow(0, 0, rows).narrow(1, 0, len));
        block_softmax(p, s, sinks, nb, Hk, len, G);
        at::bmm_out(o, p, vh.narrow(1, k0, nk));
      } else {
        at::Tensor sq = ws.scores_q.narrow(0, 0, n * rows * nc).view({n, rows, nc});
        at::Tensor pq = ws.probs_q.narrow(0, 0, n * rows * nc).view({n, rows, nc});
        at::bmm_out(sq, qh.narrow(1, t0 * G, rows), khq.narrow(1, c0, nc).transpose(1, 2));
        float* sp = s.data_ptr<float>();
        const float* sqp = sq.data_ptr<float>();
        const int64_t grain = std::max<int64_t>(1, 16384 / nk);
        // Columns of row i: valid (causal, sliding) keys [lo, hi); coded among them [lo_c, hi_c).
        auto bounds = [&](int64_t nr, int64_t& lo, int64_t& hi, int64_t& lo_c, int64_t& hi_c) {
          const int64_t i = t0 + (nr % rows) / G;
          lo = window > 0 ? std::max<int64_t>(0, i - window + 1 - k0) : 0;
          hi = std::min<int64_t>(nk, i - k0 + 1);
          lo_c = std::max(lo, sink - k0);
          hi_c = std::min(hi, i - recent + 1 - k0);
        };
        at::parallel_for(0, n * rows, grain, [&](int64_t begin, int64_t end) {
          for (int64_t nr = begin; nr < end; ++nr) {
            int64_t lo, hi, lo_c, hi_c;
            bounds(nr, lo, hi, lo_c, hi_c);
            float* row = sp + nr * nk;
            const float* rq = sqp + nr * nc + (k0 - c0);  // indexed by the same column as row
            std::fill(row, row + lo, ninf);
            std::fill(row + std::max(lo, hi), row + nk, ninf);
            for (int64_t col = lo_c; col < hi_c; ++col) row[col] = rq[col];
          }
        });
        block_softmax(p, s, sinks, nb, Hk, len, G);
        float* pp = p.data_ptr<float>();
        float* pqp = pq.data_ptr<float>();
        at::parallel_for(0, n * rows, grain, [&](int64_t begin, int64_t end) {
          for (int64_t nr = begin; nr < end; ++nr) {
            int64_t lo, hi, lo_c, hi_c;
            bounds(nr, lo, hi, lo_c, hi_c);
            float* row = pp + nr * nk;
            float* rq = pqp + nr * nc + (k0 - c0);
            std::fill(rq + (c0 - k0), rq + (c1 - k0), 0.f);
            for (int64_t col = lo_c; col < hi_c; ++col) {
              rq[col] = row[col];
              row[col] = 0.f;
            }
          }
        });
        at::bmm_out(o, p, vh.narrow(1, k0, nk));
        o.baddbmm_(pq, vhq.narrow(1, c0, nc));
      }
      attn5.narrow(0, b0, nb).narrow(1, t0, len).copy_(o.view({nb, Hk, len, G, dv}).permute({0, 2, 1, 3, 4}));
    }
  }
}

}  // namespace kvq::detail
