// Hyperparameters of a Llama-family model, read from GGUF metadata.
#pragma once

#include <cstdint>
#include <string>

#include <utility>
#include "base/dtype.h"

#include "kv/kv_geometry.h"

namespace kvc::gguf {
class File;
}

namespace kvc::model {

// How rotary embedding pairs a head's dimensions: adjacent (x[2i], x[2i+1]) for llama, whose
// converter permutes Q and K to suit, or halves (x[i], x[i + n_rot/2]) for the architectures
// llama.cpp runs in its NEOX mode (qwen2, qwen3, phi3, gemma2).
enum class RopeLayout : uint8_t { kAdjacent, kHalves };

struct LlamaConfig {
  // llama, qwen2 (Q/K/V biases), qwen3 (per-head Q/K RMSNorm), phi3 (fused QKV and gate/up
  // matrices) or gemma2 (see below).
  std::string architecture;
  std::string name;
  int n_vocab = 0;
  int n_embd = 0;
  int n_ff = 0;
  int n_layers = 0;
  int n_heads = 0;
  int n_kv_heads = 0;
  int head_dim = 0;
  int n_rot = 0;  // rotary dimensions per head (the first n_rot of head_dim)
  int context_length = 0;
  float rms_eps = 1e-5f;
  float rope_theta = 10000.0f;
  // Linear rope scaling (rope.scaling.type = "linear"): angles are multiplied by this, which is
  // 1 / rope.scaling.factor; 1 without scaling.
  float rope_freq_scale = 1.0f;
  // LongRoPE (Phi-3.5, Phi-3 128k): the context the short factors were trained for
  // (rope.scaling.original_context_length; context_length when absent) and the factor that
  // multiplies every rotary cosine and sine (rope.scaling.attn_factor; 1 when absent).
  int rope_original_context = 0;
  float rope_attn_factor = 1.0f;
  RopeLayout rope_layout = RopeLayout::kAdjacent;
  // qwen3: each head of Q and K is RMS-normalised (attn_q_norm, attn_k_norm) before rotary.
  bool qk_norm = false;
  // Sliding-window attention, as llama.cpp runs it: a query at position p on a sliding layer
  // sees the keys at positions p - sliding_window + 1 .. p (0: no window). llama (Mistral
  // style) and phi3 slide on every layer when the file names a window, gemma2 on even layers
  // (window 4096 unless named); qwen2 and qwen3 attend fully, as in llama.cpp.
  int sliding_window = 0;
  int sliding_every = 1;  // layers l with l % sliding_every == 0 slide

  // Whether layer l attends through the sliding window.
  bool layer_slides(int l) const { return sliding_window > 0 && l % sliding_every == 0; }
  // The window when every layer slides (the KV cache then keeps only each sequence's window),
  // else 0.
  int kv_window() const { return sliding_window > 0 && sliding_every == 1 ? sliding_window : 0; }
  // gemma2: embeddings scaled by sqrt(n_embd), GELU (tanh form) instead of SiLU in the FFN,
  // RMSNorms after attention and after the FFN, attention scores and final logits soft-capped
  // as cap * tanh(x / cap) (0: no cap), and its own attention scale.
  float embedding_scale = 0.0f;  // 0: none
  bool ffn_gelu = false;
  bool post_norms = false;
  float attn_softcap = 0.0f;
  float final_softcap = 0.0f;
  float attention_scale = 0.0f;  // multiplies Q.K; 0 means 1 / sqrt(head_dim)

  // Reads and validates {arch}.* keys; throws Error naming the key at fault: a count out of
  // range, a head dimension over 4096, a float hyperparameter that is not finite as a float (or
  // not positive), a mixture-of-experts file ({arch}.expert_count > 0). The vocabulary size
  // comes from tokenizer.ggml.tokens.
  static LlamaConfig from_gguf(const gguf::File& file);

  // Both fit int, with room for Q, K and V together: from_gguf bounds
  // (n_heads + 2 * n_kv_heads) * head_dim.
  int q_dim() const { return n_heads * head_dim; }
  int kv_dim() const { return n_kv_heads * head_dim; }
  // The KV storage shape of this model for given K and V dtypes and block size; throws Error
  // when the pool cannot store the model's heads in a dtype (KvGeometry::validate).
  kv::KvGeometry kv_geometry(DType k_dtype, DType v_dtype, int block_tokens) const;
  // The KV cache's layout of this model: kv_geometry() with the window of every layer
  // (kv_window()), or, where only some layers slide (Gemma 2), two groups of blocks of the
  // larger kind's layer count, the second sliding (KvGeometry::split_window).
  kv::KvGeometry kv_cache_geometry(DType k_dtype, DType v_dtype, int block_tokens) const;
  // Where only some layers slide: the window, else 0.
  int kv_split_window() const {
    return sliding_window > 0 && sliding_every > 1 ? sliding_window : 0;
  }
  // Where layer l's keys and values live in kv_cache_geometry(): its group and its layer there.
  std::pair<int, int> kv_slot(int l) const;
};

}  // namespace kvc::model
