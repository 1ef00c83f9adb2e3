#include "bench/kv_dtype_bench.h"

#include <algorithm>
#include <fstream>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "base/error.h"
#include "base/thread_pool.h"
#include "kv/kv_geometry.h"
#include "model/kl_divergence.h"
#include "model/llama_model.h"
#include "model/perplexity.h"
#include "model/sampled_text.h"
#include "model/tokenizer.h"

namespace kvc::bench {
namespace {

struct PairResult {
  DType k, v;
  double bytes_ratio = 0.0;
  size_t bytes_per_token = 0;
  double ppl = 0.0, ppl_error = 0.0;
  double mean_kl = 0.0, p99_kl = 0.0, top1 = 0.0;
};

std::string pair_name(DType k, DType v) {
  return k == v ? std::string(dtype_name(k)) : fmt::format("{} / {}", dtype_name(k), dtype_name(v));
}

}  // namespace

void run_kv_dtype_bench(const KvDtypeBenchOptions& options, std::ostream& out) {
  const auto model = model::LlamaModel::load(options.model_path);
  const model::LlamaConfig& c = model->config();
  ThreadPool threads(static_cast<size_t>(std::max(1, options.threads)));
  const auto tokenizer = model::Tokenizer::from_gguf(model->file());
  const int32_t bos = tokenizer.bos_id() >= 0 ? tokenizer.bos_id() : 0;
  const int context = std::min(options.context, c.context_length);
  const std::vector<int32_t> text = model::sample_own_text(
      *model, threads, options.tokens, static_cast<size_t>(context), bos, options.seed);
  if (!options.save_text.empty()) {
    std::ofstream f(options.save_text, std::ios::binary);
    f << tokenizer.decode(text);
    if (!f) fail("cannot write the sampled text to {}", options.save_text);
  }
  model::PerplexityOptions po;
  po.context = context;
  po.bos_id = bos;
  const auto bytes_per_token = [&](DType k, DType v) {
    return c.kv_geometry(k, v, 0).bytes_per_token();
  };
  std::vector<std::vector<float>> base;
  const model::PerplexityResult f16 = model::perplexity(
      *model, threads, text, po,
      [&](std::span<const float> lp, int32_t) { base.emplace_back(lp.begin(), lp.end()); });
  const size_t f16_bytes = bytes_per_token(DType::F16, DType::F16);
  std::vector<PairResult> results;
  for (const auto& [k, v] : options.types) {
    PairResult r{k, v};
    r.bytes_per_token = bytes_per_token(k, v);
    r.bytes_ratio = static_cast<double>(r.bytes_per_token) / static_cast<double>(f16_bytes);
    po.k_dtype = k;
    po.v_dtype = v;
    model::KlAccumulator kl;
    const model::PerplexityResult run = model::perplexity(
        *model, threads, text, po,
        [&](std::span<const float> lp, int32_t next) { kl.add(base.at(kl.tokens()), lp, next); });
    const model::KlStats stats = kl.finish();
    r.ppl = run.ppl;
    r.ppl_error = run.ppl_error;
    r.mean_kl = stats.mean_kl;
    r.p99_kl = stats.p99_kl;
    r.top1 = stats.top1_agreement;
    results.push_back(r);
  }
  if (options.json) {
    nlohmann::json j;
    j["model"] = options.model_path;
    j["sampled_tokens"] = text.size();
    j["scored_tokens"] = f16.scored_tokens;
    j["context"] = context;
    j["seed"] = options.seed;
    j["f16"] = {{"bytes_per_token", f16_bytes}, {"ppl", f16.ppl}, {"ppl_error", f16.ppl_error}};
    for (const PairResult& r : results) {
      j["types"].push_back({{"kv_dtype_k", dtype_name(r.k)},
                            {"kv_dtype_v", dtype_name(r.v)},
                            {"bytes_per_token", r.bytes_per_token},
                            {"bytes_vs_f16", r.bytes_ratio},
                            {"ppl", r.ppl},
                            {"ppl_change", r.ppl / f16.ppl - 1.0},
                            {"mean_kl", r.mean_kl},
                            {"p99_kl", r.p99_kl},
                            {"top1_agreement", r.top1}});
    }
    out << j.dump(2) << "\n";
    return;
  }
  out << fmt::format(
      "{}: {} tokens sampled by the model (temperature 1, seed {}), {} scored in chunks of {}\n\n",
      options.model_path, text.size(), options.seed, f16.scored_tokens, context);
  out << "| KV (K / V) | bytes per token | vs f16 | PPL | PPL change | mean KL | p99 KL | top-1 |\n"
         "|---|---|---|---|---|---|---|---|\n";
  out << fmt::format("| f16 | {} | 1.00x | {:.4f} +/- {:.4f} | | | | |\n", f16_bytes, f16.ppl,
                     f16.ppl_error);
  for (const PairResult& r : results) {
    out << fmt::format("| {} | {} | {:.2f}x | {:.4f} | {:+.2f}% | {:.5f} | {:.4f} | {:.2f}% |\n",
                       pair_name(r.k, r.v), r.bytes_per_token, r.bytes_ratio, r.ppl,
                       100.0 * (r.ppl / f16.ppl - 1.0), r.mean_kl, r.p99_kl, 100.0 * r.top1);
  }
}

}  // namespace kvc::bench
