#include <limits>
#include <type_traits>
#include "kvq/io/alloc_file.hpp"

#include <algorithm>
#include <cmath>
#include <optional>

#include "kvq/format/decision_layout.hpp"
#include "kvq/io/h5.hpp"
#include "kvq/util/fault_guard.hpp"
#include "kvq/util/atomic_file.hpp"
#include "kvq/util/error.hpp"
#include "open_kvq_file.hpp"

namespace kvq {

using json = nlohmann::json;

// Integers of the manifest JSON: a float (or an integer out of T's range) is refused with the field
// named — nlohmann's get<int>() of 8e20 is undefined behaviour, not an error (found by fuzz_alloc).
template <typename T>
static T int_field(const std::string& file, const json& j, const char* key) {
  const json& v = j.at(key);
  if (v.is_number_unsigned()) {
    const uint64_t u = v.get<uint64_t>();
    if (u <= uint64_t(std::numeric_limits<T>::max())) return static_cast<T>(u);
  } else if (v.is_number_integer()) {
    const int64_t i = v.get<int64_t>();
    if (std::is_signed<T>::value && i >= int64_t(std::numeric_limits<T>::min()) && i <= int64_t(std::numeric_limits<T>::max()))
      return static_cast<T>(i);
  }
  throw Error(file, key, "not an integer in range: " + v.dump());
}

static std::vector<int> int_array(const std::string& file, const json& j, const char* key) {
  std::vector<int> out;
  for (const json& e : j.at(key)) {
    if (!e.is_number_integer() || e.get<int64_t>() < std::numeric_limits<int>::min() ||
        e.get<int64_t>() > std::numeric_limits<int>::max())
      throw Error(file, key, "not an integer in range: " + e.dump());
    out.push_back(static_cast<int>(e.get<int64_t>()));
  }
  return out;
}

static const char* kind_name(CodingKind k) {
  switch (k) {
    case CodingKind::kTqGroups: return "tq-groups";
    case CodingKind::kLowRankHadamard: return "lowrank-hadamard";
    case CodingKind::kKivi: return "kivi";
    case CodingKind::kMinifloat: return "minifloat";
  }
  return "?";
}

static CodingKind kind_from(const std::string& file, const std::string& s) {
  if (s == "tq-groups") return CodingKind::kTqGroups;
  if (s == "lowrank-hadamard") return CodingKind::kLowRankHadamard;
  if (s == "kivi") return CodingKind::kKivi;
  if (s == "minifloat") return CodingKind::kMinifloat;
  throw Error(file, "manifest.heads[].kind", "unknown coding kind '" + s + "'");
}

const HeadDecision& AllocFile::head(Side s, int layer, int kv_head) const {
  for (const auto& h : heads)
    if (h.side == s && h.layer == layer && h.kv_head == kv_head) return h;
  throw Error("", "heads", "no decision for layer " + std::to_string(layer) + " head " + std::to_string(kv_head));
}

static std::string tensor_name(const HeadDecision& h, const char* what) {
  return std::string(h.side == Side::kK ? "k" : "v") + "_l" + std::to_string(h.layer) + "_h" +
         std::to_string(h.kv_head) + "_" + what;
}

static std::string distortion_before_name(Side s) {
  return std::string(s == Side::kK ? "k" : "v") + "_distortion_before";
}

static MinifloatFormat minifloat_from(const std::string& file, const std::string& where, const std::string& s) {
  if (s == to_string(MinifloatFormat::kFp8E4M3)) return MinifloatFormat::kFp8E4M3;
  if (s == to_string(MinifloatFormat::kNvfp4)) return MinifloatFormat::kNvfp4;
  throw Error(file, where + ".format", "unknown minifloat format '" + s + "' (valid: fp8, nvfp4)");
}

// The allocation's TQ norm-correction setting: nullopt when its TQ heads differ (kvq-allocate
// --norm-correction auto decides per head: version 3, recorded per head), else the one value
// (false without TQ heads), recorded once in the manifest.
static std::optional<bool> tq_norm_correction(const AllocFile& a) {
  const HeadDecision* first = nullptr;
  for (const auto& h : a.heads) {
    if (h.kind != CodingKind::kTqGroups) continue;
    if (!first) first = &h;
    if (h.norm_correction != first->norm_correction) return std::nullopt;
  }
  return first && first->norm_correction;
}

static const char* rotation_name(TqRotation r) { return r == TqRotation::kIdentity ? "identity" : "haar"; }

// The oldest version that holds the decisions (the manifest's size aside: alloc_manifest).
static int64_t decisions_version(const AllocFile& a) {
  int64_t v = kAllocOldestVersion;
  for (const auto& h : a.heads) {
    if (h.kind == CodingKind::kMinifloat) v = std::max(v, kAllocMinifloatVersion);
    for (const auto& g : h.groups) {
      if (g.rotation != TqRotation::kHaar) v = std::max(v, kAllocGroupRotationVersion);
      if (g.codebook != TqCodebook::kGaussian) v = std::max(v, kAllocGroupCodebookVersion);
    }
    if (h.kind == CodingKind::kTqGroups && h.ratio_bits > 0) v = std::max(v, kAllocCompactNormsVersion);
  }
  const std::optional<bool> nc = tq_norm_correction(a);
  if (!nc) v = std::max(v, kAllocHeadNormCorrectionVersion);
  else if (*nc) v = std::max(v, kAllocNormCorrectionVersion);
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
  json heads = json::array();
  for (const auto& h : a.heads) {
    json j = {{"layer", h.layer},
              {"kv_head", h.kv_head},
              {"side", h.side == Side::kK ? "K" : "V"},
              {"kind", kind_name(h.kind)},
              {"post_rope", h.post_rope}};
    if (h.kind == CodingKind::kTqGroups) {
      json gs = json::array();
      for (const auto& g : h.groups) {
        json jg = {{"bits", g.bits}, {"dims", g.dims}, {"rotation_seed", g.rotation_seed}};
        if (version >= kAllocGroupRotationVersion) jg["rotation"] = rotation_name(g.rotation);
        // Only when not the default: files without exact codebooks keep their bytes.
        if (g.codebook == TqCodebook::kSphere) jg["codebook"] = "exact";
        gs.push_back(std::move(jg));
      }
      j["groups"] = gs;
      if (!h.block_bits.empty()) j["block_bits"] = h.block_bits;
      if (!nc) j["norm_correction"] = h.norm_correction;
      if (h.ratio_bits > 0)
        j["group_norms"] = {{"kind", "compact"},
                            {"ratio_bits", h.ratio_bits},
                            {"norm_log2_lo", h.norm_log2_lo},
                            {"norm_log2_step", h.norm_log2_step},
                            {"ratios", tensor_name(h, "ratios")}};
    } else if (h.kind == CodingKind::kLowRankHadamard) {
      j["rank"] = h.rank;
      j["bits"] = h.bits;
      j["budget_bits"] = h.budget_bits;
      j["hadamard_seed"] = h.hadamard_seed;
      j["scale"] = h.scale;
      j["basis"] = tensor_name(h, "basis");
      j["mean"] = tensor_name(h, "mean");
    } else if (h.kind == CodingKind::kMinifloat) {
      j["format"] = to_string(h.minifloat);
      j["scale"] = h.scale;
    } else {
      j["bits"] = h.bits;
      j["group_size"] = h.group_size;
    }
    j["predicted_distortion"] = h.predicted_distortion;
    heads.push_back(j);
  }
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
  const int d = a.calib.head_dim;
  write_atomically(path, [&](const std::string& tmp) {
    try {
      auto f = h5::create(tmp);
      H5::Group root = f.openGroup("/");
      h5::write_attr(root, "format", std::string(kAllocFormat));
      h5::write_attr(root, "version", version);
      h5::write_root_text(root, "manifest", text, version >= kAllocManifestDatasetVersion);
      auto t = h5::make_group(root, "tensors");
      for (const auto& h : a.heads) {
        if (h.kind == CodingKind::kTqGroups && h.ratio_bits > 0) {
          KVQ_ASSERT(h.ratio_codebook.size() == (size_t{1} << h.ratio_bits) * h.groups.size());
          h5::write(t, tensor_name(h, "ratios"), {hsize_t(1) << h.ratio_bits, hsize_t(h.groups.size())},
                    h.ratio_codebook.data());
        }
        if (h.kind != CodingKind::kLowRankHadamard) continue;
        KVQ_ASSERT(h.basis.size() == size_t(d) * size_t(h.rank) && h.mean.size() == size_t(d));
        h5::write(t, tensor_name(h, "basis"), {hsize_t(d), hsize_t(h.rank)}, h.basis.data());
        h5::write(t, tensor_name(h, "mean"), {hsize_t(d)}, h.mean.data());
      }
      if (!a.k_distortion_before.empty() || !a.v_distortion_before.empty()) {
        auto s = h5::make_group(root, "solver");
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
    m = json::parse(h5::read_root_text(path, root, "manifest", version, kAllocManifestDatasetVersion, "allocation",
                                       kAllocManifestMaxBytes));
  } catch (const json::exception&) {
    throw Error(path, version >= kAllocManifestDatasetVersion ? "/manifest" : "/@manifest", "not valid JSON");
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
  auto t = h5::open_group(path, root, "tensors");
  if (!m.contains("heads") || !m["heads"].is_array()) throw Error(path, "manifest.heads", "missing");
  size_t i = 0;
  for (const auto& j : m["heads"]) {
    const std::string where = "manifest.heads[" + std::to_string(i++) + "]";
    HeadDecision h;
    try {
      h.layer = int_field<int>(path, j, "layer");
      h.kv_head = int_field<int>(path, j, "kv_head");
      std::string side = j.at("side").get<std::string>();
      if (side != "K" && side != "V") throw Error(path, where + ".side", "must be K or V, found '" + side + "'");
      h.side = side == "K" ? Side::kK : Side::kV;
      h.kind = kind_from(path, j.at("kind").get<std::string>());
      h.post_rope = j.at("post_rope").get<bool>();
      h.predicted_distortion = j.value("predicted_distortion", 0.0);
      if (h.layer < 0 || h.layer >= L || h.kv_head < 0 || h.kv_head >= H)
        throw Error(path, where, "layer/head out of range");
      if (h.kind == CodingKind::kTqGroups) {
        std::vector<int> seen(size_t(d), 0);
        for (const auto& g : j.at("groups")) {
          TqGroup tg;
          tg.bits = int_field<int>(path, g, "bits");
          tg.dims = int_array(path, g, "dims");
          tg.rotation_seed = int_field<uint64_t>(path, g, "rotation_seed");
          if (g.contains("rotation")) {  // version 2; absent = haar (version 1, and earlier version 2 files)
            const std::string r = g["rotation"].is_string() ? g["rotation"].get<std::string>() : g["rotation"].dump();
            if (opened.header.version < kAllocGroupRotationVersion)
              throw Error(path, where + ".groups[].rotation",
                          "needs allocation version >= " + std::to_string(kAllocGroupRotationVersion) +
                              ", the file is version " + std::to_string(opened.header.version));
            if (r == "identity") tg.rotation = TqRotation::kIdentity;
            else if (r != "haar") throw Error(path, where + ".groups[].rotation", "unknown rotation '" + r + "' (valid: haar, identity)");
          }
          if (g.contains("codebook")) {  // version 3; absent = gaussian
            const std::string cbk = g["codebook"].is_string() ? g["codebook"].get<std::string>() : g["codebook"].dump();
            if (opened.header.version < kAllocGroupCodebookVersion)
              throw Error(path, where + ".groups[].codebook",
                          "needs allocation version >= " + std::to_string(kAllocGroupCodebookVersion) +
                              ", the file is version " + std::to_string(opened.header.version));
            if (cbk == "exact") tg.codebook = TqCodebook::kSphere;
            else if (cbk != "gaussian")
              throw Error(path, where + ".groups[].codebook", "unknown codebook '" + cbk + "' (valid: gaussian, exact)");
            if (tg.codebook == TqCodebook::kSphere && (tg.dims.size() < 2 || tg.dims.size() > size_t(kTqSphereMaxM)))
              throw Error(path, where + ".groups[].codebook",
                          "exact needs 2.." + std::to_string(kTqSphereMaxM) + " dims, the group has " +
                              std::to_string(tg.dims.size()));
          }
          if (tg.bits < 1 || tg.bits > 8) throw Error(path, where + ".groups[].bits", "out of 1..8: " + std::to_string(tg.bits));
          for (int x : tg.dims) {
            if (x < 0 || x >= d || seen[size_t(x)]++)
              throw Error(path, where + ".groups[].dims", "dim " + std::to_string(x) + " out of range or repeated");
          }
          h.groups.push_back(std::move(tg));
        }
        if (j.contains("block_bits")) h.block_bits = int_array(path, j, "block_bits");
        h.norm_correction = norm_correction;
        if (j.contains("norm_correction")) {  // version 3: per head, overrides the manifest's
          if (opened.header.version < kAllocHeadNormCorrectionVersion)
            throw Error(path, where + ".norm_correction",
                        "needs allocation version >= " + std::to_string(kAllocHeadNormCorrectionVersion) +
                            ", the file is version " + std::to_string(opened.header.version));
          if (!j["norm_correction"].is_boolean())
            throw Error(path, where + ".norm_correction", "must be true or false, found " + j["norm_correction"].dump());
          h.norm_correction = j["norm_correction"].get<bool>();
        }
        if (j.contains("group_norms")) {  // version 4: compact group norms
          const std::string gw = where + ".group_norms";
          if (opened.header.version < kAllocCompactNormsVersion)
            throw Error(path, gw, "needs allocation version >= " + std::to_string(kAllocCompactNormsVersion) +
                                      ", the file is version " + std::to_string(opened.header.version));
          const json& gn = j["group_norms"];
          if (!gn.is_object() || gn.value("kind", json()) != json("compact"))
            throw Error(path, gw + ".kind", "must be \"compact\", found " + (gn.is_object() ? gn.value("kind", json()).dump() : gn.dump()));
          h.ratio_bits = int_field<int>(path, gn, "ratio_bits");
          if (h.ratio_bits < 1 || h.ratio_bits > 8)
            throw Error(path, gw + ".ratio_bits", "out of 1..8: " + std::to_string(h.ratio_bits));
          if (h.groups.size() < 2)
            throw Error(path, gw, "compact group norms need >= 2 groups, the head has " + std::to_string(h.groups.size()));
          for (const char* key : {"norm_log2_lo", "norm_log2_step"}) {
            const json& v = gn.at(key);
            if (!v.is_number() || !std::isfinite(v.get<double>()) || std::fabs(v.get<double>()) > 1e4)
              throw Error(path, gw + "." + key, "must be a finite number, found " + v.dump());
          }
          h.norm_log2_lo = gn["norm_log2_lo"].get<float>();
          h.norm_log2_step = gn["norm_log2_step"].get<float>();
          h.ratio_codebook = h5::read_f32(path, t, gn.at("ratios").get<std::string>(),
                                          {hsize_t(1) << h.ratio_bits, hsize_t(h.groups.size())});
          try {
            layout::layout_for(h, d);  // levels' range, codebook values: the codec's own checks
          } catch (const Error& e) {
            throw Error(path, gw, e.what());
          }
        }
      } else if (h.kind == CodingKind::kLowRankHadamard) {
        h.rank = int_field<int>(path, j, "rank");
        h.bits = int_field<int>(path, j, "bits");
        h.budget_bits = int_field<int>(path, j, "budget_bits");
        h.hadamard_seed = int_field<uint64_t>(path, j, "hadamard_seed");
        h.scale = j.at("scale").get<float>();
        if (h.rank < 0 || h.rank > d) throw Error(path, where + ".rank", "out of 0.." + std::to_string(d) + ": " + std::to_string(h.rank));
        if (h.bits < 0 || h.bits > 16) throw Error(path, where + ".bits", "out of range: " + std::to_string(h.bits));
        h.basis = h5::read_f32(path, t, j.at("basis").get<std::string>(), {hsize_t(d), hsize_t(h.rank)});
        h.mean = h5::read_f32(path, t, j.at("mean").get<std::string>(), {hsize_t(d)});
        for (float x : h.basis)
          if (!std::isfinite(x)) throw Error(path, where + ".basis", "non-finite value");
        for (float x : h.mean)
          if (!std::isfinite(x)) throw Error(path, where + ".mean", "non-finite value");
      } else if (h.kind == CodingKind::kMinifloat) {
        if (opened.header.version < kAllocMinifloatVersion)
          throw Error(path, where + ".kind", "'minifloat' needs allocation version >= " +
                                                 std::to_string(kAllocMinifloatVersion) + ", the file is version " +
                                                 std::to_string(opened.header.version));
        h.minifloat = minifloat_from(path, where, j.at("format").get<std::string>());
        // JSON has no inf/NaN: nlohmann writes them as null, which reads back as a type error.
        const auto& sc = j.at("scale");
        if (!sc.is_number()) throw Error(path, where + ".scale", "must be a finite number > 0, found " + sc.dump());
        const double v = sc.get<double>();
        if (!(std::isfinite(v) && v > 0 && v <= 3.4028234663852886e38))
          throw Error(path, where + ".scale", "must be finite and > 0, found " + sc.dump());
        h.scale = static_cast<float>(v);
        if (!(h.scale > 0.f))
          throw Error(path, where + ".scale", "underflows to 0 as a float: " + sc.dump());
      } else {
        h.bits = int_field<int>(path, j, "bits");
        h.group_size = int_field<int>(path, j, "group_size");
      }
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
  if (h5::exists(root, "solver")) {
    auto s = h5::open_group(path, root, "solver");
    for (Side side : {Side::kK, Side::kV}) {
      const std::string name = distortion_before_name(side);
      if (!h5::exists(s, name)) continue;
      auto v = h5::read_f64(path, s, name, {hsize_t(L), hsize_t(H)});
      for (double x : v)
        if (!(x >= 0)) throw Error(path, "/solver/" + name, "negative or NaN value");
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
  num("rotary_dim", a.calib.rotary_dim, c.prov.rotary_dim);
  num("n_layers", a.calib.n_layers, c.prov.n_layers);
  num("n_kv_heads", a.calib.n_kv_heads, c.prov.n_kv_heads);
  num("n_heads", a.calib.n_heads, c.prov.n_heads);
}

}  // namespace kvq
