#include "kv/memory_plan.h"

#include <fmt/format.h>

#include <algorithm>
#include <limits>

#include "base/byte_size.h"
#include "base/channel_keys.h"
#include "base/error.h"

namespace kvc::kv {

namespace {

// Products of token counts, byte sizes and concurrencies are formed in 128 bits, so a search
// over huge contexts cannot wrap; a figure that is reported must still fit 64 bits.
using Wide = unsigned __int128;

uint64_t narrow(Wide value, std::string_view what) {
  if (value > std::numeric_limits<uint64_t>::max()) {
    fail("{} is larger than 2^64 bytes; use a smaller context or concurrency", what);
  }
  return static_cast<uint64_t>(value);
}

uint64_t ceil_div(uint64_t a, uint64_t b) {
  return a / b + (a % b != 0);
}

uint64_t row_bytes_rounded(DType dtype, int elements) {
  const auto per_block = static_cast<uint64_t>(block_elements(dtype));
  return ceil_div(static_cast<uint64_t>(elements), per_block) * block_bytes(dtype);
}

// The cost model behind every figure: exact and whole-block bytes of one request.
class Costing {
 public:
  Costing(const AttentionGeometry& geometry, DType k_dtype, DType v_dtype, int block_tokens)
      : geometry_(geometry),
        pool_(geometry.pool_geometry(k_dtype, v_dtype, block_tokens)),
        block_tokens_(static_cast<uint64_t>(block_tokens)) {
    for (const auto& layer : geometry.layers) {
      token_bytes_.push_back(layer_token_bytes(layer, k_dtype, v_dtype));
      bytes_per_token_ += token_bytes_.back();
      if (layer.window == 0 && token_bytes_.back() > 0) {
        min_full_token_bytes_ = std::min(min_full_token_bytes_, token_bytes_.back());
      }
      if (layer.window > 0) max_window_ = std::max(max_window_, layer.window);
    }
    if (pool_) {
      // The pool slides every layer by its one window, splits the windowed layers' blocks from
      // the full ones', or keeps every layer in full.
      max_window_ = static_cast<uint64_t>(std::max(pool_->window_tokens, pool_->split_window));
      if (pool_->window_tokens > 0) min_full_token_bytes_ = std::numeric_limits<uint64_t>::max();
      if (pool_->split_window > 0) min_full_token_bytes_ = pool_->bytes_per_block() / block_tokens_;
    }
    blocked_ = max_window_ == 0 || pool_.has_value();
    if (pool_) {
      // The pool's own formula is the one that counts (the per-layer sum equals it here).
      bytes_per_token_ = pool_->bytes_per_token();
      open_bytes_ = pool_->open_key_blocks() * pool_->bytes_per_block();
    } else if (block_elements(k_dtype) > 1) {
      // Keys grouped per channel: a running request holds its last block's keys as f16.
      for (const auto& layer : geometry.layers) {
        open_bytes_ += static_cast<uint64_t>(layer.kv_heads) * layer.k_head_dim * block_tokens_ * 2;
      }
    }
  }

  const std::optional<KvGeometry>& pool() const { return pool_; }
  // Without windows every layer holds the same blocks, so a request is a count of
  // bytes_per_block() blocks, as in the pool.
  bool blocked() const { return blocked_; }
  // Whole blocks a running request of context tokens holds (its open keys' included).
  uint64_t blocks(uint64_t context) const {
    return pool_ ? pool_->blocks_for_sequence(context) : ceil_div(context, block_tokens_);
  }
  uint64_t bytes_per_token() const { return bytes_per_token_; }
  uint64_t bytes_per_block() const {
    return pool_ ? pool_->bytes_per_block() : bytes_per_token_ * block_tokens_;
  }
  bool has_full_layer() const {
    return min_full_token_bytes_ != std::numeric_limits<uint64_t>::max();
  }

  Wide exact(uint64_t context) const {
    if (pool_ && pool_->split_window == 0) {
      // The tokens the pool keeps: every one, or the last window's.
      const auto window = static_cast<uint64_t>(pool_->window_tokens);
      const Wide bytes =
          Wide{window > 0 ? std::min(context, window) : context} * pool_->bytes_per_block();
      return bytes / block_tokens_ + (bytes % block_tokens_ != 0);
    }
    Wide sum = 0;
    for (size_t i = 0; i < token_bytes_.size(); ++i) {
      const uint64_t window = geometry_.layers[i].window;
      sum += Wide{token_bytes_[i]} * (window > 0 ? std::min(context, window) : context);
    }
    return sum;
  }

