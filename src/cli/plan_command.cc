#include "cli/plan_command.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <iostream>
#include <memory>

#include "cli/plan_report.h"
#include "model/model_geometry.h"

namespace kvc::cli {

void add_plan_command(CLI::App& app) {
  auto args = std::make_shared<PlanArgs>();
  CLI::App* cmd = app.add_subcommand(
      "plan", "How much KV memory context lengths and concurrencies take, and what fits a budget");
  // Every value is kept as text so that make_plan can say what is wrong with a bad one.
  cmd->add_option("--model", args->model_path, "GGUF model file (metadata only is read)")
      ->type_name("FILE.gguf");
  cmd->add_option("--config", args->config_path, "Hugging Face config.json")
      ->type_name("FILE.json");
  cmd->add_option("--preset", args->preset,
                  fmt::format("Named model: {}", fmt::join(model::preset_names(), ", ")))
      ->type_name("NAME");
  cmd->add_option("--context", args->contexts,
                  "Context length(s) in tokens, e.g. 8192,131072 or 8k")
      ->delimiter(',')
      ->type_name("N[,N...]");
  cmd->add_option("--concurrency", args->concurrencies,
                  "Requests held at once, e.g. 1,8,32 (default 1)")
      ->delimiter(',')
      ->type_name("N[,N...]");
  add_kv_dtype_options(*cmd, args->kv_dtypes, "f16");
  cmd->add_option(
         "--block-tokens", args->block_tokens,
         "Tokens per KV block (default 16; 32, the per-channel key group, with quantised keys)")
      ->type_name("N")
      ->capture_default_str();
  cmd->add_option("--budget", args->budget, "Memory budget, e.g. 24GiB, 80GB, 512MiB or bytes")
      ->type_name("SIZE");
  cmd->add_option("--weights", args->weights, "Weights are included in or excluded from the budget")
      ->type_name("included|excluded")
      ->capture_default_str();
  cmd->add_option("--weights-dtype", args->weights_dtype,
                  "Weights dtype for --config/--preset (default: the config's torch_dtype, bf16)")
      ->type_name("DTYPE");
  cmd->add_flag("--json", args->json, "Print the plan as JSON, every size in bytes");
  cmd->add_option("--plot", args->plot_path, "Write memory against context length as SVG")
      ->type_name("FILE.svg");
  add_tier_options(*cmd, args->tiers);
  cmd->add_option("--threads", args->threads,
                  "Threads for timing recompute against the tiers (default: every core)");
  cmd->callback([args] { run_plan(*args, std::cout); });
}

}  // namespace kvc::cli
