// The subcommands of the `kvcache` program; each registers itself on the CLI11 app.
#pragma once

#include <CLI/CLI.hpp>

namespace kvc::cli {

void add_run_command(CLI::App& app);
void add_inspect_command(CLI::App& app);
void add_make_model_command(CLI::App& app);
void add_bench_command(CLI::App& app);
void add_serve_command(CLI::App& app);
void add_perplexity_command(CLI::App& app);

}  // namespace kvc::cli
