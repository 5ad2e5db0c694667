// layer-precision's costs on the calibration reservoir (reservoir MSE or the attention error) and
// the allocation from them.
#include "layer_precision.hpp"

#include <Eigen/Dense>

#include <algorithm>
#include <cmath>

#include "kvq/codec/codec.hpp"
#include "kvq/io/h5_paths.hpp"
#include "kvq/pipeline/allocation_methods.hpp"
#include "kvq/util/error.hpp"
#include "reservoir.hpp"

namespace kvq {
namespace {

using Mat = Eigen::Matrix<double, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;

Mat to_mat(const std::vector<float>& x, int64_t n, int d) {
  Mat m(n, d);
  for (int64_t t = 0; t < n; ++t)
    for (int i = 0; i < d; ++i) m(t, i) = x[size_t(t) * size_t(d) + size_t(i)];
  return m;
}

// Row-wise softmax of logits S (in place); row r's denominator also holds exp(sink(r)) (gpt-oss's
// attention sinks, no value; -infinity: none).
template <class Sink>
void softmax_rows(Mat& S, const Sink& sink) {
  for (Eigen::Index r = 0; r < S.rows(); ++r) {
    const double sk = sink(r), mx = std::max(S.row(r).maxCoeff(), sk);
    S.row(r) = (S.row(r).array() - mx).exp().matrix();
    S.row(r) /= S.row(r).sum() + std::exp(sk - mx);
  }
}

}  // namespace

LayerPrecisionCosts measure_head_costs(const CalibFile& c, int n_k, int n_v, const HeadVariant& variant, bool attention,
                                       int measure_tokens) {
  const auto sh = c.shape();
  const int d = sh.head_dim, dv = sh.v_dim(), L = sh.n_layers, H = sh.n_kv_heads, NQ = c.prov.n_heads;
  const int G = NQ / H;
  const int64_t n = std::min<int64_t>(c.reservoir.size(), measure_tokens);
  KVQ_ASSERT(n >= 1 && G >= 1 && n_k >= 1 && n_v >= 1);
  const int64_t nq = std::min<int64_t>(n, kNormCorrectionQueries);
  const double scale = c.prov.attn_scale();  // the recorded softmax scale (MLA's), else 1/sqrt(d)
  LayerPrecisionCosts out;
  out.k.assign(size_t(L * H) * size_t(n_k), 0.0);
  out.v.assign(size_t(L * H) * size_t(n_v), 0.0);
  for (int l = 0; l < L; ++l)
    for (int h = 0; h < H; ++h) {
      const size_t head = size_t(l * H + h);
      std::vector<float> x[2] = {reservoir_rows(c, l, h, Side::kK, true, n), reservoir_rows(c, l, h, Side::kV, false, n)};
      std::vector<std::vector<float>> coded[2] = {std::vector<std::vector<float>>(size_t(n_k)),
                                                  std::vector<std::vector<float>>(size_t(n_v))};
      for (int s = 0; s < 2; ++s) {
        const Side side = s == 0 ? Side::kK : Side::kV;
        const int F = s == 0 ? n_k : n_v;
        for (int f = 0; f < F; ++f) {
          const HeadDecision dec = variant(l, h, side, f);
          auto& y = coded[s][size_t(f)];
          y.resize(x[s].size());
          codec::HeadCodec(dec, side == Side::kK ? d : dv).round_trip(x[s].data(), int(n), y.data());
          if (!attention) {
            double se = 0;
            for (size_t i = 0; i < y.size(); ++i) se += double(x[s][i] - y[i]) * double(x[s][i] - y[i]);
            (s == 0 ? out.k : out.v)[head * size_t(F) + size_t(f)] = se / double(n);
          }
        }
      }
      if (!attention) continue;
      const codec::RopeSpec rope = calib_rope(c.prov, l);
      // The group's queries, rotated at their own positions: [nq * G][d].
      Mat Q(nq * G, d);
      std::vector<float> row(static_cast<size_t>(d));
      for (int64_t t = 0; t < nq; ++t)
        for (int j = 0; j < G; ++j) {
          std::copy_n(reservoir_row(c.reservoir.q, t, l, h * G + j, L, NQ, d), d, row.data());
          codec::reference_apply_rope(row.data(), d, c.reservoir.source[size_t(2 * t + 1)], rope);
          for (int i = 0; i < d; ++i) Q(t * G + j, i) = row[size_t(i)];
        }
      const Mat K = to_mat(x[0], n, d), V = to_mat(x[1], n, dv);
      const Mat S = Q * K.transpose() * scale;  // logits [queries][keys]
      Mat P = S;
      softmax_rows(P, [&](Eigen::Index r) { return c.prov.sink_of(l, h * G + int(r % G)); });
      const Mat O = P * V;
      // The output's mean energy per query; a head whose attention output is exactly 0 has no
      // relative error to speak of, and then the absolute one is used.
      const double o_energy = O.squaredNorm() / double(Q.rows());
      const double v_norm = o_energy > 0 ? o_energy : 1.0;
      for (int f = 0; f < n_k; ++f) {
        const Mat Sh = Q * to_mat(coded[0][size_t(f)], n, d).transpose() * scale;
        out.k[head * size_t(n_k) + size_t(f)] = (Sh - S).squaredNorm() / (double(Q.rows()) * double(n));
      }
      for (int f = 0; f < n_v; ++f)
        out.v[head * size_t(n_v) + size_t(f)] =
            (P * (to_mat(coded[1][size_t(f)], n, dv) - V)).squaredNorm() / double(Q.rows()) / v_norm;
    }
  return out;
}

LayerPrecisionCosts measure_layer_precision_costs(const CalibFile& c, const std::vector<MinifloatFormat>& formats,
                                                  double margin, bool attention, int measure_tokens,
                                                  const std::string& calib_path) {
  const int H = c.shape().n_kv_heads;
  const int F = static_cast<int>(formats.size());
  auto variant = [&](int l, int h, Side side, int f) {
    const size_t head = size_t(l * H + h);
    const auto& amax = side == Side::kK ? c.moments.k_amax : c.moments.v_amax;
    HeadDecision dec;
    dec.layer = l;
    dec.kv_head = h;
    dec.side = side;
    dec.kind = CodingKind::kMinifloat;
    dec.post_rope = side == Side::kK;
    dec.minifloat = formats[size_t(f)];
    dec.scale = alloc::minifloat_scale(dec.minifloat, amax[head], margin,
                                       calib_path + ": " + (side == Side::kK ? h5path::kStatsAmaxK : h5path::kStatsAmaxV) +
                                           "[" + std::to_string(l) + "][" + std::to_string(h) + "]");
    return dec;
  };
  return measure_head_costs(c, F, F, variant, attention, measure_tokens);
}

alloc::Allocation allocate_layer_precision(const CalibFile& c, const AllocateOptions& o) {
  const auto sh = c.shape();
  const int d = sh.head_dim, L = sh.n_layers, H = sh.n_kv_heads;
  if (!c.moments.has_amax())
    throw Error(o.calib, h5path::kStatsAmaxK,
                "missing: layer-precision needs the activation maxima (calibration format version 3); recapture "
                "with this calib-capture");
  const int64_t n = std::min<int64_t>(c.reservoir.size(), o.measure_tokens);
  if (n < 1)
    throw Error(o.calib, h5path::kReservoir, "empty: layer-precision needs reservoir rows (calib-capture --reservoir-tokens)");
  if (o.objective != "attention" && o.objective != "mse")
    throw Error("", "--objective", "unknown value '" + o.objective + "' (attention or mse)");
  alloc::LayerPrecisionInput in;
  in.shape = {L, H, d, sh.v_dim()};
  in.combos = layer_formats_from_flag("--formats", o.formats);
  in.formats = side_formats(in.combos);
  in.margin = 1.0;
  in.k_amax = c.moments.k_amax;
  in.v_amax = c.moments.v_amax;
  LayerPrecisionCosts costs =
      measure_layer_precision_costs(c, in.formats, in.margin, o.objective == "attention", o.measure_tokens, o.calib);
  in.k_mse = std::move(costs.k);
  in.v_mse = std::move(costs.v);
  try {
    return alloc::allocate_layer_precision(in, o.bpd);
  } catch (const Error& e) {
    // The solver names its own parameter; the user typed --bpd.
    const std::string what = e.what();
    const std::string prefix = "bits_per_dim: ";
    if (what.rfind(prefix, 0) == 0) throw Error("", "--bpd", what.substr(prefix.size()));
    throw;
  }
}

}  // namespace kvq
