#include "model/synthetic_model.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <thread>
#include <unordered_set>

#include "base/error.h"
#include "base/thread_pool.h"
#include "model/gguf_writer.h"
#include "model/sampler.h"

namespace kvc::model {

const std::vector<SyntheticPreset>& synthetic_presets() {
  static const std::vector<SyntheticPreset> presets = {
      {"tiny", 512, 64, 192, 2, 4, 2, 512, 10000.0f, true},
      {"small", 512, 256, 512, 2, 4, 2, 512, 10000.0f, false},
      {"110m", 32000, 768, 2048, 12, 12, 12, 2048, 10000.0f, false},
      {"tinyllama-1.1b", 32000, 2048, 5632, 22, 32, 4, 2048, 10000.0f, false},
      {"llama3-8b", 128256, 4096, 14336, 32, 32, 8, 8192, 500000.0f, false},
  };
  return presets;
}

const SyntheticPreset& find_synthetic_preset(const std::string& name) {
  std::string names;
  for (const auto& p : synthetic_presets()) {
    if (p.name == name) return p;
    names += (names.empty() ? "" : ", ") + p.name;
  }
  fail("unknown preset '{}' (known presets: {})", name, names);
}

SyntheticVocab make_synthetic_vocab(int n_vocab, uint64_t seed) {
  if (n_vocab < 259 + 64) fail("a synthetic vocabulary needs at least 323 tokens, got {}", n_vocab);
  SyntheticVocab v;
  const auto add = [&](std::string piece, int32_t type) {
    v.tokens.push_back(std::move(piece));
    v.types.push_back(type);
  };
  add("<unk>", 2);
  add("<s>", 3);
  add("</s>", 3);
  for (int b = 0; b < 256; ++b) add(fmt::format("<0x{:02X}>", b), 6);
  const std::string space = "\xe2\x96\x81";  // U+2581, SentencePiece's space
  std::vector<std::string> normal = {space};
  for (char c = 'a'; c <= 'z'; ++c) normal.emplace_back(1, c);
  for (char c = 'A'; c <= 'Z'; ++c) normal.emplace_back(1, c);
  for (char c = '0'; c <= '9'; ++c) normal.emplace_back(1, c);
  for (char c : std::string(".,!?'\"-:;()")) normal.emplace_back(1, c);
  std::unordered_set<std::string> seen(normal.begin(), normal.end());
  Rng rng(seed ^ 0x766f636162ull);
  const size_t target = static_cast<size_t>(n_vocab) - v.tokens.size();
  // Word-like pieces: a left piece (mostly a space-led word start, as most of a real
  // vocabulary is) plus a short right piece that does not begin with a space. Early pieces
  // are short and common, as in real vocabularies.
  std::vector<size_t> word_starts = {0};
  std::vector<size_t> inner;
  for (size_t i = 1; i < normal.size(); ++i) inner.push_back(i);
  const auto pick = [&](const std::vector<size_t>& from) {
    return from[static_cast<size_t>(rng.uniform() * rng.uniform() * from.size())];
  };
  while (normal.size() < target) {
    const bool word = rng.uniform() < 0.7;
    std::string piece = normal[pick(word ? word_starts : inner)] + normal[pick(inner)];
    if (piece.size() > 16 || !seen.insert(piece).second) continue;
    (word ? word_starts : inner).push_back(normal.size());
    normal.push_back(std::move(piece));
  }
  normal.resize(target);
  for (auto& p : normal) add(std::move(p), 1);
  v.scores.resize(v.tokens.size(), 0.0f);
  for (size_t i = 259; i < v.tokens.size(); ++i) v.scores[i] = -static_cast<float>(i - 259);
  return v;
}

namespace {

struct TensorPlan {
  std::string name;
  std::vector<uint64_t> dims;
  DType dtype;
  // Norms hold ones; biases uniform values in [-0.5, 0.5); gains 1 plus such values.
  enum Kind { kMatrix, kNorm, kBias, kGain } kind;
};

std::vector<TensorPlan> plan_tensors(const SyntheticPreset& p, const SyntheticOptions& o,
                                     int layers) {
  const auto matrix_type = [&](uint64_t in_dim, bool more_bits = false) {
    const DType wanted = more_bits && o.more_bits ? *o.more_bits : o.dtype;
    // Quantised rows must hold whole blocks: rows too short for a K super-block take q8_0,
    // as llama.cpp falls back, and rows ragged even for that take f16.
    if (in_dim % block_elements(wanted) == 0) return wanted;
    return in_dim % 32 == 0 && block_elements(wanted) > 1 ? DType::Q8_0 : DType::F16;
  };
  const auto more_bits_layer = [&](int l) {
    return l < layers / 8 || l >= 7 * layers / 8 || (l - layers / 8) % 3 == 2;
  };
  const uint64_t d = p.n_embd, hd = p.n_embd / p.n_heads, ff = p.n_ff;
  const uint64_t q = p.n_heads * hd, kv = p.n_kv_heads * hd;
  std::vector<TensorPlan> t;
  t.push_back({"token_embd.weight",
               {d, static_cast<uint64_t>(p.n_vocab)},
               matrix_type(d),
               TensorPlan::kMatrix});
  for (int l = 0; l < layers; ++l) {
    const std::string b = "blk." + std::to_string(l) + ".";
    t.push_back({b + "attn_norm.weight", {d}, DType::F32, TensorPlan::kNorm});
    if (o.arch == "phi3") {
      t.push_back({b + "attn_qkv.weight", {d, q + 2 * kv}, matrix_type(d), TensorPlan::kMatrix});
    } else {
      t.push_back({b + "attn_q.weight", {d, q}, matrix_type(d), TensorPlan::kMatrix});
      t.push_back({b + "attn_k.weight", {d, kv}, matrix_type(d), TensorPlan::kMatrix});
      t.push_back(
          {b + "attn_v.weight", {d, kv}, matrix_type(d, more_bits_layer(l)), TensorPlan::kMatrix});
    }
    if (o.arch == "qwen2") {
      t.push_back({b + "attn_q.bias", {q}, DType::F32, TensorPlan::kBias});
      t.push_back({b + "attn_k.bias", {kv}, DType::F32, TensorPlan::kBias});
      t.push_back({b + "attn_v.bias", {kv}, DType::F32, TensorPlan::kBias});
    }
    if (o.arch == "qwen3") {
      t.push_back({b + "attn_q_norm.weight", {hd}, DType::F32, TensorPlan::kGain});
      t.push_back({b + "attn_k_norm.weight", {hd}, DType::F32, TensorPlan::kGain});
    }
    t.push_back({b + "attn_output.weight", {q, d}, matrix_type(q), TensorPlan::kMatrix});
    if (o.arch == "gemma2") {
      t.push_back({b + "post_attention_norm.weight", {d}, DType::F32, TensorPlan::kGain});
      t.push_back({b + "post_ffw_norm.weight", {d}, DType::F32, TensorPlan::kGain});
    }
    t.push_back({b + "ffn_norm.weight", {d}, DType::F32, TensorPlan::kNorm});
    if (o.arch == "phi3") {  // gate and up fused, gate first
      t.push_back({b + "ffn_up.weight", {d, 2 * ff}, matrix_type(d), TensorPlan::kMatrix});
    } else {
      t.push_back({b + "ffn_gate.weight", {d, ff}, matrix_type(d), TensorPlan::kMatrix});
      t.push_back({b + "ffn_up.weight", {d, ff}, matrix_type(d), TensorPlan::kMatrix});
    }
    t.push_back(
        {b + "ffn_down.weight", {ff, d}, matrix_type(ff, more_bits_layer(l)), TensorPlan::kMatrix});
  }
  t.push_back({"output_norm.weight", {d}, DType::F32, TensorPlan::kNorm});
  if (!p.tied_output && o.arch != "gemma2") {  // gemma2 always ties its output to the embedding
    t.push_back({"output.weight",
                 {d, static_cast<uint64_t>(p.n_vocab)},
                 matrix_type(d, true),
                 TensorPlan::kMatrix});
  }
  return t;
}

int layer_count(const SyntheticPreset& p, const SyntheticOptions& o) {
  if (o.layers < 0 || o.layers > 1024) fail("--layers must be 1..1024, got {}", o.layers);
  return o.layers > 0 ? o.layers : p.n_layers;
}

uint64_t tensor_bytes(const TensorPlan& t) {
  uint64_t rows = 1;
  for (size_t i = 1; i < t.dims.size(); ++i) rows *= t.dims[i];
  return row_bytes(t.dtype, t.dims[0]) * rows;
}

// Fills rows [begin, end) of a matrix with uniform values in [-scale, scale); each row has its
// own generator seeded from (seed, tensor, row), so the result does not depend on threads.
void fill_rows(const TensorPlan& t, DType values, uint64_t seed, size_t index, uint8_t* dst,
               size_t begin, size_t end) {
  const size_t n = t.dims[0];
  const size_t stride = row_bytes(t.dtype, n);
  const float scale = std::sqrt(3.0f / static_cast<float>(n));
  std::vector<float> row(n);
  std::vector<uint8_t> rounded(values != t.dtype ? row_bytes(values, n) : 0);
  for (size_t r = begin; r < end; ++r) {
    Rng rng(seed * 0x9e3779b97f4a7c15ull + index * 0x100000001b3ull + r);
    for (size_t i = 0; i < n; ++i) {
      row[i] = static_cast<float>((rng.uniform() * 2.0 - 1.0) * scale);
    }
    if (!rounded.empty()) {
      quantize_row(values, row.data(), rounded.data(), n);
      dequantize_row(values, rounded.data(), row.data(), n);
    }
    quantize_row(t.dtype, row.data(), dst + r * stride, n);
  }
}

}  // namespace

void set_synthetic_dtype(SyntheticOptions& options, std::string_view name) {
  if (name == "q4_K_M" || name == "Q4_K_M") {
    options.dtype = DType::Q4_K;
    options.more_bits = DType::Q6_K;
    return;
  }
  if (name == "q5_K_M" || name == "Q5_K_M") {
    options.dtype = DType::Q5_K;
    options.more_bits = DType::Q6_K;
    return;
  }
  const auto t = parse_dtype(name);
  if (!t || *t == DType::BF16) {
    fail(
        "--dtype must be f32, f16, q8_0, q4_0, q4_1, q5_0, q5_1, q2_K, q3_K, q4_K, q5_K, q6_K, "
        "iq4_nl, q4_K_M or q5_K_M, got '{}'",
        name);
  }
  options.dtype = *t;
  options.more_bits.reset();
}

uint32_t synthetic_file_type(const SyntheticOptions& o) {
  if (o.more_bits) return o.dtype == DType::Q4_K ? 15 : 17;
  switch (o.dtype) {
    case DType::F32:
      return 0;
    case DType::F16:
      return 1;
    case DType::Q4_0:
      return 2;
    case DType::Q4_1:
      return 3;
    case DType::Q8_0:
      return 7;
    case DType::Q5_0:
      return 8;
    case DType::Q5_1:
      return 9;
    case DType::Q2_K:
      return 10;
    case DType::Q3_K:
      return 12;
    case DType::Q4_K:
      return 14;
    case DType::Q5_K:
      return 16;
    case DType::Q6_K:
      return 18;
    case DType::IQ4_NL:
      return 25;
    case DType::BF16:
      return 32;
    case DType::Q8_K:  // never a weight type (parse_dtype does not name it)
      break;
  }
  return 0;
}

uint64_t synthetic_model_bytes(const SyntheticOptions& options) {
  const SyntheticPreset& p = find_synthetic_preset(options.preset);
  uint64_t total = 0;
  for (const auto& t : plan_tensors(p, options, layer_count(p, options))) total += tensor_bytes(t);
  return total;
}

void write_synthetic_model(const SyntheticOptions& o, const std::string& path,
                           const std::function<void(uint64_t, uint64_t)>& progress) {
  const SyntheticPreset& p = find_synthetic_preset(o.preset);
  if (o.dtype == DType::BF16) fail("make-model does not write bf16 weights");
  const int layers = layer_count(p, o);
  if (o.arch != "llama" && o.arch != "qwen2" && o.arch != "qwen3" && o.arch != "phi3" &&
      o.arch != "gemma2") {
    fail("--arch must be llama, qwen2, qwen3, phi3 or gemma2, got '{}'", o.arch);
  }
  const std::string arch = o.arch;
  gguf::Writer w;
  w.set_string("general.architecture", arch);
  w.set_string("general.name", "kvcache-synthetic-" + p.name);
  w.set_string("general.description",
               "synthetic model with random weights written by kvcache make-model");
  w.set_u32("general.file_type", synthetic_file_type(o));
  if (o.context < 0 || o.context > (1 << 24))
    fail("--context must be 1..16777216, got {}", o.context);
  w.set_u32(arch + ".context_length", o.context > 0 ? o.context : p.context_length);
  w.set_u32(arch + ".embedding_length", p.n_embd);
  w.set_u32(arch + ".feed_forward_length", p.n_ff);
  w.set_u32(arch + ".block_count", layers);
  w.set_u32(arch + ".attention.head_count", p.n_heads);
  w.set_u32(arch + ".attention.head_count_kv", p.n_kv_heads);
  w.set_u32(arch + ".rope.dimension_count", p.n_embd / p.n_heads);
  w.set_f32(arch + ".rope.freq_base", p.rope_theta);
  if (arch == "phi3" || arch == "gemma2" || (arch == "llama" && o.sliding_window > 0)) {
    const int context = o.context > 0 ? o.context : p.context_length;
    w.set_u32(arch + ".attention.sliding_window",
              o.sliding_window > 0 ? o.sliding_window : context);
  }
  if (arch == "gemma2") {
    w.set_f32(arch + ".attn_logit_softcapping", 50.0f);
    w.set_f32(arch + ".final_logit_softcapping", 30.0f);
  }
  if (o.long_rope) {
    w.set_u32(arch + ".rope.scaling.original_context_length",
              static_cast<uint32_t>(o.long_rope->original_context));
    w.set_f32(arch + ".rope.scaling.attn_factor", o.long_rope->attn_factor);
  }
  if (o.rope_linear_factor > 0.0f) {
    w.set_string(arch + ".rope.scaling.type", "linear");
    w.set_f32(arch + ".rope.scaling.factor", o.rope_linear_factor);
  }
  w.set_f32(arch + ".attention.layer_norm_rms_epsilon", 1e-5f);
  w.set_u32(arch + ".vocab_size", p.n_vocab);
  SyntheticVocab vocab = make_synthetic_vocab(p.n_vocab, o.seed);
  w.set_string("tokenizer.ggml.model", "llama");
  w.set_string_array("tokenizer.ggml.tokens", std::move(vocab.tokens));
  w.set_f32_array("tokenizer.ggml.scores", std::move(vocab.scores));
  w.set_i32_array("tokenizer.ggml.token_type", std::move(vocab.types));
  w.set_u32("tokenizer.ggml.unknown_token_id", 0);
  w.set_u32("tokenizer.ggml.bos_token_id", 1);
  w.set_u32("tokenizer.ggml.eos_token_id", 2);
  w.set_bool("tokenizer.ggml.add_bos_token", true);
  w.set_bool("tokenizer.ggml.add_eos_token", false);

  const std::vector<TensorPlan> tensors = plan_tensors(p, o, layers);
  SyntheticOptions value_options = o;
  if (o.values_of) value_options.dtype = *o.values_of;
  const std::vector<TensorPlan> value_types = plan_tensors(p, value_options, layers);
  const int threads = std::max(1u, std::min(8u, std::thread::hardware_concurrency()));
  auto pool = std::make_shared<ThreadPool>(threads);
  for (size_t i = 0; i < tensors.size(); ++i) {
    const TensorPlan& t = tensors[i];
    const DType values = value_types[i].dtype;
    w.add_tensor(
        t.name, t.dims, t.dtype, [t, values, i, seed = o.seed, pool](uint8_t* dst, size_t) {
          if (t.kind != TensorPlan::kMatrix) {
            std::vector<float> v(t.dims[0], 1.0f);
            Rng rng(seed * 0x9e3779b97f4a7c15ull + i);
            for (float& x : v) {
              if (t.kind == TensorPlan::kNorm) continue;
              const auto r = static_cast<float>(rng.uniform() - 0.5);
              x = t.kind == TensorPlan::kBias ? r : 1.0f + r;
            }
            quantize_row(t.dtype, v.data(), dst, v.size());
            return;
          }
          pool->parallel_for(t.dims[1],
                             [&](size_t b, size_t e) { fill_rows(t, values, seed, i, dst, b, e); });
        });
  }
  const auto add_factors = [&](const std::string& name, const std::vector<float>& factors) {
    const uint64_t pairs = p.n_embd / p.n_heads / 2;
    if (factors.size() != pairs) {
      fail("{} needs {} factors for this preset, got {}", name, pairs, factors.size());
    }
    w.add_tensor(name, {pairs}, DType::F32, [factors](uint8_t* dst, size_t) {
      std::memcpy(dst, factors.data(), factors.size() * sizeof(float));
    });
  };
  if (!o.rope_freq_factors.empty()) add_factors("rope_freqs.weight", o.rope_freq_factors);
  if (o.long_rope) {
    add_factors("rope_factors_long.weight", o.long_rope->long_factors);
    add_factors("rope_factors_short.weight", o.long_rope->short_factors);
  }
  w.write(path, progress);
}

LongRope phi35_long_rope(int n_rot, uint64_t context, uint64_t original_context) {
  if (original_context < 2 || context <= original_context) {
    fail("LongRoPE needs an original context of at least 2 below the context, got {} and {}",
         original_context, context);
  }
  LongRope r;
  r.original_context = original_context;
  const double scale = static_cast<double>(context) / static_cast<double>(original_context);
  r.attn_factor = static_cast<float>(
      std::sqrt(1.0 + std::log(scale) / std::log(static_cast<double>(original_context))));
  const int pairs = n_rot / 2;
  for (int i = 0; i < pairs; ++i) {
    const double t = pairs > 1 ? static_cast<double>(i) / (pairs - 1) : 0.0;
    r.short_factors.push_back(static_cast<float>(1.0 + 0.5 * t * t));
    r.long_factors.push_back(static_cast<float>(std::pow(2.0 * scale, t)));
  }
  return r;
}

std::vector<float> llama31_rope_factors(int n_rot, float rope_theta) {
  constexpr double kFactor = 8.0, kLowFreqFactor = 1.0, kHighFreqFactor = 4.0;
  constexpr double kOriginalContext = 8192.0;
  const double low_freq_wavelen = kOriginalContext / kLowFreqFactor;
  const double high_freq_wavelen = kOriginalContext / kHighFreqFactor;
  std::vector<float> factors;
  for (int i = 0; i < n_rot / 2; ++i) {
    const double freq = std::pow(static_cast<double>(rope_theta), -2.0 * i / n_rot);
    const double wavelen = 2.0 * M_PI / freq;
    double factor = 1.0;
    if (wavelen > low_freq_wavelen) {
      factor = kFactor;
    } else if (wavelen >= high_freq_wavelen) {
      const double smooth =
          (kOriginalContext / wavelen - kLowFreqFactor) / (kHighFreqFactor - kLowFreqFactor);
      factor = 1.0 / ((1.0 - smooth) / kFactor + smooth);
    }
    factors.push_back(static_cast<float>(factor));
  }
  return factors;
}

}  // namespace kvc::model
