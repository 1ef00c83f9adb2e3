// Synthetic Llama-family GGUF files with realistic shapes and deterministic random weights,
// so that benchmarks and tests run at real sizes without downloading a model.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "base/dtype.h"

namespace kvc::model {

struct SyntheticPreset {
  std::string name;
  int n_vocab;
  int n_embd;
  int n_ff;
  int n_layers;
  int n_heads;
  int n_kv_heads;
  int context_length;
  float rope_theta;
  bool tied_output;  // whether output.weight is omitted (classifier tied to the embedding)
};

// The presets: tiny (tests), small (tests of 256-element K-quant rows), 110m, tinyllama-1.1b,
// llama3-8b.
const std::vector<SyntheticPreset>& synthetic_presets();
// The preset called name; throws Error listing the valid names otherwise.
const SyntheticPreset& find_synthetic_preset(const std::string& name);

// LongRoPE's per-pair factors for long and short contexts, the context the short ones were made
// for, and the factor on every rotary cosine and sine.
struct LongRope {
  std::vector<float> long_factors;
  std::vector<float> short_factors;
  uint64_t original_context = 0;
  float attn_factor = 1.0f;
};

struct SyntheticOptions {
  std::string preset = "tiny";
  // general.architecture: llama, qwen2 (adds Q/K/V biases), qwen3 (adds per-head Q/K norms),
  // phi3 (fuses Q/K/V and gate/up) or gemma2 (adds post-attention and post-FFN norms, writes
  // soft-capping keys, ties the output to the embedding).
  std::string arch = "llama";
  DType dtype = DType::F32;  // matrices; norms stay f32
  int layers = 0;            // > 0 overrides the preset's layer count
  int context = 0;           // > 0 overrides the preset's llama.context_length
  uint64_t seed = 1;
  // As llama.cpp's Q4_K_M and Q5_K_M mixes: this type for output.weight and for attn_v and
  // ffn_down in the first and last eighth of the layers and every third layer between.
  std::optional<DType> more_bits;
  // Where set, every matrix holds exactly the values this type can (each row is quantised to
  // it and back before being stored as dtype), so that tests can run a quantised model's
  // weights through f32 arithmetic.
  std::optional<DType> values_of;
  // Written as rope_freqs.weight (one divisor per rotary pair) when not empty.
  std::vector<float> rope_freq_factors;
  // Written as rope.scaling.type = "linear" with this rope.scaling.factor when above 0.
  float rope_linear_factor = 0.0f;
  // Written, when set, as Phi-3.5's LongRoPE: rope_factors_long/short.weight and the
  // rope.scaling.original_context_length and attn_factor keys.
  std::optional<LongRope> long_rope;
  // attention.sliding_window: phi3 and gemma2 files always carry one (0: the whole context),
  // llama files (Mistral style) when this is above 0.
  int sliding_window = 0;
};

// Llama 3.1's rope_freqs.weight for n_rot rotary dimensions and the given base, as its
// converter computes them (factor 8, low and high frequency factors 1 and 4, original context
// 8192): wavelengths under 2048 positions keep factor 1, those over 8192 take 8, and those
// between are interpolated smoothly.
std::vector<float> llama31_rope_factors(int n_rot, float rope_theta);

// LongRoPE factors shaped as Phi-3.5's (short ones rising from 1 to about 1.5, long ones from 1
// to twice context / original_context), with its attention factor
// sqrt(1 + ln(context / original_context) / ln(original_context)).
LongRope phi35_long_rope(int n_rot, uint64_t context, uint64_t original_context);

// A llama-style SentencePiece vocabulary of n tokens: <unk>, <s>, </s>, the 256 byte tokens,
// then pieces each made of two earlier pieces (so BPE merges can reach every one), with
// descending scores.
struct SyntheticVocab {
  std::vector<std::string> tokens;
  std::vector<float> scores;
  std::vector<int32_t> types;
};
SyntheticVocab make_synthetic_vocab(int n_vocab, uint64_t seed);

// Options for a --dtype name: a weight type ("q8_0", "q4_K", ...) or a mix ("q4_K_M",
// "q5_K_M"); throws Error naming the accepted ones otherwise.
void set_synthetic_dtype(SyntheticOptions& options, std::string_view name);
// llama.cpp's general.file_type for the options' types (e.g. 15 for q4_K_M).
uint32_t synthetic_file_type(const SyntheticOptions& options);

// Writes the model to path (atomically); progress(done, total) reports bytes written.
void write_synthetic_model(const SyntheticOptions& options, const std::string& path,
                           const std::function<void(uint64_t, uint64_t)>& progress = {});

// Bytes the file will take (tensor data only), for progress and disk checks.
uint64_t synthetic_model_bytes(const SyntheticOptions& options);

}  // namespace kvc::model