  Wide allocated(uint64_t context) const {
    if (pool_) return Wide{blocks(context)} * bytes_per_block();
    if (blocked_) return Wide{blocks(context)} * bytes_per_block() + open_bytes_;
    const uint64_t blocks = ceil_div(context, block_tokens_);
    Wide sum = open_bytes_;
    for (size_t i = 0; i < token_bytes_.size(); ++i) {
      const uint64_t window = geometry_.layers[i].window;
      // A window of W tokens that slides over B-token blocks straddles at most
      // ceil((W - 1) / B) + 1 of them; blocks wholly behind the window are freed.
      const uint64_t held =
          window > 0 ? std::min(blocks, ceil_div(window - 1, block_tokens_) + 1) : blocks;
      sum += Wide{held} * block_tokens_ * token_bytes_[i];
    }
    return sum;
  }

  // Largest context that n requests can each reach within kv_budget bytes; nullopt when every
  // layer is windowed and n requests fit even at unbounded length.
  std::optional<uint64_t> max_context(uint64_t n, uint64_t kv_budget) const {
    if (max_window_ == 0) {
      const uint64_t each = kv_budget / n;
      return each < open_bytes_ ? 0 : (each - open_bytes_) / bytes_per_block() * block_tokens_;
    }
    const auto fits = [&](uint64_t context) { return allocated(context) * n <= kv_budget; };
    uint64_t hi = 0;
    if (has_full_layer()) {
      hi = kv_budget / min_full_token_bytes_ + 1;  // its full layers alone exceed the budget
    } else {
      hi = max_window_ + 2 * block_tokens_;  // past every window's plateau
      if (fits(hi)) return std::nullopt;
    }
    uint64_t lo = 0;  // allocated(0) is 0, which always fits
    while (hi - lo > 1) {
      const uint64_t mid = lo + (hi - lo) / 2;
      (fits(mid) ? lo : hi) = mid;
    }
    return lo;
  }

