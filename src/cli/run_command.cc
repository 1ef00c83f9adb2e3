// `kvcache run`: generate text from a prompt, streaming it to stdout.
#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>

#include "base/byte_size.h"
#include "base/error.h"
#include "base/kernels.h"
#include "base/utf8.h"
#include "cli/cli_options.h"
#include "cli/commands.h"
#include "cli/engine_start.h"
#include "cli/model_source.h"
#include "cli/startup_log.h"
#include "engine/completion.h"
#include "engine/generation_options.h"
#include "kv/cache_namespace.h"
#include "kv/memory_plan.h"
#include "kv/prefix_index.h"
#include "model/llama_model.h"
#include "model/model_fingerprint.h"
#include "model/tokenizer.h"

namespace kvc::cli {

namespace {

struct RunArgs {
  TierArgs tiers;
  std::string model;
  bool mmap = false;
  std::string prompt = "Once upon a time";
  std::string prompt_file;
  int n_predict = 128;
  float temperature = 0.8f;
  int top_k = 40;
  float top_p = 0.95f;
  float min_p = 0.05f;
  float repeat_penalty = 1.0f;
  int repeat_last_n = 64;
  int64_t seed = -1;
  int threads = 0;
  std::string kv_memory;
  int block_tokens = 0;
  KvDtypeArgs kv_dtypes;
  int prefill_chunk = 512;
  bool ignore_eos = false;
  std::string prompts_file;
  bool no_prefix_cache = false;
};

// One prompt of a --prompts file: a plain line, or a JSON object with "prompt" and an
// optional "namespace" (a tenant salt: prompts in different namespaces share nothing).
struct PromptLine {
  std::string prompt;
  std::string ns;
};

std::vector<PromptLine> read_prompts(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) fail("cannot read prompts file '{}'", path);
  std::vector<PromptLine> out;
  std::string line;
  for (int number = 1; std::getline(in, line); ++number) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.empty()) continue;
    if (line.front() != '{') {
      out.push_back({line, ""});
      continue;
    }
    const auto j = nlohmann::json::parse(line, nullptr, false);
    if (j.is_discarded() || !j.is_object()) fail("{}:{}: not a JSON object", path, number);
    if (!j.contains("prompt") || !j["prompt"].is_string()) {
      fail("{}:{}: \"prompt\" must be a string", path, number);
    }
    PromptLine p{j["prompt"].get<std::string>(), ""};
    if (j.contains("namespace")) {
      if (!j["namespace"].is_string()) fail("{}:{}: \"namespace\" must be a string", path, number);
      p.ns = j["namespace"].get<std::string>();
    }
    out.push_back(std::move(p));
  }
  if (out.empty()) fail("prompts file '{}' has no prompts", path);
  return out;
}

// Writes token text as it arrives, holding back bytes of an unfinished UTF-8 character.
class TextStream {
 public:
  void write(const std::string& bytes) {
    pending_ += bytes;
    const size_t n = utf8_complete_prefix(pending_);
    std::fwrite(pending_.data(), 1, n, stdout);
    std::fflush(stdout);
    pending_.erase(0, n);
  }
  void finish() {
    std::fwrite(pending_.data(), 1, pending_.size(), stdout);
    std::fputc('\n', stdout);
    std::fflush(stdout);
    pending_.clear();
  }

 private:
  std::string pending_;
};

