// `kvcache bench`: prefill and decode speed against the memory-bandwidth limit.
#include <iostream>

#include "base/error.h"
#include "bench/cache_bench.h"
#include "bench/decode_bench.h"
#include "bench/kv_dtype_bench.h"
#include "bench/model_bench.h"
#include "bench/tier_bench.h"
#include "bench/workload_bench.h"
#include "cli/cli_options.h"
#include "cli/commands.h"
#include "cli/model_source.h"

namespace kvc::cli {

void add_bench_command(CLI::App& app) {
  auto o = std::make_shared<bench::DecodeBenchOptions>();
  auto m = std::make_shared<bench::ModelBenchOptions>();
  auto dtypes =
      std::make_shared<std::vector<std::string>>(std::vector<std::string>{"f32", "f16", "q8_0"});
  auto prompts = std::make_shared<std::vector<int>>();
  auto gens = std::make_shared<std::vector<int>>();
  CLI::App* cmd = app.add_subcommand(
      "bench",
      "With -m: a model's prefill and decode tokens/s, shaped like llama-bench. Without: "
      "prefill/decode tokens/s of synthetic models and decode as a fraction of the measured "
      "memory bandwidth");
  cmd->add_option("-m,--model", m->model_path, "GGUF model (llama-bench's tests on it)");
  cmd->add_option("-p,--prompt-tokens", *prompts,
                  "Prompt lengths: one prefill test each (default 512; without -m the prefill "
                  "length, default 128)")
      ->delimiter(',');
  cmd->add_option("-n,--decode-tokens", *gens,
                  "Generated lengths: one decode test each (default 128; without -m the decode "
                  "length, default 32)")
      ->delimiter(',');
  cmd->add_option("-d,--depth", m->n_depth, "Tokens already in the KV cache before each test")
      ->delimiter(',')
      ->capture_default_str();
  cmd->add_option("-t,--threads", o->threads,
                  "Thread counts (default: every core with -m, else 1,2)")
      ->delimiter(',');
  cmd->add_option("-r,--repetitions", m->repetitions,
                  "Repetitions of each test (default 5; without -m the decode runs of each row, "
                  "default 3)");
  cmd->add_option("--npl", m->n_parallel,
                  "Sequences decoding together after one shared -p prompt (-m; also -npl)")
      ->delimiter(',')
      ->capture_default_str();
  cmd->add_flag("--json", m->json, "A JSON array shaped like llama-bench -o json (-m)");
  auto mmap = std::make_shared<bool>(false);
  add_mmap_option(*cmd, *mmap);
  cmd->add_option("--models", o->presets, "Synthetic presets")
      ->delimiter(',')
      ->capture_default_str();
  cmd->add_option("--dtypes", *dtypes, "Weight types")->delimiter(',')->capture_default_str();
  auto kv_dtypes = std::make_shared<KvDtypeArgs>();
  add_kv_dtype_options(*cmd, *kv_dtypes, "f16");
  auto bandwidth_mib = std::make_shared<size_t>(o->bandwidth_bytes >> 20);
  cmd->add_option("--bandwidth-mib", *bandwidth_mib,
                  "Array size for the bandwidth measurement (well above the L3 cache)")
      ->capture_default_str();
  cmd->callback([o, m, dtypes, prompts, gens, kv_dtypes, bandwidth_mib, mmap, cmd] {
    if (!cmd->get_subcommands().empty()) return;
    const KvDtypes kv = resolve_kv_dtypes(*kv_dtypes, DType::F16, true);
    o->kv_k_dtype = m->kv_k_dtype = kv.k;
    o->kv_v_dtype = m->kv_v_dtype = kv.v;
    o->residency = m->residency = model_residency(*mmap);
    if (!m->model_path.empty()) {
      if (!prompts->empty()) m->n_prompt = *prompts;
      if (!gens->empty()) m->n_gen = *gens;
      if (cmd->count("--threads") > 0) m->threads = o->threads;
      bench::run_model_bench(*m, std::cout);
      return;
    }
    if (prompts->size() > 1 || gens->size() > 1) fail("lists of -p and -n need -m");
    if (!prompts->empty()) o->prompt_tokens = prompts->front();
    if (!gens->empty()) o->decode_tokens = gens->front();
    if (*bandwidth_mib < 1) fail("--bandwidth-mib must be at least 1");
    o->bandwidth_bytes = *bandwidth_mib << 20;
    o->dtypes.clear();
    for (const auto& name : *dtypes) {
      const auto t = parse_dtype(name);
      if (!t || *t == DType::BF16) fail("--dtypes: '{}' is not one of f32, f16, q8_0, q4_0", name);
      o->dtypes.push_back(*t);
    }
    if (o->prompt_tokens < 1 || o->decode_tokens < 1) fail("token counts must be positive");
    if (cmd->count("--repetitions") > 0) o->runs = m->repetitions;
    if (o->runs < 1) fail("-r must be at least 1");
    o->model_path = ensure_synthetic_model;
    bench::run_decode_bench(*o, std::cout);
  });
  cmd->require_subcommand(0, 1);

  auto index = std::make_shared<bench::PrefixIndexBenchOptions>();
  CLI::App* index_cmd = cmd->add_subcommand(
      "prefix-index", "Match+insert operations/s on an index of a million cached tokens");
  index_cmd->add_option("--cached-tokens", index->cached_tokens, "Tokens in the index")
      ->capture_default_str();
  index_cmd->add_option("--block-tokens", index->block_tokens, "Tokens per block")
      ->capture_default_str();
  index_cmd->add_option("--operations", index->operations, "Timed operations")
      ->capture_default_str();
  index_cmd->callback([index] { bench::run_prefix_index_bench(*index, std::cout); });

  auto waste = std::make_shared<bench::KvWasteBenchOptions>();
  CLI::App* waste_cmd = cmd->add_subcommand(
      "kv-waste", "KV bytes allocated but holding no token, for variable-length sequences");
  waste_cmd->add_option("--sequences", waste->sequences, "Sequences")->capture_default_str();
  waste_cmd->add_option("--min-tokens", waste->min_tokens, "Shortest")->capture_default_str();
  waste_cmd->add_option("--max-tokens", waste->max_tokens, "Longest")->capture_default_str();
  waste_cmd->callback([waste] {
    if (waste->min_tokens < 1 || waste->max_tokens < waste->min_tokens) {
      fail("need 1 <= --min-tokens <= --max-tokens");
    }
    bench::run_kv_waste_bench(*waste, std::cout);
  });

  auto shared = std::make_shared<bench::SharedPrefixBenchOptions>();
  CLI::App* shared_cmd = cmd->add_subcommand(
      "shared-prefix", "Prefill time of prompts sharing a preamble, prefix cache on vs off");
  shared_cmd->add_option("-m,--model", shared->model_path, "GGUF model")->required();
  shared_cmd->add_option("--prompts", shared->prompts, "Prompts")->capture_default_str();
  shared_cmd->add_option("--preamble-tokens", shared->preamble_tokens, "Shared preamble")
      ->capture_default_str();
  shared_cmd->add_option("--question-tokens", shared->question_tokens, "Distinct tail")
      ->capture_default_str();
  shared_cmd->add_option("-t,--threads", shared->threads, "Threads")->capture_default_str();
  shared_cmd->callback([shared] { bench::run_shared_prefix_bench(*shared, std::cout); });

  auto wl = std::make_shared<bench::WorkloadBenchOptions>();
  auto wl_preset = std::make_shared<std::string>();
  CLI::App* wl_cmd = cmd->add_subcommand(
      "workload",
      "Serving workloads through the engine, prefix cache on vs off: TTFT p50/p99 "
      "and throughput ratios");
  wl_cmd->add_option("-m,--model", wl->model_path, "GGUF model");
  wl_cmd->add_option("--preset", *wl_preset, "Synthetic preset instead of -m (e.g. 110m)");
  wl_cmd->add_option("--workloads", wl->workloads, "Which workloads")
      ->delimiter(',')
      ->capture_default_str();
  wl_cmd->add_option("--users", wl->users, "Concurrent users")->capture_default_str();
  wl_cmd->add_option("--system-prompt-tokens", wl->system_prompt_tokens, "Shared prefix")
      ->capture_default_str();
  wl_cmd->add_option("--output-tokens", wl->output_tokens, "Tokens per answer")
      ->capture_default_str();
  wl_cmd->add_option("--sessions", wl->sessions, "Multi-turn sessions")->capture_default_str();
  wl_cmd->add_option("--turns", wl->turns, "Turns per session")->capture_default_str();
  wl_cmd->add_option("--turn-tokens", wl->turn_tokens, "New user tokens per turn")
      ->capture_default_str();
  wl_cmd->add_option("--question-tokens", wl->question_tokens, "Tokens of each user's question")
      ->capture_default_str();
  wl_cmd->add_option("-t,--threads", wl->threads, "Threads")->capture_default_str();
  wl_cmd->add_option("--seed", wl->seed, "Workload seed")->capture_default_str();
  wl_cmd->add_flag("--json", wl->json, "One JSON object per workload");
  wl_cmd->callback([wl, wl_preset] {
    if (wl->model_path.empty() == wl_preset->empty()) fail("give exactly one of -m and --preset");
    if (!wl_preset->empty()) wl->model_path = ensure_synthetic_model(*wl_preset, DType::F32);
    if (wl->users < 1 || wl->sessions < 1 || wl->turns < 1 || wl->output_tokens < 1) {
      fail("users, sessions, turns and output tokens must be positive");
    }
    bench::run_workload_bench(*wl, std::cout);
  });

  auto kvd = std::make_shared<bench::KvDtypeBenchOptions>();
  auto kvd_types = std::make_shared<std::vector<std::string>>(
      std::vector<std::string>{"q8_0", "q8_0/q4_0", "q4_0"});
  CLI::App* kvd_cmd = cmd->add_subcommand(
      "kv-dtypes",
      "Memory and accuracy of each KV storage type against f16, on text the model samples");
  kvd_cmd->add_option("-m,--model", kvd->model_path, "GGUF model")->required();
  kvd_cmd->add_option("--types", *kvd_types, "KV types to compare, K/V or one type for both")
      ->delimiter(',')
      ->capture_default_str();
  kvd_cmd->add_option("--tokens", kvd->tokens, "Tokens of sampled text")->capture_default_str();
  kvd_cmd->add_option("--seed", kvd->seed, "Sampling seed")->capture_default_str();
  kvd_cmd->add_option("-c,--ctx-size", kvd->context, "Perplexity chunk")->capture_default_str();
  kvd_cmd->add_option("-t,--threads", kvd->threads, "Threads")->capture_default_str();
  kvd_cmd->add_option("--save-text", kvd->save_text, "Write the sampled text to this file");
  kvd_cmd->add_flag("--json", kvd->json, "One JSON document");
  kvd_cmd->callback([kvd, kvd_types] {
    kvd->types.clear();
    for (const std::string& t : *kvd_types) {
      const size_t slash = t.find('/');
      const std::string k = t.substr(0, slash);
      const std::string v = slash == std::string::npos ? k : t.substr(slash + 1);
      kvd->types.emplace_back(parse_pool_kv_dtype(k, "--types"), parse_pool_kv_dtype(v, "--types"));
    }
    if (kvd->tokens < 2) fail("--tokens must be at least 2");
    bench::run_kv_dtype_bench(*kvd, std::cout);
  });

  auto tiers = std::make_shared<bench::TierBenchOptions>();
  auto tiers_preset = std::make_shared<std::string>();
  CLI::App* tiers_cmd = cmd->add_subcommand(
      "tiers", "Drop, keep-all and the cost model side by side on workloads 4x the pool");
  tiers_cmd->add_option("-m,--model", tiers->model_path, "GGUF model");
  tiers_cmd->add_option("--preset", *tiers_preset, "Synthetic preset instead of -m (e.g. 110m)");
  tiers_cmd->add_option("--workloads", tiers->workloads, "Which workloads")
      ->delimiter(',')
      ->capture_default_str();
  tiers_cmd
      ->add_option("--scale", tiers->scale,
                   "Multiplies users, questions and prompts (1: 32 users, 64 questions, "
                   "2000 prompts)")
      ->capture_default_str();
  tiers_cmd->add_option("-t,--threads", tiers->threads, "Threads")->capture_default_str();
  tiers_cmd->add_option("--seed", tiers->seed, "Workload seed")->capture_default_str();
  tiers_cmd
      ->add_option("--repeat", tiers->repeat,
                   "Runs of each policy, in varied order; TTFT p50/p99 are their medians")
      ->capture_default_str();
  tiers_cmd->add_flag("--json", tiers->json, "One JSON document");
  tiers_cmd->callback([tiers, tiers_preset] {
    if (tiers->model_path.empty() == tiers_preset->empty()) {
      fail("give exactly one of -m and --preset");
    }
    if (!tiers_preset->empty()) {
      tiers->model_path = ensure_synthetic_model(*tiers_preset, DType::F32);
    }
    if (!(tiers->scale > 0)) fail("--scale must be positive");
    if (tiers->repeat < 1) fail("--repeat must be at least 1");
    bench::run_tier_bench(*tiers, std::cout);
  });
}

}  // namespace kvc::cli
