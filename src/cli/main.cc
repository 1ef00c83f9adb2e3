// The `kvcache` program: one binary, one subcommand per job.
#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

#include <cstdio>
#include <exception>

#include "base/error.h"
#include "cli/cli_options.h"
#include "cli/commands.h"
#include "cli/plan_command.h"

int main(int argc, char** argv) {
  CLI::App app{"kvcache: a KV-cache-centred engine for Llama-family language models"};
  app.require_subcommand(1);
  app.set_version_flag("--version", "kvcache 0.1.0");
  // stdout carries the program's output (generated text, tables); logs go to stderr.
  spdlog::set_default_logger(spdlog::stderr_color_mt("kvcache"));
  spdlog::set_pattern("[%H:%M:%S.%e] %^%l%$ %v");
  kvc::cli::add_serve_command(app);
  kvc::cli::add_run_command(app);
  kvc::cli::add_inspect_command(app);
  kvc::cli::add_make_model_command(app);
  kvc::cli::add_bench_command(app);
  kvc::cli::add_plan_command(app);
  kvc::cli::add_perplexity_command(app);
  try {
    std::vector<char*> args = kvc::cli::expand_llama_cpp_aliases(argc, argv);
    app.parse(static_cast<int>(args.size()), args.data());
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  } catch (const kvc::Error& e) {
    std::fprintf(stderr, "kvcache: error: %s\n", e.what());
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "kvcache: internal error: %s\n", e.what());
    return 2;
  }
  return 0;
}