void run(const RunArgs& a) {
  const std::string path = resolve_model(a.model);
  const auto model = model::LlamaModel::load(path, model_residency(a.mmap));
  const auto tokenizer = model::Tokenizer::from_gguf(model->file());

  std::vector<PromptLine> prompts;
  if (!a.prompts_file.empty()) {
    prompts = read_prompts(a.prompts_file);
  } else if (!a.prompt_file.empty()) {
    std::ifstream in(a.prompt_file, std::ios::binary);
    if (!in) fail("cannot read prompt file '{}'", a.prompt_file);
    std::stringstream ss;
    ss << in.rdbuf();
    prompts.push_back({ss.str(), ""});
  } else {
    prompts.push_back({a.prompt, ""});
  }

  const KvDtypes kv_dtypes = resolve_kv_dtypes(a.kv_dtypes, DType::F16, true);
  // By default (0) the engine's: one full context (or window) within a bound.
  const uint64_t kv_bytes = a.kv_memory.empty() ? 0 : parse_byte_size(a.kv_memory);
  const int threads = thread_count(a.threads);
  // One sequence at a time, through the same engine `serve` uses.
  engine::EngineOptions eo;
  eo.kv_memory_bytes = kv_bytes;
  apply_tier_options(a.tiers, eo);
  eo.block_tokens = a.block_tokens;
  eo.kv_k_dtype = kv_dtypes.k;
  eo.kv_v_dtype = kv_dtypes.v;
  eo.threads = threads;
  eo.max_running = 1;
  eo.max_batch_tokens = a.prefill_chunk;
  eo.prefix_cache = !a.no_prefix_cache;
  const std::unique_ptr<engine::Engine> engine_holder =
      start_engine(*model, tokenizer, eo, a.kv_memory);
  engine::Engine& engine = *engine_holder;

  log_model_and_pool(path, *model, engine);
  spdlog::info("{} threads, {} kernels", threads, kernels::kernels_name());

  engine::GenerationOptions gen;
  gen.max_tokens = a.n_predict;
  gen.sampling.temperature = a.temperature;
  gen.sampling.top_k = a.top_k;
  gen.sampling.top_p = a.top_p;
  gen.sampling.min_p = a.min_p;
  gen.sampling.repeat_penalty = a.repeat_penalty;
  gen.sampling.repeat_last_n = a.repeat_last_n;
  gen.sampling.seed = a.seed >= 0 ? static_cast<uint64_t>(a.seed) : engine::fresh_seed();
  gen.ignore_eos = a.ignore_eos;
  if (a.seed < 0) spdlog::info("seed {} (pass --seed to repeat this run)", gen.sampling.seed);

  const auto rate = [](size_t n, double ms) { return ms > 0 ? n * 1000.0 / ms : 0.0; };
  for (const PromptLine& p : prompts) {
    std::vector<int32_t> tokens = tokenizer.encode(p.prompt, tokenizer.add_bos());
    if (tokens.empty()) tokens.push_back(tokenizer.bos_id());
    gen.ns = engine.namespace_for(p.ns);
    // Every prompt samples with the same seed, as separate runs would.
    engine::Request request = engine::make_requests({tokens}, 1, gen).front();
    TextStream out;
    out.write(tokenizer.decode(tokens));
    const engine::Completion c =
        engine::complete(engine, request, [&](const engine::TokenEvent& e) { out.write(e.text); });
    out.finish();
    if (!c.error.empty()) fail("{}", c.error);
    const engine::RequestStats& s = c.stats;
    const double now = kv::steady_clock_ms()();
    if (prompts.size() > 1) {
      std::fprintf(stderr, "prompt_tokens=%zu cached_tokens=%zu miss=%s ttft_ms=%.2f\n",
                   s.prompt_tokens, s.cached_tokens, s.miss.to_string(now).c_str(), s.ttft_ms);
      continue;
    }
    const size_t decode_steps = s.generated_tokens > 0 ? s.generated_tokens - 1 : 0;
    std::fprintf(stderr, "prompt: %zu tokens (%zu cached, miss=%s) in %.1f ms (%.1f tokens/s)\n",
                 s.prompt_tokens, s.cached_tokens, s.miss.to_string(now).c_str(), s.prefill_ms,
                 rate(s.prompt_tokens - s.cached_tokens, s.prefill_ms));
    std::fprintf(stderr, "decode: %zu tokens, %zu steps in %.1f ms (%.1f tokens/s), finish: %s\n",
                 s.generated_tokens, decode_steps, s.decode_ms, rate(decode_steps, s.decode_ms),
                 engine::finish_reason_name(s.finish_reason));
    const size_t used_tokens = s.prompt_tokens + decode_steps;
    // Under a sliding window the windowed layers keep only the last window's tokens.
    const kv::KvGeometry& g = engine.geometry();
    kv::PlanOptions po;
    po.k_dtype = g.k_dtype;
    po.v_dtype = g.v_dtype;
    po.block_tokens = g.block_tokens;
    po.contexts = {used_tokens};
    const kv::RequestFigures f =
        kv::plan_memory(kv::AttentionGeometry::from_kv_geometry(g), po).requests.front();
    const int window = std::max(g.window_tokens, g.split_window);
    const std::string held =
        window > 0 && used_tokens > static_cast<size_t>(window)
            ? fmt::format("{} tokens, the windowed layers' last {}", used_tokens, window)
            : fmt::format("{} tokens", used_tokens);
    std::fprintf(stderr, "KV used: %zu blocks = %zu bytes (%s: %zu bytes of keys and values)\n",
                 s.kv_blocks, s.kv_blocks * g.bytes_per_block(), held.c_str(),
                 static_cast<size_t>(f.exact_bytes));
  }
}

}  // namespace

