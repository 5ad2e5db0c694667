#pragma once
// The HDF5 object paths of kvq's files, spelled once: for the reader/writer (which opens a group
// and then its children by leaf()), for the errors that name an object ("/group/dataset",
// "/group@attribute"), and for tools and tests that open a file with HDF5's own API. Written to
// disk: never renamed (schemas/calibration-file.md, schemas/allocation-file.md).
#include <string>

namespace kvq::h5path {

// The calibration file (.kvqcal.h5).
inline constexpr char kProvenance[] = "/provenance";        // root dataset (version >= 4)
inline constexpr char kProvenanceAttr[] = "/@provenance";   // root attribute (versions 1-3)
inline constexpr char kStats[] = "/stats";                  // moments; count_/sum_/gram_ + k, v, q
inline constexpr char kStatsCountK[] = "/stats/count_k";
inline constexpr char kStatsGramK[] = "/stats/gram_k";
inline constexpr char kStatsAmaxK[] = "/stats/amax_k";      // activation maxima (version >= 3)
inline constexpr char kStatsAmaxV[] = "/stats/amax_v";
inline constexpr char kStatsAmaxQ[] = "/stats/amax_q";
inline constexpr char kWindows[] = "/windows";
inline constexpr char kWindowsDone[] = "/windows@windows_done";
inline constexpr char kCalibOffsets[] = "/windows/calib_offsets";
inline constexpr char kHoldoutOffsets[] = "/windows/holdout_offsets";
inline constexpr char kReservoir[] = "/reservoir";
inline constexpr char kReservoirSource[] = "/reservoir/source";
inline constexpr char kHoldout[] = "/holdout";
inline constexpr char kHoldoutWindows[] = "/holdout@windows";

// The allocation file (.kvqalloc.h5).
inline constexpr char kTensors[] = "/tensors";  // each head's float arrays, named in the manifest
inline constexpr char kSolver[] = "/solver";    // optional: the solver's per-head figures
inline constexpr char kManifest[] = "/manifest";  // root dataset (version >= 5), else the attribute

// The object's name in its parent: what follows the last '/' or '@' ("stats", "windows_done").
constexpr const char* leaf(const char* path) {
  const char* name = path;
  for (const char* p = path; *p; ++p)
    if (*p == '/' || *p == '@') name = p + 1;
  return name;
}

// The path of `name` in the group at `group` ("/tensors" + "k_0_1" -> "/tensors/k_0_1"), and of
// its attribute `name` ("/stats" + "head_dim" -> "/stats@head_dim").
inline std::string child(const char* group, const std::string& name) { return std::string(group) + "/" + name; }
inline std::string attr(const char* object, const std::string& name) { return std::string(object) + "@" + name; }

}  // namespace kvq::h5path
