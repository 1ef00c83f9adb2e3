// `kvcache bench`: prefill and decode speed against the memory-bandwidth limit.
#include <iostream>

#include "base/error.h"
#include "bench/decode_bench.h"
#include "cli/commands.h"
#include "cli/model_source.h"

namespace kvc::cli {

void add_bench_command(CLI::App& app) {
  auto o = std::make_shared<bench::DecodeBenchOptions>();
  auto dtypes =
      std::make_shared<std::vector<std::string>>(std::vector<std::string>{"f32", "f16", "q8_0"});
  CLI::App* cmd = app.add_subcommand(
      "bench",
      "Prefill/decode tokens/s of synthetic models and decode as a fraction of the "
      "measured memory bandwidth");
  cmd->add_option("--models", o->presets, "Synthetic presets")
      ->delimiter(',')
      ->capture_default_str();
  cmd->add_option("--dtypes", *dtypes, "Weight types")->delimiter(',')->capture_default_str();
  cmd->add_option("--threads", o->threads, "Thread counts")->delimiter(',')->capture_default_str();
  cmd->add_option("--prompt-tokens", o->prompt_tokens, "Prompt length for prefill")
      ->capture_default_str();
  cmd->add_option("--decode-tokens", o->decode_tokens, "Tokens to decode")->capture_default_str();
  auto bandwidth_mib = std::make_shared<size_t>(o->bandwidth_bytes >> 20);
  cmd->add_option("--bandwidth-mib", *bandwidth_mib,
                  "Array size for the bandwidth measurement (well above the L3 cache)")
      ->capture_default_str();
  cmd->callback([o, dtypes, bandwidth_mib] {
    if (*bandwidth_mib < 1) fail("--bandwidth-mib must be at least 1");
    o->bandwidth_bytes = *bandwidth_mib << 20;
    o->dtypes.clear();
    for (const auto& name : *dtypes) {
      const auto t = parse_dtype(name);
      if (!t || *t == DType::BF16) fail("--dtypes: '{}' is not one of f32, f16, q8_0, q4_0", name);
      o->dtypes.push_back(*t);
    }
    if (o->prompt_tokens < 1 || o->decode_tokens < 1) fail("token counts must be positive");
    o->model_path = ensure_synthetic_model;
    bench::run_decode_bench(*o, std::cout);
  });
}

}  // namespace kvc::cli
