#include "model/llama_config.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "base/error.h"
#include "model/gguf.h"

namespace kvc::model {

namespace {
int positive_int(const gguf::File& f, const std::string& key, uint64_t value) {
  if (value == 0 || value > (1u << 30)) {
    fail("{}: metadata key '{}' = {} is out of range", f.label(), key, value);
  }
  return static_cast<int>(value);
}

// Real models use heads of 64 to 256 dimensions (512 at most); beyond this, key_length is corrupt.
constexpr uint64_t kMaxHeadDim = 4096;

enum class Sign { kPositive, kNonNegative };

// The float hyperparameter at key (fallback when absent), which must be finite once narrowed to
// float and positive (or, for kNonNegative, at least 0).
float float_param(const gguf::File& f, const std::string& key, double fallback, Sign sign) {
  const double value = f.get_f64(key, fallback);
  const auto narrowed = static_cast<float>(value);
  const bool sign_ok = sign == Sign::kPositive ? narrowed > 0.0f : narrowed >= 0.0f;
  if (!std::isfinite(narrowed) || !sign_ok) {
    fail("{}: metadata key {} {} must be {} and finite (as a 32-bit float)", f.label(), key, value,
         sign == Sign::kPositive ? "positive" : "non-negative");
  }
  return narrowed;
}
}  // namespace

LlamaConfig LlamaConfig::from_gguf(const gguf::File& f) {
  LlamaConfig c;
  c.architecture = f.get_string("general.architecture");
  if (c.architecture != "llama" && c.architecture != "qwen2" && c.architecture != "qwen3" &&
      c.architecture != "phi3" && c.architecture != "gemma2") {
    fail(
        "{}: architecture '{}' is not supported (kvcache runs llama, qwen2, qwen3, phi3 and "
        "gemma2)",
        f.label(), c.architecture);
  }
  if (c.architecture != "llama") c.rope_layout = RopeLayout::kHalves;
  c.qk_norm = c.architecture == "qwen3";
  c.name = f.get_string("general.name", "");
  const std::string p = c.architecture + ".";
  // Before any tensor is looked for: a mixture-of-experts file would otherwise fail on a
  // missing dense FFN tensor.
  if (const uint64_t experts = f.get_u64(p + "expert_count", 0); experts > 0) {
    fail("{}: mixture-of-experts models ({} = {}) are not supported", f.label(), p + "expert_count",
         experts);
  }
  auto req = [&](const std::string& key) { return positive_int(f, p + key, f.get_u64(p + key)); };
  c.n_embd = req("embedding_length");
  c.n_ff = req("feed_forward_length");
  c.n_layers = req("block_count");
  c.n_heads = req("attention.head_count");
  c.context_length = req("context_length");
  c.n_kv_heads = positive_int(f, p + "attention.head_count_kv",
                              f.get_u64(p + "attention.head_count_kv", c.n_heads));
  if (c.n_heads % c.n_kv_heads != 0) {
    fail("{}: {} attention heads are not a multiple of {} KV heads", f.label(), c.n_heads,
         c.n_kv_heads);
  }
  if (c.n_embd % c.n_heads != 0) {
    fail("{}: embedding length {} is not a multiple of {} heads", f.label(), c.n_embd, c.n_heads);
  }
  const uint64_t key_length = f.get_u64(p + "attention.key_length", c.n_embd / c.n_heads);
  if (key_length == 0 || key_length > kMaxHeadDim) {
    fail("{}: metadata key '{}' = {} is out of range (1 to {})", f.label(),
         p + "attention.key_length", key_length, kMaxHeadDim);
  }
  c.head_dim = static_cast<int>(key_length);
  const uint64_t value_length = f.get_u64(p + "attention.value_length", key_length);
  if (value_length != key_length) {
    fail("{}: key length {} differs from value length {}; kvcache needs them equal", f.label(),
         key_length, value_length);
  }
  // Q, K and V rows together (phi3 fuses them into one matrix) must count in int.
  const uint64_t qkv_rows = (uint64_t{static_cast<uint32_t>(c.n_heads)} +
                             2 * uint64_t{static_cast<uint32_t>(c.n_kv_heads)}) *
                            key_length;
  if (qkv_rows > static_cast<uint64_t>(std::numeric_limits<int>::max())) {
    fail("{}: {} heads and {} KV heads of {} dimensions are too large ({} rows of Q, K and V)",
         f.label(), c.n_heads, c.n_kv_heads, key_length, qkv_rows);
  }
  c.n_rot = positive_int(f, p + "rope.dimension_count",
                         f.get_u64(p + "rope.dimension_count", c.head_dim));
  if (c.n_rot > c.head_dim || c.n_rot % 2 != 0) {
    fail("{}: rope.dimension_count {} must be even and at most the head dimension {}", f.label(),
         c.n_rot, c.head_dim);
  }
  c.rms_eps = float_param(f, p + "attention.layer_norm_rms_epsilon", 1e-5, Sign::kPositive);
  c.rope_theta = float_param(f, p + "rope.freq_base", 10000.0, Sign::kPositive);
  c.rope_original_context =
      positive_int(f, p + "rope.scaling.original_context_length",
                   f.get_u64(p + "rope.scaling.original_context_length", c.context_length));
  c.rope_attn_factor = float_param(f, p + "rope.scaling.attn_factor", 1.0, Sign::kPositive);
  if (const gguf::Value* scaling = f.find(p + "rope.scaling.type")) {
    const std::string* type = scaling->as_string();
    if (type != nullptr && *type == "linear") {
      const float factor = float_param(f, p + "rope.scaling.factor", 1.0, Sign::kPositive);
      if (!(factor >= 1.0f) || factor > 1e6f) {
        fail("{}: rope.scaling.factor {} must be 1 to 1e6", f.label(), factor);
      }
      c.rope_freq_scale = 1.0f / factor;
    } else if (type == nullptr || (*type != "none" && *type != "")) {
      fail(
          "{}: rope scaling '{}' is not supported (kvcache knows none, linear, and the "
          "per-dimension factors of a rope_freqs.weight tensor, as Llama 3.1 files carry)",
          f.label(), scaling->describe());
    }
  }
  // Windows where the architecture has them: Mistral-style llama files that name one (which
  // llama.cpp ignores), phi3, gemma2. qwen2 files may name one they do not use, as in llama.cpp.
  if (c.architecture == "llama" || c.architecture == "phi3" || c.architecture == "gemma2") {
    const uint64_t fallback = c.architecture == "gemma2" ? 4096 : 0;
    if (const uint64_t window = f.get_u64(p + "attention.sliding_window", fallback); window > 0) {
      c.sliding_window = positive_int(f, p + "attention.sliding_window", window);
    }
    c.sliding_every = c.architecture == "gemma2" ? 2 : 1;
  }
  if (c.architecture == "gemma2") {
    c.embedding_scale = std::sqrt(static_cast<float>(c.n_embd));
    c.ffn_gelu = true;
    c.post_norms = true;
    // 0 turns a cap off.
    c.attn_softcap = float_param(f, p + "attn_logit_softcapping", 50.0, Sign::kNonNegative);
    c.final_softcap = float_param(f, p + "final_logit_softcapping", 30.0, Sign::kNonNegative);
    // As llama.cpp: queries are scaled by 1 / sqrt(head_dim), except in the 46-layer 27B
    // model, which uses 1 / sqrt(n_embd / n_heads) (its query_pre_attn_scalar).
    const int scalar = c.n_layers == 46 ? c.n_embd / c.n_heads : c.head_dim;
    c.attention_scale = 1.0f / std::sqrt(static_cast<float>(scalar));
  }
  c.n_vocab = positive_int(f, "tokenizer.ggml.tokens", f.get_array("tokenizer.ggml.tokens").size());
  return c;
}

kv::KvGeometry LlamaConfig::kv_cache_geometry(DType k_dtype, DType v_dtype,
                                              int block_tokens) const {
  kv::KvGeometry g = kv_geometry(k_dtype, v_dtype, block_tokens);
  g.window_tokens = kv_window();
  if (kv_split_window() > 0) {
    int sliding = 0;
    for (int l = 0; l < n_layers; ++l) sliding += layer_slides(l) ? 1 : 0;
    g.n_layers = std::max(sliding, n_layers - sliding);
    g.split_window = kv_split_window();
  }
  g.validate();
  return g;
}

std::pair<int, int> LlamaConfig::kv_slot(int l) const {
  if (kv_split_window() == 0) return {0, l};
  const bool slides = layer_slides(l);
  int index = 0;
  for (int i = 0; i < l; ++i) index += layer_slides(i) == slides ? 1 : 0;
  return {slides ? 1 : 0, index};
}

kv::KvGeometry LlamaConfig::kv_geometry(DType k_dtype, DType v_dtype, int block_tokens) const {
  kv::KvGeometry g;
  g.n_layers = n_layers;
  g.n_kv_heads = n_kv_heads;
  g.head_dim = head_dim;
  g.block_tokens = kv::block_tokens_for(k_dtype, block_tokens);
  g.k_dtype = k_dtype;
  g.v_dtype = v_dtype;
  g.validate();
  return g;
}

}  // namespace kvc::model
