#include "kvq/io/calib_file.hpp"

#include <algorithm>
#include <limits>
#include <type_traits>

#include <cmath>
#include <nlohmann/json.hpp>

#include "kvq/io/h5.hpp"
#include "kvq/io/h5_paths.hpp"
#include "kvq/util/fault_guard.hpp"
#include "kvq/util/atomic_file.hpp"
#include "kvq/util/error.hpp"
#include "kvq/util/sha256.hpp"
#include "open_kvq_file.hpp"

namespace kvq {

using json = nlohmann::json;
using Dims = std::vector<hsize_t>;
using h5path::leaf;

double CalibProvenance::attn_scale() const {
  return softmax_scale > 0.0 ? softmax_scale : 1.0 / std::sqrt(double(head_dim));
}

bool CalibProvenance::local_rope(int layer) const {
  return has_local_rope() && std::find(rope_local_layers.begin(), rope_local_layers.end(), layer) != rope_local_layers.end();
}

double CalibProvenance::sink_of(int layer, int head) const {
  return has_sinks() ? attention_sinks[size_t(layer)][size_t(head)] : -std::numeric_limits<double>::infinity();
}

std::string provenance_to_json(const CalibProvenance& p) {
  json j;
  j["tool_version"] = p.tool_version;
  j["model_path"] = p.model_path;
  j["model_config_sha256"] = p.model_config_sha256;
  j["architecture"] = p.architecture;
  j["rope_pairing"] = to_string(p.pairing);
  j["rotary_dim"] = p.rotary_dim;
  j["rope_theta"] = p.rope_theta;
  j["rope_type"] = p.rope_type;
  j["rope_inv_freq"] = p.rope_inv_freq;
  j["rope_attention_factor"] = p.rope_attention_factor;
  j["head_dim"] = p.head_dim;
  // Only when they differ from the defaults: other files keep their bytes and digests.
  if (p.v_dim() != p.head_dim) j["head_dim_v"] = p.head_dim_v;
  if (p.softmax_scale > 0.0) j["softmax_scale"] = p.softmax_scale;
  j["n_layers"] = p.n_layers;
  j["n_heads"] = p.n_heads;
  j["n_kv_heads"] = p.n_kv_heads;
  j["gqa_map"] = p.gqa_map;
  j["layer_window"] = p.layer_window;
  if (p.has_sinks()) j["attention_sinks"] = p.attention_sinks;  // version 6; other files keep their bytes
  if (p.has_local_rope()) {  // version 7
    j["rope_local_inv_freq"] = p.rope_local_inv_freq;
    j["rope_local_attention_factor"] = p.rope_local_attention_factor;
    j["rope_local_layers"] = p.rope_local_layers;
  }
  if (p.hybrid()) {  // version 8
    j["decoder_layers"] = p.decoder_layers;
    j["n_decoder_layers"] = p.n_decoder_layers;
  }
  json files = json::array();
  for (const auto& f : p.corpus)
    files.push_back({{"path", f.path}, {"sha256", f.sha256}, {"bytes", f.bytes}, {"replaced_bytes", f.replaced_bytes}});
  j["corpus"] = files;
  j["tokenizer_path"] = p.tokenizer_path;
  j["tokenizer_sha256"] = p.tokenizer_sha256;
  j["special_tokens_mode"] = p.special_tokens_mode;
  j["special_tokens_matched"] = p.special_tokens_matched;
  j["window_bos"] = p.window_bos;
  if (p.window_prefix) j["window_prefix"] = *p.window_prefix;
  j["seed"] = p.seed;
  j["samples"] = p.samples;
  j["holdout"] = p.holdout;
  j["seq_len"] = p.seq_len;
  j["batch_size"] = p.batch_size;
  j["reservoir_tokens"] = p.reservoir_tokens;
  j["dtype"] = p.dtype;
  if (p.forward_precision != "fp32") j["forward_precision"] = p.forward_precision;
  j["n_tokens_corpus"] = p.n_tokens_corpus;
  j["n_ranks"] = p.n_ranks;
  j["created_unix"] = p.created_unix;
  return j.dump(1);
}

// True when `v` is a JSON integer that `T` holds exactly. nlohmann's get<int>() would also take a
// float and static_cast it, which is undefined behaviour out of range (found by fuzz_provenance).
template <class T>
static bool json_int_fits(const json& v) {
  if (v.is_number_unsigned()) return v.get<uint64_t>() <= uint64_t(std::numeric_limits<T>::max());
  if (!v.is_number_integer()) return false;
  const int64_t x = v.get<int64_t>();
  if (x < 0) return std::is_signed_v<T> && x >= int64_t(std::numeric_limits<T>::min());
  return uint64_t(x) <= uint64_t(std::numeric_limits<T>::max());
}

template <class T>
struct is_int_vector : std::false_type {};
template <class T>
struct is_int_vector<std::vector<T>> : std::is_integral<T> {};

CalibProvenance provenance_from_json(const std::string& file, const std::string& text, const std::string& where) {
  json j;
  try {
    j = json::parse(text);
  } catch (const std::exception&) {
    throw Error(file, where, "not valid JSON");
  }
  CalibProvenance p;
  auto get = [&](const char* key, auto& out) {
    if (!j.contains(key)) throw Error(file, std::string("provenance.") + key, "missing");
    using T = std::decay_t<decltype(out)>;
    const json& v = j.at(key);
    bool ints_ok = true;
    if constexpr (std::is_integral_v<T>) {
      ints_ok = json_int_fits<T>(v);
    } else if constexpr (is_int_vector<T>::value) {
      if (v.is_array())
        for (const auto& e : v) ints_ok = ints_ok && json_int_fits<typename T::value_type>(e);
    }
    if (!ints_ok) throw Error(file, std::string("provenance.") + key, "not an integer in range: " + v.dump());
    try {
      j.at(key).get_to(out);
    } catch (const std::exception&) {
      throw Error(file, std::string("provenance.") + key, "wrong type: " + j.at(key).dump());
    }
  };
  get("tool_version", p.tool_version);
  get("model_path", p.model_path);
  get("model_config_sha256", p.model_config_sha256);
  get("architecture", p.architecture);
  std::string pairing;
  get("rope_pairing", pairing);
  try {
    p.pairing = rope_pairing_from_string(pairing);
  } catch (const Error&) {
    throw Error(file, "provenance.rope_pairing", "unknown value '" + pairing + "'");
  }
  get("rotary_dim", p.rotary_dim);
  get("rope_theta", p.rope_theta);
  if (j.contains("rope_type") || j.contains("rope_inv_freq") || j.contains("rope_attention_factor")) {
    get("rope_type", p.rope_type);
    get("rope_inv_freq", p.rope_inv_freq);
    get("rope_attention_factor", p.rope_attention_factor);
    try {
      rope_type_from_string(p.rope_type);
    } catch (const Error&) {
      throw Error(file, "provenance.rope_type", "unknown value '" + p.rope_type + "'");
    }
    if (p.rope_inv_freq.size() != size_t(std::max(0, p.rotary_dim / 2)))
      throw Error(file, "provenance.rope_inv_freq",
                  std::to_string(p.rope_inv_freq.size()) + " entries for rotary_dim " + std::to_string(p.rotary_dim));
    for (double f : p.rope_inv_freq)
      if (!std::isfinite(f) || !(f > 0)) throw Error(file, "provenance.rope_inv_freq", "entry " + json(f).dump() + " is not a positive number");
    if (!std::isfinite(p.rope_attention_factor) || !(p.rope_attention_factor > 0))
      throw Error(file, "provenance.rope_attention_factor", json(p.rope_attention_factor).dump() + " is not a positive number");
  } else {  // version 1: unscaled RoPE
    if (!(p.rope_theta > 0) || !std::isfinite(p.rope_theta) || p.rotary_dim < 0 || p.rotary_dim > (1 << 20))
      throw Error(file, "provenance.rope_theta", json(p.rope_theta).dump() + " with rotary_dim " +
                                                     std::to_string(p.rotary_dim) + " is not a valid RoPE");
    p.rope_inv_freq = rope_default_inv_freq(p.rope_theta, p.rotary_dim);
  }
  get("head_dim", p.head_dim);
  if (j.contains("head_dim_v")) {  // version 5
    get("head_dim_v", p.head_dim_v);
    if (p.head_dim_v < 1 || p.head_dim_v > 4096)
      throw Error(file, "provenance.head_dim_v", "out of range: " + std::to_string(p.head_dim_v));
  }
  if (j.contains("softmax_scale")) {  // version 5
    get("softmax_scale", p.softmax_scale);
    if (!std::isfinite(p.softmax_scale) || !(p.softmax_scale > 0))
      throw Error(file, "provenance.softmax_scale", json(p.softmax_scale).dump() + " is not a positive number");
  }
  get("n_layers", p.n_layers);
  get("n_heads", p.n_heads);
  get("n_kv_heads", p.n_kv_heads);
  get("gqa_map", p.gqa_map);
  if (j.contains("layer_window")) {  // absent before sliding windows were recorded: all layers full
    get("layer_window", p.layer_window);
    if (!p.layer_window.empty() && p.layer_window.size() != size_t(std::max(0, p.n_layers)))
      throw Error(file, "provenance.layer_window",
                  std::to_string(p.layer_window.size()) + " entries for n_layers " + std::to_string(p.n_layers));
    for (int w : p.layer_window)
      if (w < 0) throw Error(file, "provenance.layer_window", "negative window " + std::to_string(w));
  }
  if (j.contains("rope_local_inv_freq")) {  // version 7
    get("rope_local_inv_freq", p.rope_local_inv_freq);
    get("rope_local_attention_factor", p.rope_local_attention_factor);
    get("rope_local_layers", p.rope_local_layers);
    if (p.rope_local_inv_freq.size() != p.rope_inv_freq.size())
      throw Error(file, "provenance.rope_local_inv_freq",
                  std::to_string(p.rope_local_inv_freq.size()) + " frequencies, rope_inv_freq has " +
                      std::to_string(p.rope_inv_freq.size()));
    for (double f : p.rope_local_inv_freq)
      if (!std::isfinite(f) || !(f > 0)) throw Error(file, "provenance.rope_local_inv_freq", "not a positive number: " + json(f).dump());
    if (!std::isfinite(p.rope_local_attention_factor) || !(p.rope_local_attention_factor > 0))
      throw Error(file, "provenance.rope_local_attention_factor", json(p.rope_local_attention_factor).dump() + " is not a positive number");
    for (int l : p.rope_local_layers)
      if (l < 0 || l >= p.n_layers)
        throw Error(file, "provenance.rope_local_layers", "layer " + std::to_string(l) + " outside [0, " + std::to_string(p.n_layers) + ")");
  }
  if (j.contains("decoder_layers") || j.contains("n_decoder_layers")) {  // version 8
    get("decoder_layers", p.decoder_layers);
    get("n_decoder_layers", p.n_decoder_layers);
    if (p.n_decoder_layers < p.n_layers || p.n_decoder_layers > (1 << 16))
      throw Error(file, "provenance.n_decoder_layers",
                  std::to_string(p.n_decoder_layers) + " is not between n_layers " + std::to_string(p.n_layers) + " and 65536");
    if (p.decoder_layers.size() != size_t(std::max(0, p.n_layers)))
      throw Error(file, "provenance.decoder_layers",
                  std::to_string(p.decoder_layers.size()) + " entries for n_layers " + std::to_string(p.n_layers));
    for (size_t l = 0; l < p.decoder_layers.size(); ++l)
      if (p.decoder_layers[l] < 0 || p.decoder_layers[l] >= p.n_decoder_layers ||
          (l > 0 && p.decoder_layers[l] <= p.decoder_layers[l - 1]))
        throw Error(file, "provenance.decoder_layers[" + std::to_string(l) + "]",
                    std::to_string(p.decoder_layers[l]) + " is not an ascending decoder layer in [0, " +
                        std::to_string(p.n_decoder_layers) + ")");
  }
  if (j.contains("attention_sinks")) {  // version 6
    get("attention_sinks", p.attention_sinks);
    if (p.attention_sinks.size() != size_t(std::max(0, p.n_layers)))
      throw Error(file, "provenance.attention_sinks",
                  std::to_string(p.attention_sinks.size()) + " layers for n_layers " + std::to_string(p.n_layers));
    // JSON holds no NaN or infinity (a non-finite value is null: "wrong type" above), and a model's
    // sinks are checked finite when it is loaded.
    for (size_t l = 0; l < p.attention_sinks.size(); ++l) {
      const std::string field = "provenance.attention_sinks[" + std::to_string(l) + "]";
      if (p.attention_sinks[l].size() != size_t(std::max(0, p.n_heads)))
        throw Error(file, field,
                    std::to_string(p.attention_sinks[l].size()) + " sinks for n_heads " + std::to_string(p.n_heads));
    }
  }
  if (j.contains("corpus")) {
    const json& files = j["corpus"];
    if (!files.is_array()) throw Error(file, "provenance.corpus", "not an array: " + files.dump());
    for (const auto& f : files) {
      for (const char* k : {"bytes", "replaced_bytes"})
        if (f.is_object() && f.contains(k) && !json_int_fits<int64_t>(f[k]))
          throw Error(file, "provenance.corpus", std::string("bad entry (") + k + "): " + f.dump());
      try {  // value() throws nlohmann's type_error on a non-object entry or a mistyped field
        p.corpus.push_back({f.value("path", ""), f.value("sha256", ""), f.value("bytes", int64_t(0)),
                            f.value("replaced_bytes", int64_t(0))});
      } catch (const std::exception&) {
        throw Error(file, "provenance.corpus", "bad entry: " + f.dump());
      }
    }
  }
  get("tokenizer_path", p.tokenizer_path);
  get("tokenizer_sha256", p.tokenizer_sha256);
  if (j.contains("special_tokens_mode")) {
    get("special_tokens_mode", p.special_tokens_mode);
    if (p.special_tokens_mode != "special" && p.special_tokens_mode != "text")
      throw Error(file, "provenance.special_tokens_mode", json(p.special_tokens_mode).dump() + " is neither \"special\" nor \"text\"");
  }
  if (j.contains("special_tokens_matched")) {
    get("special_tokens_matched", p.special_tokens_matched);
    if (p.special_tokens_matched < 0)
      throw Error(file, "provenance.special_tokens_matched", std::to_string(p.special_tokens_matched) + " is negative");
  }
  if (j.contains("window_bos")) {
    if (!j["window_bos"].is_boolean())
      throw Error(file, "provenance.window_bos", "not a boolean: " + j["window_bos"].dump());
    p.window_bos = j["window_bos"].get<bool>();
  }
  get("seed", p.seed);
  get("samples", p.samples);
  get("holdout", p.holdout);
  get("seq_len", p.seq_len);
  if (j.contains("window_prefix")) {  // absent before it was recorded: window_bos says
    if (!j["window_prefix"].is_array()) throw Error(file, "provenance.window_prefix", "not an array: " + j["window_prefix"].dump());
    std::vector<int> ids;
    get("window_prefix", ids);
    for (int id : ids)
      if (id < 0) throw Error(file, "provenance.window_prefix", "negative token id " + std::to_string(id));
    if (int64_t(ids.size()) >= int64_t(p.seq_len))
      throw Error(file, "provenance.window_prefix",
                  std::to_string(ids.size()) + " ids leave no corpus token in windows of seq_len " + std::to_string(p.seq_len));
    p.window_prefix = std::move(ids);
  }
  get("batch_size", p.batch_size);
  get("reservoir_tokens", p.reservoir_tokens);
  get("dtype", p.dtype);
  if (j.contains("forward_precision")) {
    get("forward_precision", p.forward_precision);
    if (p.forward_precision != "fp32" && p.forward_precision != "bf16")
      throw Error(file, "provenance.forward_precision",
                  json(p.forward_precision).dump() + " is neither \"fp32\" nor \"bf16\"");
  }
  get("n_tokens_corpus", p.n_tokens_corpus);
  get("n_ranks", p.n_ranks);
  get("created_unix", p.created_unix);
  return p;
}

static void write_side(H5::Group& g, const char* tag, const SideMoments& s, const MomentShape& sh) {
  const hsize_t L = hsize_t(sh.n_layers), H = hsize_t(sh.n_kv_heads), d = hsize_t(s.dim_of(sh));
  h5::write(g, std::string("count_") + tag, {L, H}, s.count.data());
  h5::write(g, std::string("sum_") + tag, {L, H, d}, s.sum.data());
  h5::write(g, std::string("gram_") + tag, {L, H, d, d}, s.gram.data());
}

void write_calib(const std::string& path, const CalibFile& c) {
  const auto sh = c.shape();
  write_atomically(path, [&](const std::string& tmp) {
    const h5::MuteCloseErrors mute;  // a failed close is the one kvq::Error below, not lines on stderr
    try {
      auto f = h5::create(tmp);
      H5::Group root = f.openGroup("/");
      h5::write_attr(root, "format", std::string(kCalibFormat));
      // A provenance too large for an attribute (HDF5: 64 KiB) is the /provenance dataset, version 4.
      const std::string prov = provenance_to_json(c.prov);
      const bool kv_dims = c.prov.has_kv_dims();
      if ((kv_dims || sh.v_dim() != sh.head_dim) && c.prov.v_dim() != sh.v_dim())
        throw Error(path, "provenance.head_dim_v",
                    std::to_string(c.prov.v_dim()) + " disagrees with the moments' value dim " + std::to_string(sh.v_dim()));
      // Versions 5 (kv dims) and 6 (sinks) keep the provenance in the dataset, as version 4 does.
      const bool sinks = c.prov.has_sinks(), local_rope = c.prov.has_local_rope(), hybrid = c.prov.hybrid();
      const bool in_dataset = kv_dims || sinks || local_rope || hybrid || prov.size() > kCalibProvenanceAttrMax;
      h5::write_attr(root, "version", hybrid       ? kCalibHybridVersion
                                      : local_rope ? kCalibLocalRopeVersion
                                      : sinks      ? kCalibSinksVersion
                                      : kv_dims    ? kCalibKvDimsVersion
                                      : in_dataset ? kCalibProvenanceDatasetVersion
                                                   : kCalibAttrProvenanceVersion);
      h5::write_root_text(root, leaf(h5path::kProvenance), prov, in_dataset);

      auto st = h5::make_group(root, leaf(h5path::kStats));
      h5::write_attr(st, "n_layers", int64_t(sh.n_layers));
      h5::write_attr(st, "n_kv_heads", int64_t(sh.n_kv_heads));
      h5::write_attr(st, "n_heads", int64_t(sh.n_heads));
      h5::write_attr(st, "head_dim", int64_t(sh.head_dim));
      if (sh.v_dim() != sh.head_dim) h5::write_attr(st, "head_dim_v", int64_t(sh.v_dim()));
      write_side(st, "k", c.moments.k, sh);
      write_side(st, "v", c.moments.v, sh);
      write_side(st, "q", c.moments.q, sh);
      if (c.moments.has_amax()) {
        const hsize_t L = hsize_t(sh.n_layers);
        h5::write(st, leaf(h5path::kStatsAmaxK), {L, hsize_t(sh.n_kv_heads)}, c.moments.k_amax.data());
        h5::write(st, leaf(h5path::kStatsAmaxV), {L, hsize_t(sh.n_kv_heads)}, c.moments.v_amax.data());
        h5::write(st, leaf(h5path::kStatsAmaxQ), {L, hsize_t(sh.n_heads)}, c.moments.q_amax.data());
      }

      auto w = h5::make_group(root, leaf(h5path::kWindows));
      h5::write_attr(w, leaf(h5path::kWindowsDone), c.windows_done);
      h5::write(w, leaf(h5path::kCalibOffsets), {hsize_t(c.calib_offsets.size())}, c.calib_offsets.data());
      h5::write(w, leaf(h5path::kHoldoutOffsets), {hsize_t(c.holdout_offsets.size())}, c.holdout_offsets.data());
      if (!c.window_rank.empty())
        h5::write(w, "window_rank", {hsize_t(c.window_rank.size())}, c.window_rank.data());

      const hsize_t L = hsize_t(sh.n_layers), H = hsize_t(sh.n_kv_heads), NH = hsize_t(sh.n_heads),
                    d = hsize_t(sh.head_dim), dv = hsize_t(sh.v_dim());
      auto r = h5::make_group(root, leaf(h5path::kReservoir));
      const auto& rv = c.reservoir;
      const hsize_t n = hsize_t(rv.size());
      h5::write_attr(r, "capacity", rv.capacity);
      h5::write_attr(r, "seen", rv.seen);
      h5::write(r, "rng_state", {4}, rv.rng_state.data());
      h5::write(r, leaf(h5path::kReservoirSource), {n, 2}, rv.source.data());
      // q, k, v may hold more rows than are filled (a capture's buffer): the first n are written.
      if (rv.q.size() < n * L * NH * d || rv.k.size() < n * L * H * d || rv.v.size() < n * L * H * dv)
        throw Error(path, h5path::child(h5path::kReservoir, "q"),
                    "holds fewer rows than " + std::string(h5path::kReservoirSource) + " (" + std::to_string(n) + ")");
      h5::write(r, "q", {n, L, NH, d}, rv.q.data());
      h5::write(r, "k", {n, L, H, d}, rv.k.data());
      h5::write(r, "v", {n, L, H, dv}, rv.v.data());

      auto ho = h5::make_group(root, leaf(h5path::kHoldout));
      const auto& hd = c.holdout;
      const hsize_t M = hsize_t(hd.windows), T = hsize_t(c.prov.seq_len);
      h5::write_attr(ho, leaf(h5path::kHoldoutWindows), int64_t(hd.windows));
      h5::write(ho, "ids", {M, T}, hd.ids.data());
      h5::write(ho, "positions", {hd.windows > 0 ? T : 0}, hd.positions.data());
      h5::write(ho, "q", {L, M, T, NH, d}, hd.q.data());
      h5::write(ho, "k", {L, M, T, H, d}, hd.k.data());
      h5::write(ho, "v", {L, M, T, H, dv}, hd.v.data());
      f.close();
    } catch (const H5::Exception& e) {
      throw Error(path, "", "HDF5 write failed: " + std::string(e.getCDetailMsg()));
    }
  });
}

static void check_finite(const std::string& file, const std::string& where, const std::vector<double>& v) {
  for (size_t i = 0; i < v.size(); ++i)
    if (!std::isfinite(v[i]))
      throw Error(file, where, "non-finite value " + std::to_string(v[i]) + " at element " + std::to_string(i));
}

static SideMoments read_side(const std::string& file, const H5::Group& g, const char* tag, const MomentShape& sh,
                             int dim) {
  const hsize_t L = hsize_t(sh.n_layers), H = hsize_t(sh.n_kv_heads), d = hsize_t(dim);
  SideMoments s;
  s.dim = dim;
  s.count = h5::read_i64(file, g, std::string("count_") + tag, {L, H});
  s.sum = h5::read_f64(file, g, std::string("sum_") + tag, {L, H, d});
  s.gram = h5::read_f64(file, g, std::string("gram_") + tag, {L, H, d, d});
  for (size_t i = 0; i < s.count.size(); ++i)
    if (s.count[i] < 0)
      throw Error(file, h5path::child(h5path::kStats, std::string("count_") + tag),
                  "negative count " + std::to_string(s.count[i]));
  check_finite(file, h5path::child(h5path::kStats, std::string("sum_") + tag), s.sum);
  check_finite(file, h5path::child(h5path::kStats, std::string("gram_") + tag), s.gram);
  return s;
}

CalibFile read_calib(const std::string& path, bool samples) {
  const FaultGuard fault_guard(path);  // libhdf5 can fault on corrupt metadata: one line, exit 2
  const OpenedKvqFile opened = open_kvq_file(path, KvqFileKind::kCalibration);
  const H5::Group& root = opened.root;
  CalibFile c;
  c.format_version = opened.header.version;
  // Version 4 keeps the provenance in the /provenance dataset, older versions in the attribute.
  const bool in_dataset = opened.header.version >= kCalibProvenanceDatasetVersion;
  c.prov = provenance_from_json(path,
                                h5::read_root_text(path, root, leaf(h5path::kProvenance), opened.header.version,
                                                   kCalibProvenanceDatasetVersion, "calibration",
                                                   kCalibProvenanceMaxBytes),
                                in_dataset ? h5path::kProvenance : h5path::kProvenanceAttr);

  auto st = h5::open_group(path, root, leaf(h5path::kStats));
  MomentShape sh;
  auto dim_attr = [&](const char* name, int lo, int hi) {
    int64_t v = h5::read_attr_i64(path, st, name);
    if (v < lo || v > hi) throw Error(path, h5path::attr(h5path::kStats, name), "out of range: " + std::to_string(v));
    return int(v);
  };
  sh.n_layers = dim_attr("n_layers", 1, 4096);
  sh.n_kv_heads = dim_attr("n_kv_heads", 1, 4096);
  sh.n_heads = dim_attr("n_heads", 1, 65536);
  sh.head_dim = dim_attr("head_dim", 2, 4096);
  if (h5::has_attr(st, "head_dim_v")) {
    if (c.format_version < kCalibKvDimsVersion)
      throw Error(path, h5path::attr(h5path::kStats, "head_dim_v"),
                  "needs calibration version >= " + std::to_string(kCalibKvDimsVersion) + ", the file is version " +
                      std::to_string(c.format_version));
    sh.head_dim_v = dim_attr("head_dim_v", 1, 4096);
  }
  if (c.prov.has_kv_dims() && c.format_version < kCalibKvDimsVersion)
    throw Error(path, c.prov.v_dim() != c.prov.head_dim ? "provenance.head_dim_v" : "provenance.softmax_scale",
                "needs calibration version >= " + std::to_string(kCalibKvDimsVersion) + ", the file is version " +
                    std::to_string(c.format_version));
  if (c.prov.has_local_rope() && c.format_version < kCalibLocalRopeVersion)
    throw Error(path, "provenance.rope_local_inv_freq",
                "needs calibration version >= " + std::to_string(kCalibLocalRopeVersion) + ", the file is version " +
                    std::to_string(c.format_version));
  if (c.prov.hybrid() && c.format_version < kCalibHybridVersion)
    throw Error(path, "provenance.decoder_layers",
                "needs calibration version >= " + std::to_string(kCalibHybridVersion) + ", the file is version " +
                    std::to_string(c.format_version));
  if (c.prov.has_sinks() && c.format_version < kCalibSinksVersion)
    throw Error(path, "provenance.attention_sinks",
                "needs calibration version >= " + std::to_string(kCalibSinksVersion) + ", the file is version " +
                    std::to_string(c.format_version));
  if (sh.head_dim == c.prov.head_dim && sh.v_dim() != c.prov.v_dim())  // a wrong head_dim is the shape's error below
    throw Error(path, h5path::attr(h5path::kStats, "head_dim_v"),
                std::to_string(sh.v_dim()) + " disagrees with provenance.head_dim_v " + std::to_string(c.prov.v_dim()));
  if (sh.n_heads % sh.n_kv_heads != 0)
    throw Error(path, h5path::attr(h5path::kStats, "n_heads"),
                std::to_string(sh.n_heads) + " not a multiple of n_kv_heads");
  if (sh.n_layers != c.prov.n_layers || sh.n_kv_heads != c.prov.n_kv_heads || sh.n_heads != c.prov.n_heads ||
      sh.head_dim != c.prov.head_dim)
    throw Error(path, h5path::kStats, "shape disagrees with the provenance");
  c.moments = Moments(sh);
  c.moments.k = read_side(path, st, "k", sh, sh.head_dim);
  c.moments.v = read_side(path, st, "v", sh, sh.v_dim());
  c.moments.q = read_side(path, st, "q", sh, sh.head_dim);
  if (c.format_version >= 3 && h5::has_link(st, leaf(h5path::kStatsAmaxK))) {
    auto read_amax = [&](const char* object, hsize_t heads) {
      std::vector<float> a = h5::read_f32(path, st, leaf(object), {hsize_t(sh.n_layers), heads});
      for (size_t i = 0; i < a.size(); ++i)
        if (!(a[i] >= 0.f) || !std::isfinite(a[i]))
          throw Error(path, object,
                      "not a finite maximum >= 0: " + std::to_string(a[i]) + " at element " + std::to_string(i));
      return a;
    };
    c.moments.k_amax = read_amax(h5path::kStatsAmaxK, hsize_t(sh.n_kv_heads));
    c.moments.v_amax = read_amax(h5path::kStatsAmaxV, hsize_t(sh.n_kv_heads));
    c.moments.q_amax = read_amax(h5path::kStatsAmaxQ, hsize_t(sh.n_heads));
    track_amax_with(c.moments, c.prov);  // a resumed capture keeps taking maxima
  }

  auto w = h5::open_group(path, root, leaf(h5path::kWindows));
  c.windows_done = h5::read_attr_i64(path, w, leaf(h5path::kWindowsDone));
  auto n_cal = h5::shape_of(path, w, leaf(h5path::kCalibOffsets));
  auto n_ho = h5::shape_of(path, w, leaf(h5path::kHoldoutOffsets));
  if (n_cal.size() != 1 || n_ho.size() != 1) throw Error(path, h5path::kWindows, "offsets must be 1-D");
  c.calib_offsets = h5::read_i64(path, w, leaf(h5path::kCalibOffsets), n_cal);
  c.holdout_offsets = h5::read_i64(path, w, leaf(h5path::kHoldoutOffsets), n_ho);
  if (h5::exists(w, "window_rank")) c.window_rank = h5::read_i64(path, w, "window_rank", n_cal);
  if (c.windows_done < 0 || c.windows_done > int64_t(c.calib_offsets.size()))
    throw Error(path, h5path::kWindowsDone, "out of range: " + std::to_string(c.windows_done));

  const hsize_t L = hsize_t(sh.n_layers), H = hsize_t(sh.n_kv_heads), NH = hsize_t(sh.n_heads),
                d = hsize_t(sh.head_dim), dv = hsize_t(sh.v_dim());
  auto r = h5::open_group(path, root, leaf(h5path::kReservoir));
  auto& rv = c.reservoir;
  rv.capacity = h5::read_attr_i64(path, r, "capacity");
  rv.seen = h5::read_attr_i64(path, r, "seen");
  auto rs = h5::read_u64(path, r, "rng_state", {4});
  std::copy(rs.begin(), rs.end(), rv.rng_state.begin());
  auto src_shape = h5::shape_of(path, r, leaf(h5path::kReservoirSource));
  if (src_shape.size() != 2 || src_shape[1] != 2 || int64_t(src_shape[0]) > rv.capacity)
    throw Error(path, h5path::kReservoirSource, "bad shape");
  const hsize_t n = src_shape[0];
  rv.source = h5::read_i64(path, r, leaf(h5path::kReservoirSource), {n, 2});
  if (samples) {
    h5::read_f32(path, r, "q", {n, L, NH, d}, &rv.q);
    h5::read_f32(path, r, "k", {n, L, H, d}, &rv.k);
    h5::read_f32(path, r, "v", {n, L, H, dv}, &rv.v);
  }

  auto ho = h5::open_group(path, root, leaf(h5path::kHoldout));
  auto& hd = c.holdout;
  int64_t M = h5::read_attr_i64(path, ho, leaf(h5path::kHoldoutWindows));
  if (M < 0 || M != int64_t(c.holdout_offsets.size()))
    throw Error(path, h5path::kHoldoutWindows,
                "disagrees with " + std::string(h5path::kHoldoutOffsets) + ": " + std::to_string(M));
  hd.windows = int(M);
  const hsize_t T = hsize_t(c.prov.seq_len);
  if (samples) {
    hd.ids = h5::read_i64(path, ho, "ids", {hsize_t(M), T});
    hd.positions = h5::read_i64(path, ho, "positions", {M > 0 ? T : 0});
    h5::read_f32(path, ho, "q", {L, hsize_t(M), T, NH, d}, &hd.q);
    h5::read_f32(path, ho, "k", {L, hsize_t(M), T, H, d}, &hd.k);
    h5::read_f32(path, ho, "v", {L, hsize_t(M), T, H, dv}, &hd.v);
  }
  return c;
}

std::string calib_content_digest(const CalibFile& c) {
  Sha256 s;
  CalibProvenance p = c.prov;
  p.created_unix = 0;
  std::string pj = provenance_to_json(p);
  s.update(pj.data(), pj.size());
  for (const SideMoments* m : {&c.moments.k, &c.moments.v, &c.moments.q}) {
    s.update(m->count.data(), m->count.size() * sizeof(int64_t));
    s.update(m->sum.data(), m->sum.size() * sizeof(double));
    s.update(m->gram.data(), m->gram.size() * sizeof(double));
  }
  for (const std::vector<float>* a : {&c.moments.k_amax, &c.moments.v_amax, &c.moments.q_amax})
    s.update(a->data(), a->size() * sizeof(float));  // nothing for files without maxima: digests unchanged
  s.update(c.calib_offsets.data(), c.calib_offsets.size() * sizeof(int64_t));
  s.update(&c.windows_done, sizeof(c.windows_done));
  return s.hex_digest();
}

}  // namespace kvq
