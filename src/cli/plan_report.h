// `kvcache plan` apart from its command line: checks the arguments, builds the memory plan for
// a model, and renders it as a table, as JSON (every byte figure a plain integer) or as SVG.
#pragma once

#include <cstdint>
#include <ostream>
#include <string>
#include <string_view>
#include <vector>

#include "base/dtype.h"
#include "cli/cli_options.h"
#include "kv/memory_plan.h"
#include "model/model_geometry.h"

namespace kvc::cli {

// The arguments of `kvcache plan` as typed; make_plan checks each and names the bad one.
struct PlanArgs {
  std::string model_path;                  // --model FILE.gguf
  std::string config_path;                 // --config config.json
  std::string preset;                      // --preset NAME
  std::vector<std::string> contexts;       // --context: each "N" or "N,N,..."
  std::vector<std::string> concurrencies;  // --concurrency: as contexts; none means 1
  KvDtypeArgs kv_dtypes;                   // --kv-dtype, --kv-dtype-k, --kv-dtype-v (f16)
  std::string block_tokens;          // --block-tokens; empty: kv::block_tokens_for the key dtype
  std::string budget;                // --budget: a size; empty for none
  std::string weights = "included";  // --weights: included or excluded from the budget
  std::string weights_dtype;         // --weights-dtype: empty for the source's own
  bool json = false;                 // --json
  std::string plot_path;             // --plot FILE.svg; empty for none
  TierArgs tiers;                    // with --model: time recompute against these tiers' loads
  int threads = 0;                   // --threads for that timing; 0: every core
};

struct Plan {
  model::ModelGeometry model;
  kv::PlanOptions options;
  kv::MemoryPlan figures;
};

// A positive count, "8192" or "8k" (k = 1024); throws Error naming `what` otherwise.
uint64_t parse_count(std::string_view text, std::string_view what);
// Every comma-separated count in every item.
std::vector<uint64_t> parse_count_list(const std::vector<std::string>& items,
                                       std::string_view what);
// A KV dtype name: f32, f16/fp16, bf16, q8_0/int8, q4_0/int4.

// Reads the one model source and computes every figure; throws Error on any bad argument.
Plan make_plan(const PlanArgs& args);

std::string render_table(const Plan& plan);
std::string render_json(const Plan& plan);
// Memory against context length, one polyline per concurrency, the budget as a line.
std::string render_svg(const Plan& plan);

// The whole command: the table (or JSON with args.json) to out, the SVG to args.plot_path.
void run_plan(const PlanArgs& args, std::ostream& out);

}  // namespace kvc::cli
