#pragma once
// calib-capture's work: corpus -> windows -> forward with capture points -> calibration file.
#include <cstdint>
#include <string>
#include <vector>

#include "kvq/capture/memory_size.hpp"
#include "kvq/capture/options.hpp"
#include "kvq/capture/ranks.hpp"
#include "kvq/io/calib_file.hpp"

namespace kvq {

// Runs the capture and writes opts.out atomically (and checkpoints). Returns the final file.
// With `ranks` active (under mpirun) the windows are sharded over the ranks: every rank checks that
// its inputs match rank 0's, captures its share (checkpoints in `<out>.rank<k>.partial`), and rank 0
// adds the sums in rank order and writes the one file; ranks other than 0 return an empty file.
// Layout of a sharded run: schemas/calibration-file.md.
CalibFile run_capture(const CaptureOptions& opts, Ranks* ranks = nullptr);

// Exact merge of two calibration files of the same model and convention over disjoint windows.
// Refuses (kvq::Error naming the field) anything that does not match.
CalibFile merge_calib(const CalibFile& a, const std::string& name_a, const CalibFile& b, const std::string& name_b);

}  // namespace kvq
