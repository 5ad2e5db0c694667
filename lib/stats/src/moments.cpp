#include "kvq/stats/moments.hpp"

#include <Eigen/Dense>

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

void SideMoments::resize(const MomentShape& s) {
  count.assign(s.heads(), 0);
  sum.assign(s.heads() * s.head_dim, 0.0);
  gram.assign(s.heads() * s.head_dim * s.head_dim, 0.0);
}

void SideMoments::add(const SideMoments& o) {
  KVQ_ASSERT(o.count.size() == count.size() && o.sum.size() == sum.size() && o.gram.size() == gram.size());
  for (size_t i = 0; i < count.size(); ++i) count[i] += o.count[i];
  for (size_t i = 0; i < sum.size(); ++i) sum[i] += o.sum[i];
  for (size_t i = 0; i < gram.size(); ++i) gram[i] += o.gram[i];
}

Moments::Moments(const MomentShape& s) : shape_(s) {
  if (s.n_kv_heads <= 0 || s.n_heads % s.n_kv_heads != 0)
    throw Error("", "n_kv_heads", "query heads " + std::to_string(s.n_heads) + " not a multiple of KV heads " +
                                      std::to_string(s.n_kv_heads));
  k.resize(s);
  v.resize(s);
  q.resize(s);
}

void Moments::accumulate(const LayerCapture& c) {
  KVQ_ASSERT(c.n_kv_heads == shape_.n_kv_heads && c.n_heads == shape_.n_heads && c.head_dim == shape_.head_dim);
  KVQ_ASSERT(c.layer >= 0 && c.layer < shape_.n_layers);
  const int d = shape_.head_dim, gs = shape_.group_size();
  const int64_t n_tokens = int64_t(c.batch) * c.seq;
  MatD stage;
  for (int h = 0; h < shape_.n_kv_heads; ++h) {
    const size_t hi = size_t(c.layer) * shape_.n_kv_heads + h;
    const size_t vo = hi * d, go = hi * d * d;
    accumulate_rows(c.k + size_t(h) * d, n_tokens, int64_t(c.n_kv_heads) * d, 1, d, &k.count[hi], &k.sum[vo],
                    &k.gram[go], stage);
    accumulate_rows(c.v + size_t(h) * d, n_tokens, int64_t(c.n_kv_heads) * d, 1, d, &v.count[hi], &v.sum[vo],
                    &v.gram[go], stage);
    // The group's query heads are adjacent in q: gs rows of d per token.
    accumulate_rows(c.q + size_t(h) * gs * d, n_tokens, int64_t(c.n_heads) * d, gs, d, &q.count[hi], &q.sum[vo],
                    &q.gram[go], stage);
  }
}

void Moments::add(const Moments& o) {
  if (!(o.shape_ == shape_)) throw Error("", "shape", "cannot merge moments of different shapes");
  k.add(o.k);
  v.add(o.v);
  q.add(o.q);
}

}  // namespace kvq
