// `kvcache plan`: how much memory a model's KV cache takes for given context lengths and
// concurrencies, and what fits a budget.
#pragma once

#include <CLI/CLI.hpp>

namespace kvc::cli {

// Registers the `plan` subcommand; it prints the plan (table or --json) to stdout and throws
// kvc::Error on bad input.
void add_plan_command(CLI::App& app);

}  // namespace kvc::cli
