#pragma once
// The allocation file (.kvqalloc.h5): a JSON manifest (everything but large tensors) plus the
// per-head COBRA bases and means. Layout: schemas/allocation-file.md; manifest schema:
// schemas/allocation-manifest.schema.json.
#include <nlohmann/json.hpp>

#include <cstdint>
#include <string>
#include <vector>

#include "kvq/format/decision.hpp"
#include "kvq/io/calib_file.hpp"

namespace kvq {

inline constexpr const char* kAllocFormat = "kvq-allocation";
// Written to disk; bump on any layout change (schemas/allocation-file.md, "Versions").
//  1: kinds tq-groups, lowrank-hadamard, kivi.
//  2: adds kind "minifloat" (FP8 / NVFP4 with a static scale) and the manifest's
//     "norm_correction" (TQ heads decode rho Pi^T c/||c||; absent = false) and each TQ group's
//     "rotation" (haar / identity; absent = haar).
//  3: adds each TQ group's "codebook" ("exact": the unit-sphere coordinate law at m, written only
//     then; absent = gaussian) and each TQ head's "norm_correction" (written, on every TQ head and
//     instead of the manifest's, only when the TQ heads differ: kvq-allocate --norm-correction
//     auto). A version-2 reader would decode an exact group with the Gaussian table, or every
//     head with one setting, silently wrong, so such files carry 3 and older readers refuse them.
// A file is written at the oldest version that holds its decisions (1 unless it has a minifloat
// head, TQ heads with norm correction or an unrotated group: 2; an exact-codebook group or TQ heads
// that differ in norm correction: 3; compact group norms: 4; a manifest too large for an attribute:
// 5), so
// kvq builds that read only older versions still read every file they can understand and refuse
// the others by version; files without the newer fields keep their bytes.
inline constexpr int64_t kAllocVersion = 5;
inline constexpr int64_t kAllocOldestVersion = 1;
inline constexpr int64_t kAllocMinifloatVersion = 2;
inline constexpr int64_t kAllocNormCorrectionVersion = 2;
inline constexpr int64_t kAllocGroupRotationVersion = 2;  // tq-groups groups[].rotation (haar / identity)
// tq-groups groups[].codebook ("exact": the unit-sphere coordinate law, TqCodebook::kSphere;
// written only then, absent = gaussian, so files without it keep their bytes); refused in 1 and 2
inline constexpr int64_t kAllocGroupCodebookVersion = 3;
// tq-groups heads[].norm_correction (per head; written only when the TQ heads differ); refused in 1, 2
inline constexpr int64_t kAllocHeadNormCorrectionVersion = 3;
// tq-groups heads[].group_norms (compact group norms: one 16-bit record per token, the ratio
// codebook in /tensors); written only for such heads, refused in 1..3 (a version-3 reader would read
// the record as group 0's fp16 norm and every other group's norm from the codes: wrong, silently)
inline constexpr int64_t kAllocCompactNormsVersion = 4;
// The manifest as the root dataset /manifest (u8, its JSON's UTF-8 bytes) instead of the root
// attribute: written only when the manifest is too large for an HDF5 attribute (more than
// kAllocManifestAttrMax bytes: any model of the size people run, e.g. 32 layers x 8 KV heads),
// so smaller files keep their bytes. A version-4 reader looks for the attribute and would fail
// with "attribute missing"; the bump makes it say a newer kvq wrote the file instead.
inline constexpr int64_t kAllocManifestDatasetVersion = 5;
inline constexpr size_t kAllocManifestAttrMax = 60000;          // HDF5's limit is 64 KiB per header message
inline constexpr size_t kAllocManifestMaxBytes = size_t(1) << 30;  // what a reader accepts

struct AllocFile {
  std::string method;            // K method name, e.g. "block-gtq"
  std::string v_method;          // V method name
  nlohmann::json params;         // every solver parameter, by name
  double k_bpd_nominal = 0, v_bpd_nominal = 0;
  double k_bpd_effective = 0, v_bpd_effective = 0;  // all stored bits per token / d (codes+norms+scales)
  std::string calib_path, calib_sha256, calib_digest;
  CalibProvenance calib;         // provenance of the calibration input (model, convention, corpus)
  std::vector<HeadDecision> heads;  // every (layer, KV head, side), sorted by (side, layer, head)
  nlohmann::json summary;        // solver figures (objective, per-head distortion spread, ...)
  // Per-head distortion the COBRA solver predicted at the even split ("before C2"), layer-major
  // [n_layers * n_kv_heads], one vector per side. Empty: the side is not COBRA-allocated, or the
  // file was written before kvq stored them (optional datasets /solver/<s>_distortion_before).
  std::vector<double> k_distortion_before, v_distortion_before;

  const std::vector<double>& distortion_before(Side s) const {
    return s == Side::kK ? k_distortion_before : v_distortion_before;
  }

  const HeadDecision& head(Side s, int layer, int kv_head) const;
};

nlohmann::json alloc_manifest(const AllocFile& a);  // what the JSON schema validates
int64_t alloc_version_for(const AllocFile& a);      // the version write_alloc writes (see above)
void write_alloc(const std::string& path, const AllocFile& a);  // atomic
AllocFile read_alloc(const std::string& path);

// Refuses an allocation made for another model/convention than the calibration file (field named).
void check_alloc_matches(const AllocFile& a, const std::string& alloc_path, const CalibFile& c,
                         const std::string& calib_path);

}  // namespace kvq
