#include "kvq/stats/moments.hpp"

#include <Eigen/Dense>

#include <algorithm>
#include <cmath>

#include "kvq/format/rope.hpp"

#include "kvq/util/error.hpp"

namespace kvq {

namespace {
using MatD = Eigen::Matrix<double, Eigen::Dynamic, Eigen::Dynamic>;
constexpr int kChunkRows = 2048;  // bounds the fp64 staging buffer; GEMM stays efficient

// Adds rows of a strided fp32 source into (count, sum, gram) of one head. Row r of the source is
// `row_len` floats at base + (r / rows_per_token) * token_stride + (r % rows_per_token) * d.
void accumulate_rows(const float* base, int64_t n_tokens, int64_t token_stride, int rows_per_token, int d,
                     int64_t* count, double* sum, double* gram, MatD& stage) {
  Eigen::Map<MatD> G(gram, d, d);
  Eigen::Map<Eigen::VectorXd> S(sum, d);
  MatD acc = MatD::Zero(d, d);
  const int64_t n_rows = n_tokens * rows_per_token;
  for (int64_t r0 = 0; r0 < n_rows; r0 += kChunkRows) {
    const int64_t nr = std::min<int64_t>(kChunkRows, n_rows - r0);
    stage.resize(d, nr);  // column j = one sample (Eigen is column-major)
    for (int64_t j = 0; j < nr; ++j) {
      const int64_t r = r0 + j;
      const float* src = base + (r / rows_per_token) * token_stride + (r % rows_per_token) * d;
      double* dst = stage.col(j).data();
      for (int i = 0; i < d; ++i) dst[i] = double(src[i]);
    }
    acc.selfadjointView<Eigen::Lower>().rankUpdate(stage);
    S += stage.rowwise().sum();
  }
  // Mirror the lower triangle so the stored Gram matrix is the full symmetric matrix.
  acc.triangularView<Eigen::StrictlyUpper>() = acc.transpose();
  G += acc;
  *count += n_rows;
}
}  // namespace

void SideMoments::resize(const MomentShape& s, int d) {
  dim = d > 0 ? d : s.head_dim;
  count.assign(s.heads(), 0);
  sum.assign(s.heads() * size_t(dim), 0.0);
  gram.assign(s.heads() * size_t(dim) * size_t(dim), 0.0);
}

void SideMoments::add(const SideMoments& o) {
  KVQ_ASSERT(o.count.size() == count.size() && o.sum.size() == sum.size() && o.gram.size() == gram.size());
  for (size_t i = 0; i < count.size(); ++i) count[i] += o.count[i];
  for (size_t i = 0; i < sum.size(); ++i) sum[i] += o.sum[i];
  for (size_t i = 0; i < gram.size(); ++i) gram[i] += o.gram[i];
}

// max |x| over `n_tokens` rows of `heads` head vectors (row stride `heads * d`) into amax[0..heads),
// RoPE-rotated first when cs (cos, sin per token and frequency, attention factor folded in) is given.
void track_amax(const float* x, int64_t n_tokens, int seq, int heads, int d, const std::vector<double>* cs,
                RopePairing pairing, int rotary_dim, float* amax) {
  const int nr = rotary_dim / 2;
  const RopeStride st = rope_stride(pairing, rotary_dim);
  for (int64_t r = 0; r < n_tokens; ++r) {
    const double* c = cs ? cs->data() + size_t(r % seq) * 2 * nr : nullptr;
    for (int h = 0; h < heads; ++h) {
      const float* row = x + (size_t(r) * heads + h) * d;
      double m = amax[h];
      if (c) {
        for (int i = 0; i < nr; ++i) {
          const int a = st.stride * i, b = a + st.partner;
          double ya, yb;
          rope_rotate_pair<double>(row[a], row[b], c[2 * i], c[2 * i + 1], &ya, &yb);
          m = std::max({m, std::fabs(ya), std::fabs(yb)});
        }
        for (int i = rotary_dim; i < d; ++i) m = std::max(m, std::fabs(double(row[i])));
      } else {
        for (int i = 0; i < d; ++i) m = std::max(m, std::fabs(double(row[i])));
      }
      amax[h] = float(m);
    }
  }
}

Moments::Moments(const MomentShape& s) : shape_(s) {
  if (s.n_kv_heads <= 0 || s.n_heads % s.n_kv_heads != 0)
    throw Error("", "n_kv_heads", "query heads " + std::to_string(s.n_heads) + " not a multiple of KV heads " +
                                      std::to_string(s.n_kv_heads));
  k.resize(s);
  v.resize(s, s.v_dim());
  q.resize(s);
}

void Moments::set_amax_rope(RopePairing pairing, int rotary_dim, std::vector<double> inv_freq,
                            double attention_factor) {
  if (rotary_dim < 0 || rotary_dim > shape_.head_dim || rotary_dim % 2 != 0 ||
      inv_freq.size() != size_t(rotary_dim / 2))
    throw Error("", "rope_inv_freq", std::to_string(inv_freq.size()) + " frequencies for rotary dim " +
                                         std::to_string(rotary_dim));
  amax_pairing_ = pairing;
  amax_rotary_dim_ = rotary_dim;
  amax_inv_freq_ = std::move(inv_freq);
  amax_factor_ = attention_factor;
  if (!has_amax()) {
    k_amax.assign(shape_.heads(), 0.f);
    v_amax.assign(shape_.heads(), 0.f);
    q_amax.assign(size_t(shape_.n_layers) * shape_.n_heads, 0.f);
  }
}

void Moments::set_amax_rope_local(std::vector<double> inv_freq, double attention_factor, const std::vector<int>& layers) {
  if (inv_freq.size() != amax_inv_freq_.size())
    throw Error("", "rope_local_inv_freq", std::to_string(inv_freq.size()) + " frequencies for rotary dim " +
                                               std::to_string(amax_rotary_dim_));
  amax_local_inv_freq_ = std::move(inv_freq);
  amax_local_factor_ = attention_factor;
  amax_local_layer_.assign(size_t(shape_.n_layers), 0);
  for (int l : layers) {
    if (l < 0 || l >= shape_.n_layers) throw Error("", "rope_local_layers", "layer " + std::to_string(l) + " out of range");
    amax_local_layer_[size_t(l)] = 1;
  }
}

void Moments::accumulate(const LayerCapture& c) {
  KVQ_ASSERT(c.n_kv_heads == shape_.n_kv_heads && c.n_heads == shape_.n_heads && c.head_dim == shape_.head_dim &&
             c.v_dim() == shape_.v_dim());
  KVQ_ASSERT(c.layer >= 0 && c.layer < shape_.n_layers);
  const int d = shape_.head_dim, dv = shape_.v_dim(), gs = shape_.group_size();
  const int64_t n_tokens = int64_t(c.batch) * c.seq;
  MatD stage;
  for (int h = 0; h < shape_.n_kv_heads; ++h) {
    const size_t hi = size_t(c.layer) * shape_.n_kv_heads + h;
    const size_t vo = hi * d, go = hi * d * d, vvo = hi * dv, vgo = hi * dv * dv;
    accumulate_rows(c.k + size_t(h) * d, n_tokens, int64_t(c.n_kv_heads) * d, 1, d, &k.count[hi], &k.sum[vo],
                    &k.gram[go], stage);
    accumulate_rows(c.v + size_t(h) * dv, n_tokens, int64_t(c.n_kv_heads) * dv, 1, dv, &v.count[hi], &v.sum[vvo],
                    &v.gram[vgo], stage);
    // The group's query heads are adjacent in q: gs rows of d per token.
    accumulate_rows(c.q + size_t(h) * gs * d, n_tokens, int64_t(c.n_heads) * d, gs, d, &q.count[hi], &q.sum[vo],
                    &q.gram[go], stage);
  }
  if (!has_amax()) return;
  // Post-RoPE in double from the captured fp32 pre-RoPE rows: angle = position * inv_freq,
  // (cos, sin) * attention factor, the forward's rotation expression.
  const int nr = amax_rotary_dim_ / 2;
  const bool local = !amax_local_layer_.empty() && amax_local_layer_[size_t(c.layer)];
  const std::vector<double>& inv_freq = local ? amax_local_inv_freq_ : amax_inv_freq_;
  const double factor = local ? amax_local_factor_ : amax_factor_;
  std::vector<double> cs(size_t(c.seq) * 2 * nr);
  for (int t = 0; t < c.seq; ++t)
    for (int i = 0; i < nr; ++i) {
      const double ang = double(c.positions[t]) * inv_freq[size_t(i)];
      cs[(size_t(t) * nr + i) * 2] = std::cos(ang) * factor;
      cs[(size_t(t) * nr + i) * 2 + 1] = std::sin(ang) * factor;
    }
  const size_t lk = size_t(c.layer) * shape_.n_kv_heads, lq = size_t(c.layer) * shape_.n_heads;
  track_amax(c.k, n_tokens, c.seq, shape_.n_kv_heads, d, &cs, amax_pairing_, amax_rotary_dim_, &k_amax[lk]);
  track_amax(c.v, n_tokens, c.seq, shape_.n_kv_heads, dv, nullptr, amax_pairing_, amax_rotary_dim_, &v_amax[lk]);
  track_amax(c.q, n_tokens, c.seq, shape_.n_heads, d, &cs, amax_pairing_, amax_rotary_dim_, &q_amax[lq]);
}

void Moments::add(const Moments& o) {
  if (!(o.shape_ == shape_)) throw Error("", "shape", "cannot merge moments of different shapes");
  k.add(o.k);
  v.add(o.v);
  q.add(o.q);
  // Maxima merge by max; statistics without them (older files) make the merge lack them too.
  if (!has_amax() || !o.has_amax()) {
    k_amax.clear();
    v_amax.clear();
    q_amax.clear();
    return;
  }
  for (size_t i = 0; i < k_amax.size(); ++i) k_amax[i] = std::max(k_amax[i], o.k_amax[i]);
  for (size_t i = 0; i < v_amax.size(); ++i) v_amax[i] = std::max(v_amax[i], o.v_amax[i]);
  for (size_t i = 0; i < q_amax.size(); ++i) q_amax[i] = std::max(q_amax[i], o.q_amax[i]);
}

}  // namespace kvq
