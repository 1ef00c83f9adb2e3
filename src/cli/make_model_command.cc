// `kvcache make-model`: write a synthetic GGUF with a realistic shape and random weights.
#include <spdlog/spdlog.h>

#include "base/byte_size.h"
#include "base/error.h"
#include "cli/commands.h"
#include "cli/model_source.h"
#include "model/synthetic_model.h"

namespace kvc::cli {

namespace {
struct MakeModelArgs {
  std::string preset = "tiny";
  std::string output;
  std::string dtype = "f32";
  int layers = 0;
  int context = 0;
  uint64_t seed = 1;
  std::string rope_freqs;
  std::string arch = "llama";
  int sliding_window = 0;
};
}  // namespace

void add_make_model_command(CLI::App& app) {
  auto a = std::make_shared<MakeModelArgs>();
  CLI::App* cmd = app.add_subcommand(
      "make-model",
      "Write a synthetic Llama GGUF (presets: tiny, small, 110m, tinyllama-1.1b, llama3-8b)");
  cmd->add_option("--preset", a->preset, "Model shape")->capture_default_str();
  cmd->add_option("-o,--output", a->output, "Output GGUF file")->required();
  cmd->add_option("--dtype", a->dtype,
                  "Weight type: f32, f16, q8_0, q4_0, q4_1, q5_0, q5_1, q2_K, q3_K, q4_K, q5_K, "
                  "q6_K, iq4_nl, or llama.cpp's mixes q4_K_M and q5_K_M")
      ->capture_default_str();
  cmd->add_option("--layers", a->layers, "Override the preset's layer count");
  cmd->add_option("--context", a->context,
                  "Override the preset's context length (llama.context_length)");
  cmd->add_option("--seed", a->seed, "Weight seed")->capture_default_str();
  cmd->add_option("--arch", a->arch,
                  "general.architecture: llama, qwen2 (Q/K/V biases, NEOX rope), qwen3 (per-head "
                  "Q/K norms, NEOX rope), phi3 (fused QKV and gate/up, NEOX rope) or gemma2 (post "
                  "norms, GELU, soft-capping)")
      ->capture_default_str()
      ->check(CLI::IsMember({"llama", "qwen2", "qwen3", "phi3", "gemma2"}));
  cmd->add_option(
      "--sliding-window", a->sliding_window,
      "attention.sliding_window for llama (Mistral style), phi3 and gemma2 (default: none for "
      "llama, the whole context for the others)");
  cmd->add_option("--rope-freqs", a->rope_freqs,
                  "Write per-pair rope factors: llama3.1 (Llama 3.1's rope_freqs.weight) or "
                  "longrope (Phi-3.5's long and short factors, for a context 32 times the "
                  "original)")
      ->check(CLI::IsMember({"llama3.1", "longrope"}));
  cmd->callback([a] {
    model::SyntheticOptions o;
    o.preset = a->preset;
    model::set_synthetic_dtype(o, a->dtype);
    o.layers = a->layers;
    o.context = a->context;
    o.seed = a->seed;
    o.arch = a->arch;
    o.sliding_window = a->sliding_window;
    const model::SyntheticPreset& p = model::find_synthetic_preset(a->preset);
    if (a->rope_freqs == "llama3.1") {
      o.rope_freq_factors = model::llama31_rope_factors(p.n_embd / p.n_heads, p.rope_theta);
    } else if (a->rope_freqs == "longrope") {
      // Phi-3.5's proportions: a context 32 times the one the short factors were made for.
      const uint64_t context = a->context > 0 ? a->context : p.context_length;
      o.long_rope = model::phi35_long_rope(p.n_embd / p.n_heads, context, context / 32);
    }
    const uint64_t bytes = model::synthetic_model_bytes(o);
    spdlog::info("writing {} ({}, {} weights) to {}", a->preset, a->dtype, format_bytes(bytes),
                 a->output);
    model::write_synthetic_model(o, a->output, progress_bar("make-model"));
  });
}

}  // namespace kvc::cli
