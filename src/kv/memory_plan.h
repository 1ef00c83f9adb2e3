// KV memory planning: what a model's attention costs in bytes for a set of context lengths and
// concurrencies, under a KV dtype, a block size and a memory budget.
//
// A geometry the block pool can store (one K/V head shape on every layer) is costed through
// KvGeometry, the formula the pool allocates with, so the plan equals what the pool allocates to
// the byte: with one sliding window on every layer a request holds the blocks its window
// touches; layers of different windows (Gemma 2's) are all kept in full, as the pool keeps
// them. Other geometries (MLA latents, per-layer shapes, dtypes the pool does not store) are
// costed per layer, as a paged allocator that frees blocks leaving a layer's window would hold
// them.
//
// Thread-safety: pure functions over values; safe from any thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "base/dtype.h"
#include "kv/kv_geometry.h"

namespace kvc::kv {

// One layer's per-token KV storage: K/V heads, or one MLA latent.
struct AttentionLayer {
  int kv_heads = 0;     // K/V heads; 0 for an MLA layer or a layer without a KV cache
  int k_head_dim = 0;   // elements of one key head
  int v_head_dim = 0;   // elements of one value head
  int latent_dim = 0;   // MLA: elements of the compressed latent, stored once (no K/V pair)
  uint64_t window = 0;  // sliding window in tokens; 0 means full attention
};

// A model's attention, layer by layer.
struct AttentionGeometry {
  std::vector<AttentionLayer> layers;

  // n_layers full-attention layers of n_kv_heads heads of head_dim (MHA, GQA, MQA).
  static AttentionGeometry uniform(int n_layers, int n_kv_heads, int head_dim);
  // n_layers MLA layers caching latent_dim elements per token (kv_lora_rank + rope dim).
  static AttentionGeometry mla(int n_layers, int latent_dim);
  // The same layers as kv's block pool sees them.
  static AttentionGeometry from_kv_geometry(const KvGeometry& geometry);

  // The block pool's geometry when every layer has one K/V head shape that the pool stores in
  // these dtypes (KvGeometry::validate), with the layers' window when they share one; nullopt
  // otherwise.
  std::optional<KvGeometry> pool_geometry(DType k_dtype, DType v_dtype, int block_tokens) const;
  bool is_mla() const;
  bool has_window() const;
  // Throws Error naming the layer when a dimension is negative or no layer caches anything.
  void validate() const;
};

// Bytes of one token of one layer, keys at k_dtype and values (or an MLA latent: k_dtype) at
// v_dtype, for geometries the pool cannot store: a row shorter than a quantisation block still
// takes a whole block, since each head's row is quantised on its own.
uint64_t layer_token_bytes(const AttentionLayer& layer, DType k_dtype, DType v_dtype);

// "f16" when both are the same, else "K q8_0 / V f16", for reports and logs.
std::string kv_dtypes_name(DType k_dtype, DType v_dtype);

struct PlanOptions {
  DType k_dtype = DType::F16;
  DType v_dtype = DType::F16;
  int block_tokens = kDefaultBlockTokens;
  std::vector<uint64_t> contexts;       // tokens per request
  std::vector<uint64_t> concurrencies;  // requests held at once
  uint64_t weights_bytes = 0;
  std::optional<uint64_t> budget_bytes;  // none: no fit figures
  bool budget_includes_weights = true;   // the weights come out of the budget first
};

// One context length, for one request.
struct RequestFigures {
  uint64_t context = 0;
  uint64_t exact_bytes = 0;                 // the tokens' K/V themselves (windowed layers capped)
  uint64_t allocated_bytes = 0;             // what the request holds in whole blocks
  uint64_t waste_bytes = 0;                 // allocated_bytes - exact_bytes
  std::optional<uint64_t> blocks;           // whole blocks, unless layers hold different counts
  std::optional<uint64_t> max_concurrency;  // requests of this context the budget holds
};

// One (context, concurrency) pair.
struct CellFigures {
  uint64_t context = 0;
  uint64_t concurrency = 0;
  uint64_t kv_bytes = 0;     // allocated bytes of all requests
  uint64_t total_bytes = 0;  // kv_bytes + weights_bytes
  std::optional<bool> fits;  // within the budget
};

// The longest context every one of `concurrency` requests can reach within the budget.
struct ConcurrencyFigures {
  uint64_t concurrency = 0;
  std::optional<uint64_t> max_context;  // nullopt with a budget means unbounded (all windowed)
};

struct MemoryPlan {
  DType k_dtype = DType::F16;
  DType v_dtype = DType::F16;
  int block_tokens = kDefaultBlockTokens;
  bool pool_layout = false;      // figures come from KvGeometry, as the block pool allocates
  uint64_t bytes_per_token = 0;  // one token, every layer, before any window cap
  uint64_t bytes_per_block = 0;  // block_tokens tokens
  uint64_t weights_bytes = 0;
  std::optional<uint64_t> budget_bytes;
  bool budget_includes_weights = true;
  std::optional<uint64_t> kv_budget_bytes;  // what the budget leaves for the KV cache
  std::optional<uint64_t> pool_blocks;      // whole blocks in kv_budget_bytes
  std::optional<uint64_t> pool_bytes;       // pool_blocks * bytes_per_block
  std::optional<uint64_t> pool_tokens;      // pool_blocks * block_tokens (/ 2 when split)
  std::vector<RequestFigures> requests;     // one per context
  std::vector<CellFigures> cells;           // context-major, one per (context, concurrency)
  std::vector<ConcurrencyFigures> limits;   // one per concurrency
};

// Every figure of the plan; throws Error on an invalid geometry or option, or a budget smaller
// than the weights it must hold (naming both).
MemoryPlan plan_memory(const AttentionGeometry& geometry, const PlanOptions& options);

// The lines the engine logs at start-up for a pool given pool_bytes of memory (the pool keeps
// the whole blocks that fit, so its arena_bytes() gives the same lines), plus, when context is
// not 0, what one request of that many tokens takes and how many fit. Computed by
// plan_memory, so it states exactly what `kvcache plan` predicts.
std::string startup_summary(const KvGeometry& geometry, size_t pool_bytes, size_t context);

}  // namespace kvc::kv
