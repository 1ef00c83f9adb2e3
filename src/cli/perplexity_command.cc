// `kvcache perplexity`: a model's perplexity over a text file, as llama-perplexity reports it,
// and its distributions compared with a saved reference run (KL divergence, top-1 agreement).
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>

#include "base/error.h"
#include "base/kernels.h"
#include "cli/cli_options.h"
#include "cli/commands.h"
#include "kv/memory_plan.h"
#include "model/kl_divergence.h"
#include "model/llama_model.h"
#include "model/perplexity.h"
#include "model/tokenizer.h"

namespace kvc::cli {
namespace {

struct PerplexityArgs {
  std::string model;
  std::string text_file;
  int context = 512;
  int chunks = -1;
  int threads = 0;
  int batch = 512;
  KvDtypeArgs kv_dtypes;
  bool json = false;
  bool mmap = false;
  std::string kl_base;
  bool kl_divergence = false;
};

std::string read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) fail("-f {}: cannot be read", path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// "perplexity: chunk 3/40, ppl 4.1234" rewritten in place on a terminal, a line per quarter of
// the chunks otherwise.
model::ProgressFn chunk_progress() {
  const bool tty = isatty(STDERR_FILENO) != 0;
  return [tty](size_t done, size_t total, double ppl) {
    if (!tty && done != total && done % std::max<size_t>(1, total / 4) != 0) return;
    std::fprintf(stderr, "%sperplexity: chunk %zu/%zu, ppl %.4f%s", tty ? "\r" : "", done, total,
                 ppl, done == total || !tty ? "\n" : "");
    std::fflush(stderr);
  };
}

void run_perplexity(const PerplexityArgs& a) {
  if (a.kl_divergence && a.kl_base.empty()) {
    fail("--kl-divergence compares with a saved run: give --kl-divergence-base FILE too");
  }
  if (a.chunks == 0 || a.chunks < -1) fail("--chunks must be positive, got {}", a.chunks);
  if (a.batch < 1) fail("--batch must be positive, got {}", a.batch);
  const KvDtypes kv = resolve_kv_dtypes(a.kv_dtypes, DType::F16, true);
  const std::string text = read_text(a.text_file);
  if (text.empty()) fail("-f {}: the text is empty", a.text_file);
  const auto model = model::LlamaModel::load(a.model, model_residency(a.mmap));
  const auto tokenizer = model::Tokenizer::from_gguf(model->file());
  const std::vector<int32_t> tokens = tokenizer.encode(text, true);
  const auto& c = model->config();

  model::PerplexityOptions o;
  o.context = a.context;
  o.chunks = a.chunks;
  o.k_dtype = kv.k;
  o.v_dtype = kv.v;
  o.batch_tokens = a.batch;
  if (tokenizer.add_bos() && tokenizer.bos_id() >= 0) o.bos_id = tokenizer.bos_id();
  const int threads = thread_count(a.threads);
  ThreadPool pool(threads);
  std::fprintf(stderr, "perplexity: %s, %zu tokens, context %d, KV %s, %d threads (%s)\n",
               a.model.c_str(), tokens.size(), a.context, kv::kv_dtypes_name(kv.k, kv.v).c_str(),
               threads, kernels::kernels_name().c_str());

  const auto n_vocab = static_cast<uint32_t>(c.n_vocab);
  const auto context = static_cast<uint32_t>(a.context);
  std::unique_ptr<model::LogProbWriter> writer;
  std::unique_ptr<model::KlComparison> compare;
  model::LogProbSink sink;
  if (a.kl_divergence) {
    compare = std::make_unique<model::KlComparison>(a.kl_base, n_vocab, context);
    sink = [&](std::span<const float> lp, int32_t next) { compare->add(lp, next); };
  } else if (!a.kl_base.empty()) {
    writer = std::make_unique<model::LogProbWriter>(a.kl_base, n_vocab, context);
    sink = [&](std::span<const float> lp, int32_t next) { writer->add(lp, next); };
  }
  const model::PerplexityResult r =
      model::perplexity(*model, pool, tokens, o, sink, chunk_progress());
  std::optional<model::KlStats> kl;
  if (writer) writer->finish();
  if (compare) kl = compare->finish();

  if (a.json) {
    nlohmann::ordered_json out;
    out["model"] = a.model;
    out["tokens"] = tokens.size();
    out["context"] = a.context;
    out["chunks"] = r.chunks;
    out["scored_tokens"] = r.scored_tokens;
    out["kv_dtype_k"] = dtype_name(kv.k);
    out["kv_dtype_v"] = dtype_name(kv.v);
    out["ppl"] = r.ppl;
    out["ppl_error"] = r.ppl_error;
    out["mean_nll"] = r.mean_nll;
    if (kl) {
      out["kl_divergence"] = {{"tokens", kl->tokens},
                              {"mean", kl->mean_kl},
                              {"p99", kl->p99_kl},
                              {"max", kl->max_kl},
                              {"top1_agreement", kl->top1_agreement},
                              {"base_ppl", kl->base_ppl},
                              {"ppl_ratio", kl->ppl_ratio}};
    }
    std::cout << out.dump(2) << "\n";
    return;
  }
  std::printf("chunks %zu x %d tokens, %zu scored (each chunk's second half), KV %s\n", r.chunks,
              a.context, r.scored_tokens, kv::kv_dtypes_name(kv.k, kv.v).c_str());
  std::printf("Final estimate: PPL = %.4f +/- %.5f\n", r.ppl, r.ppl_error);
  if (writer)
    std::printf("saved the log-probabilities of %zu tokens to %s\n", r.scored_tokens,
                a.kl_base.c_str());
  if (kl) {
    std::printf("base PPL = %.4f, PPL ratio = %.6f (%+.3f%%)\n", kl->base_ppl, kl->ppl_ratio,
                (kl->ppl_ratio - 1.0) * 100.0);
    std::printf("KL divergence: mean %.6f, 99th percentile %.6f, max %.6f\n", kl->mean_kl,
                kl->p99_kl, kl->max_kl);
    std::printf("top-1 agreement: %.3f%% of %llu tokens\n", kl->top1_agreement * 100.0,
                static_cast<unsigned long long>(kl->tokens));
  }
}

}  // namespace

void add_perplexity_command(CLI::App& app) {
  auto args = std::make_shared<PerplexityArgs>();
  CLI::App* cmd = app.add_subcommand(
      "perplexity", "Perplexity of a model over a text, scored as llama-perplexity scores it");
  cmd->add_option("-m,--model", args->model, "GGUF model")->required();
  add_mmap_option(*cmd, args->mmap);
  cmd->add_option("-f,--file", args->text_file, "Text file to score")->required();
  cmd->add_option("-c,--ctx-size", args->context, "Tokens per chunk")->capture_default_str();
  cmd->add_option("--chunks", args->chunks, "Chunks to score (default: all)");
  cmd->add_option("-t,--threads", args->threads, "Threads (default: all cores)");
  cmd->add_option("-b,--batch", args->batch, "Tokens per forward pass")->capture_default_str();
  add_kv_dtype_options(*cmd, args->kv_dtypes, "f16");
  cmd->add_flag("--json", args->json, "Print the figures as JSON");
  cmd->add_option("--kl-divergence-base", args->kl_base,
                  "Save every scored token's log-probabilities to FILE (with --kl-divergence: "
                  "compare with FILE instead)");
  cmd->add_flag("--kl-divergence", args->kl_divergence,
                "Compare with --kl-divergence-base: KL divergence, top-1 agreement, PPL ratio");
  cmd->callback([args] { run_perplexity(*args); });
}

}  // namespace kvc::cli