void add_run_command(CLI::App& app) {
  auto args = std::make_shared<RunArgs>();
  CLI::App* cmd = app.add_subcommand("run", "Generate text from a prompt, streaming to stdout");
  cmd->add_option("-m,--model", args->model, "GGUF model file (default: the tiny demo model)");
  add_mmap_option(*cmd, args->mmap);
  cmd->add_option("-p,--prompt", args->prompt, "Prompt text")->capture_default_str();
  cmd->add_option("-f,--file", args->prompt_file, "Read the prompt from a file");
  cmd->add_option("-n,--n-predict", args->n_predict, "Tokens to generate")->capture_default_str();
  cmd->add_option("--temp,--temperature", args->temperature, "Temperature; 0 = greedy")
      ->capture_default_str();
  cmd->add_option("--top-k", args->top_k, "Top-k; 0 disables")->capture_default_str();
  cmd->add_option("--top-p", args->top_p, "Top-p; 1 disables")->capture_default_str();
  cmd->add_option("--min-p", args->min_p, "Min-p; 0 disables")->capture_default_str();
  cmd->add_option("--repeat-penalty", args->repeat_penalty, "Repetition penalty; 1 disables")
      ->capture_default_str();
  cmd->add_option("--repeat-last-n", args->repeat_last_n, "Tokens the penalty looks back over")
      ->capture_default_str();
  cmd->add_option("-s,--seed", args->seed, "Sampling seed (default: random, printed)");
  cmd->add_option("-t,--threads", args->threads, "Threads (default: all cores)");
  add_tier_options(*cmd, args->tiers);
  cmd->add_option("--kv-memory", args->kv_memory,
                  "KV pool size, e.g. 256MiB (default: one full context)");
  cmd->add_option(
         "--block-tokens", args->block_tokens,
         "Tokens per KV block (default 16; 32, the per-channel key group, with quantised keys)")
      ->capture_default_str();
  add_kv_dtype_options(*cmd, args->kv_dtypes, "f16");
  cmd->add_option("--prefill-chunk", args->prefill_chunk, "Prompt tokens per forward pass")
      ->capture_default_str();
  cmd->add_flag("--ignore-eos", args->ignore_eos, "Keep generating after end-of-sequence");
  cmd->add_option("--prompts", args->prompts_file,
                  "Run each prompt of a file (lines, or JSONL with \"prompt\" and optional "
                  "\"namespace\") through one cache; one stats line per prompt on stderr");
  cmd->add_flag("--no-prefix-cache", args->no_prefix_cache,
                "Never share cached prefixes (for comparisons)");
  cmd->callback([args] { run(*args); });
}

}  // namespace kvc::cli
