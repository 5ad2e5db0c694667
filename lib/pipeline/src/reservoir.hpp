#pragma once
// kvq_pipeline's private helpers over a calibration file's records (reservoir.cpp).
#include "kvq/codec/attention.hpp"
#include "kvq/io/calib_file.hpp"

namespace kvq {

// The RoPE the calibration file records (its windows' own), for post-RoPE K and Q.
codec::RopeSpec calib_rope(const CalibProvenance& p);

}  // namespace kvq