 private:
  const AttentionGeometry& geometry_;
  std::optional<KvGeometry> pool_;
  uint64_t block_tokens_;
  std::vector<uint64_t> token_bytes_;
  uint64_t bytes_per_token_ = 0;
  uint64_t open_bytes_ = 0;  // f16 keys of a running request's last block, where quantised
  uint64_t min_full_token_bytes_ = std::numeric_limits<uint64_t>::max();
  uint64_t max_window_ = 0;
  bool blocked_ = true;
};

}  // namespace

AttentionGeometry AttentionGeometry::uniform(int n_layers, int n_kv_heads, int head_dim) {
  AttentionGeometry g;
  g.layers.assign(static_cast<size_t>(std::max(n_layers, 0)),
                  AttentionLayer{n_kv_heads, head_dim, head_dim, 0, 0});
  return g;
}

AttentionGeometry AttentionGeometry::mla(int n_layers, int latent_dim) {
  AttentionGeometry g;
  g.layers.assign(static_cast<size_t>(std::max(n_layers, 0)),
                  AttentionLayer{0, 0, 0, latent_dim, 0});
  return g;
}

AttentionGeometry AttentionGeometry::from_kv_geometry(const KvGeometry& geometry) {
  AttentionGeometry g =
      uniform(geometry.n_layers * geometry.groups(), geometry.n_kv_heads, geometry.head_dim);
  // Split: the full group's layers, then the windowed group's.
  for (size_t i = 0; i < g.layers.size(); ++i) {
    g.layers[i].window =
        static_cast<uint64_t>(i < static_cast<size_t>(geometry.n_layers) ? geometry.window_tokens
                                                                         : geometry.split_window);
  }
  return g;
}

std::optional<KvGeometry> AttentionGeometry::pool_geometry(DType k_dtype, DType v_dtype,
                                                           int block_tokens) const {
  if (layers.empty()) return std::nullopt;
  const AttentionLayer& first = layers.front();
  if (first.kv_heads <= 0 || first.k_head_dim <= 0 || first.k_head_dim != first.v_head_dim) {
    return std::nullopt;
  }
  // One window on every layer is the pool's sliding window; full layers and layers of one
  // window (Gemma 2's) are split into two groups of blocks; other mixes are all kept in full.
  uint64_t window = 0;
  size_t windowed = 0;
  bool one_window = true;
  for (const auto& l : layers) {
    if (l.window == 0) continue;
    one_window = one_window && (window == 0 || l.window == window);
    window = l.window;
    ++windowed;
  }
  if (window > static_cast<uint64_t>(std::numeric_limits<int>::max())) return std::nullopt;
  const bool split = one_window && windowed > 0 && windowed < layers.size();
  const bool every = one_window && windowed == layers.size();
  const size_t group_layers = split ? std::max(windowed, layers.size() - windowed) : layers.size();
  for (const auto& layer : layers) {
    if (layer.latent_dim != 0 || layer.kv_heads != first.kv_heads ||
        layer.k_head_dim != first.k_head_dim || layer.v_head_dim != first.v_head_dim) {
      return std::nullopt;
    }
  }
  const KvGeometry g{static_cast<int>(group_layers),
                     first.kv_heads,
                     first.k_head_dim,
                     block_tokens,
                     k_dtype,
                     v_dtype,
                     every ? static_cast<int>(window) : 0,
                     split ? static_cast<int>(window) : 0};
  try {
    g.validate();
  } catch (const Error&) {
    return std::nullopt;  // a dtype or grouping the pool cannot store: costed per layer
  }
  return g;
}

bool AttentionGeometry::is_mla() const {
  return std::any_of(layers.begin(), layers.end(), [](const auto& l) { return l.latent_dim > 0; });
}

bool AttentionGeometry::has_window() const {
  return std::any_of(layers.begin(), layers.end(), [](const auto& l) { return l.window > 0; });
}

void AttentionGeometry::validate() const {
  if (layers.empty()) fail("attention geometry: the model has no layers");
  bool any_cache = false;
  for (size_t i = 0; i < layers.size(); ++i) {
    const AttentionLayer& l = layers[i];
    if (l.kv_heads < 0 || l.k_head_dim < 0 || l.v_head_dim < 0 || l.latent_dim < 0) {
      fail(
          "attention geometry: layer {} has a negative dimension (KV heads {}, K head {}, "
          "V head {}, latent {})",
          i, l.kv_heads, l.k_head_dim, l.v_head_dim, l.latent_dim);
    }
    if (l.kv_heads > 0 && l.latent_dim > 0) {
      fail("attention geometry: layer {} has both KV heads and an MLA latent", i);
    }
    if (l.kv_heads > 0 && (l.k_head_dim == 0 || l.v_head_dim == 0)) {
      fail("attention geometry: layer {} has {} KV heads but a zero head dimension", i, l.kv_heads);
    }
    any_cache = any_cache || l.kv_heads > 0 || l.latent_dim > 0;
  }
  if (!any_cache) fail("attention geometry: no layer keeps a KV cache");
}

uint64_t layer_token_bytes(const AttentionLayer& layer, DType k_dtype, DType v_dtype) {
  if (layer.latent_dim > 0) return row_bytes_rounded(k_dtype, layer.latent_dim);
  const auto heads = static_cast<uint64_t>(layer.kv_heads);
  // Quantised keys: a block's channel slab spread over its tokens.
  const uint64_t k_bytes =
      block_elements(k_dtype) > 1
          ? ceil_div(
                heads * kernels::channel_slab_bytes(k_dtype, static_cast<size_t>(layer.k_head_dim)),
                kernels::kChannelTokens)
          : heads * row_bytes_rounded(k_dtype, layer.k_head_dim);
  return k_bytes + heads * row_bytes_rounded(v_dtype, layer.v_head_dim);
}

MemoryPlan plan_memory(const AttentionGeometry& geometry, const PlanOptions& options) {
  geometry.validate();
  if (options.block_tokens <= 0 || options.block_tokens > 4096) {
    fail("block size must be 1..4096 tokens, got {}", options.block_tokens);
  }
  if (block_elements(options.k_dtype) > 1 && options.block_tokens != kernels::kChannelTokens) {
    fail(
        "keys stored as {} are grouped per channel across a block of {} tokens; the block size "
        "is {} (use --block-tokens {})",
        dtype_name(options.k_dtype), kernels::kChannelTokens, options.block_tokens,
        kernels::kChannelTokens);
  }
  for (uint64_t c : options.contexts) {
    if (c == 0) fail("context length must be positive, got 0");
  }
  for (uint64_t n : options.concurrencies) {
    if (n == 0) fail("concurrency must be positive, got 0");
  }

  const Costing cost(geometry, options.k_dtype, options.v_dtype, options.block_tokens);
  MemoryPlan plan;
  plan.k_dtype = options.k_dtype;
  plan.v_dtype = options.v_dtype;
  plan.block_tokens = options.block_tokens;
  plan.pool_layout = cost.pool().has_value();
  plan.bytes_per_token = cost.bytes_per_token();
  plan.bytes_per_block = cost.bytes_per_block();
  plan.weights_bytes = options.weights_bytes;
  plan.budget_bytes = options.budget_bytes;
  plan.budget_includes_weights = options.budget_includes_weights;

  if (options.budget_bytes) {
    const uint64_t budget = *options.budget_bytes;
    if (options.budget_includes_weights && budget < options.weights_bytes) {
      fail(
          "budget of {} B ({}) is smaller than the weights, {} B ({}): nothing is left for the "
          "KV cache; raise the budget, or exclude the weights if they live elsewhere",
          budget, format_bytes(budget), options.weights_bytes, format_bytes(options.weights_bytes));
    }
    const uint64_t kv = options.budget_includes_weights ? budget - options.weights_bytes : budget;
    plan.kv_budget_bytes = kv;
    plan.pool_blocks = kv / plan.bytes_per_block;
    plan.pool_bytes = *plan.pool_blocks * plan.bytes_per_block;
    // Where windowed layers have blocks of their own, a token takes a block slot in each group.
    const uint64_t groups = cost.pool() ? static_cast<uint64_t>(cost.pool()->groups()) : 1;
    plan.pool_tokens = *plan.pool_blocks * static_cast<uint64_t>(plan.block_tokens) / groups;
  }

  for (uint64_t context : options.contexts) {
    RequestFigures r;
    r.context = context;
    const std::string what = fmt::format("one request of {} tokens", context);
    r.exact_bytes = narrow(cost.exact(context), what);
    r.allocated_bytes = narrow(cost.allocated(context), what);
    r.waste_bytes = r.allocated_bytes - r.exact_bytes;
    if (cost.blocked()) r.blocks = cost.blocks(context);
    if (plan.kv_budget_bytes) {
      r.max_concurrency =
          r.blocks ? *plan.pool_blocks / *r.blocks : *plan.kv_budget_bytes / r.allocated_bytes;
    }
    for (uint64_t n : options.concurrencies) {
      CellFigures cell;
      cell.context = context;
      cell.concurrency = n;
      const std::string cell_what = fmt::format("{} requests of {} tokens", n, context);
      cell.kv_bytes = narrow(Wide{r.allocated_bytes} * n, cell_what);
      cell.total_bytes = narrow(Wide{cell.kv_bytes} + plan.weights_bytes, cell_what);
      if (r.max_concurrency) cell.fits = n <= *r.max_concurrency;
      plan.cells.push_back(cell);
    }
    plan.requests.push_back(r);
  }

  for (uint64_t n : options.concurrencies) {
    ConcurrencyFigures limit;
    limit.concurrency = n;
    if (plan.kv_budget_bytes) limit.max_context = cost.max_context(n, *plan.kv_budget_bytes);
    plan.limits.push_back(limit);
  }
  return plan;
}

std::string kv_dtypes_name(DType k_dtype, DType v_dtype) {
  if (k_dtype == v_dtype) return std::string(dtype_name(k_dtype));
  return fmt::format("K {} / V {}", dtype_name(k_dtype), dtype_name(v_dtype));
}

std::string startup_summary(const KvGeometry& geometry, size_t pool_bytes, size_t context) {
  geometry.validate();
  PlanOptions options;
  options.k_dtype = geometry.k_dtype;
  options.v_dtype = geometry.v_dtype;
  options.block_tokens = geometry.block_tokens;
  options.budget_bytes = pool_bytes;
  options.budget_includes_weights = false;
  if (context > 0) {
    options.contexts = {context};
    options.concurrencies = {1};
  }
  const MemoryPlan plan = plan_memory(AttentionGeometry::from_kv_geometry(geometry), options);
  std::string out = fmt::format(
      "KV cache: {}, {}-token blocks, {} B/token, {} B/block, {} blocks = {} B ({}), holds {} "
      "tokens",
      kv_dtypes_name(plan.k_dtype, plan.v_dtype), plan.block_tokens, plan.bytes_per_token,
      plan.bytes_per_block, *plan.pool_blocks, *plan.pool_bytes, format_bytes(*plan.pool_bytes),
      *plan.pool_tokens);
  if (context > 0) {
    const RequestFigures& r = plan.requests.front();
    out += fmt::format(
        "\nKV cache: a {}-token request takes {} blocks = {} B ({}); {} such requests fit at once",
        context, *r.blocks, r.allocated_bytes, format_bytes(r.allocated_bytes), *r.max_concurrency);
  }
  return out;
}

}  // namespace kvc::kv
