#include "kvq/io/alloc_file.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <optional>

#include "kvq/format/decision_layout.hpp"
#include "kvq/io/h5.hpp"
#include "kvq/io/h5_paths.hpp"
#include "kvq/util/fault_guard.hpp"
#include "kvq/util/atomic_file.hpp"
#include "kvq/util/error.hpp"
#include "alloc_heads.hpp"
#include "open_kvq_file.hpp"

namespace kvq {

using json = nlohmann::json;

using alloc_heads::int_field;
static_assert(kCodingKinds[size_t(CodingKind::kMinifloat)].first_alloc_version == kAllocMinifloatVersion &&
                  kCodingKinds[size_t(CodingKind::kVllmTurboQuant)].first_alloc_version == kAllocVllmTurboQuantVersion &&
                  kCodingKinds[0].first_alloc_version == kAllocOldestVersion,
              "the kinds' first allocation versions are the file format's");

const HeadDecision& AllocFile::head(Side s, int layer, int kv_head) const {
  for (const auto& h : heads)
    if (h.side == s && h.layer == layer && h.kv_head == kv_head) return h;
  throw Error("", "heads", "no decision for layer " + std::to_string(layer) + " head " + std::to_string(kv_head));
}

static std::string distortion_before_name(Side s) {
  return std::string(s == Side::kK ? "k" : "v") + "_distortion_before";
}

// The allocation's TQ norm-correction setting: nullopt when its TQ heads differ (kvq-allocate
// --norm-correction auto decides per head: version 3, recorded per head), else the one value
// (false without TQ heads), recorded once in the manifest.
static std::optional<bool> tq_norm_correction(const AllocFile& a) {
  const HeadDecision* first = nullptr;
  for (const auto& h : a.heads) {
    if (!uses(h, kFieldGroups)) continue;
    if (!first) first = &h;
    if (h.norm_correction != first->norm_correction) return std::nullopt;
  }
  return first && first->norm_correction;
}

// The oldest version that holds the decisions (the manifest's size aside: alloc_manifest).
static int64_t decisions_version(const AllocFile& a) {
  int64_t v = kAllocOldestVersion;
  for (const auto& h : a.heads) {
    v = std::max(v, coding_kind(h.kind).first_alloc_version);
    for (const auto& g : h.groups) {
      if (g.rotation != TqRotation::kHaar) v = std::max(v, kAllocGroupRotationVersion);
      if (g.codebook != TqCodebook::kGaussian) v = std::max(v, kAllocGroupCodebookVersion);
    }
    if (uses(h, kFieldGroupNorms) && h.ratio_bits > 0) v = std::max(v, kAllocCompactNormsVersion);
  }
  const std::optional<bool> nc = tq_norm_correction(a);
  if (!nc) v = std::max(v, kAllocHeadNormCorrectionVersion);
  else if (*nc) v = std::max(v, kAllocNormCorrectionVersion);
  if (a.calib.has_kv_dims()) v = std::max(v, kAllocKvDimsVersion);
  if (a.calib.hybrid()) v = std::max(v, kAllocHybridVersion);
  return v;
}

// The manifest's text as written (one-space indent: the bytes of every earlier version's files).
static std::string manifest_text(const json& m) { return m.dump(1); }

int64_t alloc_version_for(const AllocFile& a) { return alloc_manifest(a).at("version").get<int64_t>(); }

json alloc_manifest(const AllocFile& a) {
  json m;
  m["format"] = kAllocFormat;
  const int64_t version = decisions_version(a);
  m["version"] = version;
  const std::optional<bool> nc = tq_norm_correction(a);
  // One value: the manifest's (version >= 2). Per head (version 3): each TQ head's own field.
  if (version >= kAllocNormCorrectionVersion && nc) m["norm_correction"] = *nc;
  m["method"] = a.method;
  m["v_method"] = a.v_method;
  m["params"] = a.params.is_null() ? json::object() : a.params;
  m["budget"] = {{"k_bpd_nominal", a.k_bpd_nominal},
                 {"v_bpd_nominal", a.v_bpd_nominal},
                 {"k_bpd_effective", a.k_bpd_effective},
                 {"v_bpd_effective", a.v_bpd_effective}};
  const auto& p = a.calib;
  m["calibration"] = {{"path", a.calib_path},
                      {"sha256", a.calib_sha256},
                      {"content_digest", a.calib_digest},
                      {"model_config_sha256", p.model_config_sha256},
                      {"architecture", p.architecture},
                      {"rope_pairing", to_string(p.pairing)},
                      {"rotary_dim", p.rotary_dim},
                      {"rope_theta", p.rope_theta},
                      {"head_dim", p.head_dim},
                      {"n_layers", p.n_layers},
                      {"n_heads", p.n_heads},
                      {"n_kv_heads", p.n_kv_heads},
                      {"seed", p.seed},
                      {"samples", p.samples},
                      {"seq_len", p.seq_len}};
  // Only when they are not the defaults (version 6): other files keep their bytes.
  if (p.v_dim() != p.head_dim) m["calibration"]["head_dim_v"] = p.head_dim_v;
  if (p.softmax_scale > 0) m["calibration"]["softmax_scale"] = p.softmax_scale;
  if (p.hybrid()) {  // version 8
    m["calibration"]["decoder_layers"] = p.decoder_layers;
    m["calibration"]["n_decoder_layers"] = p.n_decoder_layers;
  }
  json heads = json::array();
  for (const auto& h : a.heads) heads.push_back(alloc_heads::head_json(h, version, !nc));
  m["heads"] = heads;
  m["summary"] = a.summary.is_null() ? json::object() : a.summary;
  // Too large for the root attribute: the file keeps it in the /manifest dataset (version 5). Only
  // the version's digit changes, so the size measured here is the size written.
  if (manifest_text(m).size() > kAllocManifestAttrMax) m["version"] = std::max(version, kAllocManifestDatasetVersion);
  return m;
}

void write_alloc(const std::string& path, const AllocFile& a) {
  const json m = alloc_manifest(a);
  const int64_t version = m.at("version").get<int64_t>();
  const std::string text = manifest_text(m);
  const int d = a.calib.head_dim, dv = a.calib.v_dim();
  write_atomically(path, [&](const std::string& tmp) {
    const h5::MuteCloseErrors mute;  // a failed close is the one kvq::Error below, not lines on stderr
    try {
      auto f = h5::create(tmp);
      H5::Group root = f.openGroup("/");
      h5::write_attr(root, "format", std::string(kAllocFormat));
      h5::write_attr(root, "version", version);
      h5::write_root_text(root, h5path::leaf(h5path::kManifest), text, version >= kAllocManifestDatasetVersion);
      auto t = h5::make_group(root, h5path::leaf(h5path::kTensors));
      for (const auto& h : a.heads) alloc_heads::write_head_tensors(t, h, h.side == Side::kV ? dv : d);
      if (!a.k_distortion_before.empty() || !a.v_distortion_before.empty()) {
        auto s = h5::make_group(root, h5path::leaf(h5path::kSolver));
        const auto L = hsize_t(a.calib.n_layers), H = hsize_t(a.calib.n_kv_heads);
        for (Side side : {Side::kK, Side::kV}) {
          const auto& v = a.distortion_before(side);
          if (v.empty()) continue;
          KVQ_ASSERT(v.size() == size_t(L * H));
          h5::write(s, distortion_before_name(side), {L, H}, v.data());
        }
      }
      f.close();
    } catch (const H5::Exception& e) {
      throw Error(path, "", "HDF5 write failed: " + std::string(e.getCDetailMsg()));
    }
  });
}

AllocFile read_alloc(const std::string& path) {
  const FaultGuard fault_guard(path);  // libhdf5 can fault on corrupt metadata: one line, exit 2
  const OpenedKvqFile opened = open_kvq_file(path, KvqFileKind::kAllocation);
  const H5::Group& root = opened.root;
  json m;
  // Version 5 keeps the manifest in the /manifest dataset (too large for an attribute), older
  // versions in the root attribute.
  const int64_t version = opened.header.version;
  try {
    m = json::parse(h5::read_root_text(path, root, h5path::leaf(h5path::kManifest), version, kAllocManifestDatasetVersion, "allocation",
                                       kAllocManifestMaxBytes));
  } catch (const json::exception&) {
    throw Error(path, version >= kAllocManifestDatasetVersion ? std::string(h5path::kManifest) : h5path::attr("/", h5path::leaf(h5path::kManifest)), "not valid JSON");
  }
  AllocFile a;
  std::string field;
  try {
    field = "method"; a.method = m.at("method").get<std::string>();
    field = "v_method"; a.v_method = m.at("v_method").get<std::string>();
    field = "params"; a.params = m.at("params");
    field = "summary"; a.summary = m.value("summary", json::object());
    field = "budget";
    const auto& b = m.at("budget");
    a.k_bpd_nominal = b.at("k_bpd_nominal").get<double>();
    a.v_bpd_nominal = b.at("v_bpd_nominal").get<double>();
    a.k_bpd_effective = b.at("k_bpd_effective").get<double>();
    a.v_bpd_effective = b.at("v_bpd_effective").get<double>();
    field = "calibration";
    const auto& c = m.at("calibration");
    a.calib_path = c.at("path").get<std::string>();
    a.calib_sha256 = c.at("sha256").get<std::string>();
    a.calib_digest = c.at("content_digest").get<std::string>();
    a.calib.model_config_sha256 = c.at("model_config_sha256").get<std::string>();
    a.calib.architecture = c.at("architecture").get<std::string>();
    a.calib.pairing = rope_pairing_from_string(c.at("rope_pairing").get<std::string>());
    a.calib.rotary_dim = int_field<int>(path, c, "rotary_dim");
    a.calib.rope_theta = c.at("rope_theta").get<double>();
    a.calib.head_dim = int_field<int>(path, c, "head_dim");
    a.calib.n_layers = int_field<int>(path, c, "n_layers");
    a.calib.n_heads = int_field<int>(path, c, "n_heads");
    a.calib.n_kv_heads = int_field<int>(path, c, "n_kv_heads");
    a.calib.seed = int_field<uint64_t>(path, c, "seed");
    a.calib.samples = int_field<int>(path, c, "samples");
    a.calib.seq_len = int_field<int>(path, c, "seq_len");
    for (const char* f : {"head_dim_v", "softmax_scale"})
      if (c.contains(f) && version < kAllocKvDimsVersion)
        throw Error(path, std::string("manifest.calibration.") + f,
                    "needs allocation version >= " + std::to_string(kAllocKvDimsVersion) + ", the file is version " +
                        std::to_string(version));
    if (c.contains("head_dim_v")) {
      a.calib.head_dim_v = int_field<int>(path, c, "head_dim_v");
      if (a.calib.head_dim_v < 1 || a.calib.head_dim_v > 4096)
        throw Error(path, "manifest.calibration.head_dim_v", "out of range: " + std::to_string(a.calib.head_dim_v));
    }
    if (c.contains("decoder_layers") || c.contains("n_decoder_layers")) {
      if (version < kAllocHybridVersion)
        throw Error(path, "manifest.calibration.decoder_layers",
                    "needs allocation version >= " + std::to_string(kAllocHybridVersion) + ", the file is version " +
                        std::to_string(version));
      field = "calibration.decoder_layers";
      a.calib.decoder_layers = c.at("decoder_layers").get<std::vector<int>>();
      a.calib.n_decoder_layers = int_field<int>(path, c, "n_decoder_layers");
      const auto& dl = a.calib.decoder_layers;
      if (dl.size() != size_t(std::max(0, a.calib.n_layers)))
        throw Error(path, "manifest.calibration.decoder_layers",
                    std::to_string(dl.size()) + " entries for n_layers " + std::to_string(a.calib.n_layers));
      for (size_t l = 0; l < dl.size(); ++l)
        if (dl[l] < 0 || dl[l] >= a.calib.n_decoder_layers || (l > 0 && dl[l] <= dl[l - 1]))
          throw Error(path, "manifest.calibration.decoder_layers[" + std::to_string(l) + "]",
                      std::to_string(dl[l]) + " is not an ascending decoder layer in [0, n_decoder_layers " +
                          std::to_string(a.calib.n_decoder_layers) + ")");
    }
    if (c.contains("softmax_scale")) {
      field = "calibration.softmax_scale";
      a.calib.softmax_scale = c.at("softmax_scale").get<double>();
      if (!std::isfinite(a.calib.softmax_scale) || !(a.calib.softmax_scale > 0))
        throw Error(path, "manifest.calibration.softmax_scale", c.at("softmax_scale").dump() + " is not a positive number");
    }
  } catch (const Error&) {
    throw;
  } catch (const std::exception& e) {
    throw Error(path, "manifest." + field, "missing or wrong type");
  }
  // Optional in version 2 (files written before it was recorded decode without); refused in 1.
  bool norm_correction = false;
  if (m.contains("norm_correction")) {
    if (opened.header.version < kAllocNormCorrectionVersion)
      throw Error(path, "manifest.norm_correction", "needs allocation version >= " +
                                                        std::to_string(kAllocNormCorrectionVersion) +
                                                        ", the file is version " + std::to_string(opened.header.version));
    if (!m["norm_correction"].is_boolean())
      throw Error(path, "manifest.norm_correction", "must be true or false, found " + m["norm_correction"].dump());
    norm_correction = m["norm_correction"].get<bool>();
  }
  const int d = a.calib.head_dim, L = a.calib.n_layers, H = a.calib.n_kv_heads;
  if (d < 2 || d > 4096 || L < 1 || L > 4096 || H < 1 || H > 4096)
    throw Error(path, "manifest.calibration", "implausible shape: head_dim " + std::to_string(d));
  auto t = h5::open_group(path, root, h5path::leaf(h5path::kTensors));
  if (!m.contains("heads") || !m["heads"].is_array()) throw Error(path, "manifest.heads", "missing");
  size_t i = 0;
  for (const auto& j : m["heads"]) {
    const std::string where = "manifest.heads[" + std::to_string(i++) + "]";
    HeadDecision h;
    try {
      // V decisions at the value dim (version 6: MLA's served cache); the side is read first.
      const int hd = j.is_object() && j.contains("side") && j["side"] == "V" ? a.calib.v_dim() : d;
      h = alloc_heads::read_head(j, where, {path, opened.header.version, hd, L, H, norm_correction, t});
    } catch (const Error&) {
      throw;
    } catch (const std::exception& e) {
      throw Error(path, where, "a field is missing or has the wrong type");
    }
    a.heads.push_back(std::move(h));
  }
  if (a.heads.size() != size_t(2 * L * H))
    throw Error(path, "manifest.heads", "expected " + std::to_string(2 * L * H) + " decisions (K and V per layer and KV head), found " +
                                            std::to_string(a.heads.size()));
  // Optional (files written before kvq stored them lack the group): the solver's before-C2 figures.
  if (h5::exists(root, h5path::leaf(h5path::kSolver))) {
    auto s = h5::open_group(path, root, h5path::leaf(h5path::kSolver));
    for (Side side : {Side::kK, Side::kV}) {
      const std::string name = distortion_before_name(side);
      if (!h5::exists(s, name)) continue;
      auto v = h5::read_f64(path, s, name, {hsize_t(L), hsize_t(H)});
      for (double x : v)
        if (!(x >= 0)) throw Error(path, h5path::child(h5path::kSolver, name), "negative or NaN value");
      (side == Side::kK ? a.k_distortion_before : a.v_distortion_before) = std::move(v);
    }
  }
  return a;
}

void check_alloc_matches(const AllocFile& a, const std::string& ap, const CalibFile& c, const std::string& cp) {
  auto bad = [&](const std::string& field, const std::string& va, const std::string& vc) {
    throw Error(ap, "calibration." + field, "'" + va + "' does not match " + cp + "'s '" + vc + "'");
  };
  if (a.calib.model_config_sha256 != c.prov.model_config_sha256)
    bad("model_config_sha256", a.calib.model_config_sha256, c.prov.model_config_sha256);
  if (a.calib.pairing != c.prov.pairing) bad("rope_pairing", to_string(a.calib.pairing), to_string(c.prov.pairing));
  auto num = [&](const char* f, int x, int y) {
    if (x != y) bad(f, std::to_string(x), std::to_string(y));
  };
  num("head_dim", a.calib.head_dim, c.prov.head_dim);
  num("head_dim_v", a.calib.v_dim(), c.prov.v_dim());
  if (a.calib.attn_scale() != c.prov.attn_scale()) {
    char x[32], y[32];
    std::snprintf(x, sizeof x, "%.17g", a.calib.attn_scale());
    std::snprintf(y, sizeof y, "%.17g", c.prov.attn_scale());
    bad("softmax_scale", x, y);
  }
  num("rotary_dim", a.calib.rotary_dim, c.prov.rotary_dim);
  num("n_layers", a.calib.n_layers, c.prov.n_layers);
  num("n_kv_heads", a.calib.n_kv_heads, c.prov.n_kv_heads);
  num("n_heads", a.calib.n_heads, c.prov.n_heads);
}

}  // namespace kvq
