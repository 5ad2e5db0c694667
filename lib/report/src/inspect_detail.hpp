#pragma once
// kvq-inspect's pieces shared by its files (private to lib/report): inspect.cpp (calibration,
// allocation and comparison views) and inspect_probe.cpp (probe files and vLLM TurboQuant views).
#include <nlohmann/json.hpp>

#include <cstdio>
#include <functional>
#include <string>
#include <vector>

#include "kvq/io/alloc_file.hpp"
#include "kvq/report/inspect.hpp"
#include "kvq/report/table.hpp"

namespace kvq::report::detail {

std::string base_name(const std::string& p);
std::string file_stem(const std::string& p);  // "runs/bg2.kvqalloc.h5" -> "bg2"
std::string short_hash(const std::string& h);
std::string join_ints(const std::vector<int>& v);
void write_tables(const std::vector<Table>& tables, const std::string& main_path, InspectResult* r);
void write_json(const nlohmann::json& j, const std::string& path, InspectResult* r);
void add_files(InspectResult* r, const std::vector<std::string>& files);

// kvq-probe's JSON rather than an HDF5 file.
bool is_probe_file(const std::string& path);
// kvq-inspect P.kvqprobe.json: the summary (emit), --json, --csv, --plots (dir: "" or "DIR/").
InspectResult inspect_probe(const InspectOptions& o, const std::function<void(const std::string&)>& emit,
                            const std::string& dir);

// vllm-turboquant allocations: whether any head is one, the summary lines, summary.vllm_turboquant.
bool has_vllm_tq(const AllocFile& a);
std::string vllm_tq_text(const AllocFile& a);
nlohmann::json vllm_tq_json(const AllocFile& a);

}  // namespace kvq::report::detail
