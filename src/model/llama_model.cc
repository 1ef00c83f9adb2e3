#include "model/llama_model.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <utility>

#include "base/channel_keys.h"
#include "base/error.h"
#include "base/kernels.h"
#include "base/kv_attention.h"

namespace kvc::model {

std::unique_ptr<LlamaModel> LlamaModel::load(const std::string& path, gguf::Residency residency) {
  return from_file(std::shared_ptr<const gguf::File>(gguf::File::open(path, residency)));
}

std::unique_ptr<LlamaModel> LlamaModel::from_file(std::shared_ptr<const gguf::File> file) {
  std::unique_ptr<LlamaModel> m(new LlamaModel());
  m->file_ = std::move(file);
  m->config_ = LlamaConfig::from_gguf(*m->file_);
  m->bind_weights();
  return m;
}

const gguf::TensorInfo& LlamaModel::bind(const std::string& name) {
  const gguf::TensorInfo& t = file_->tensor(name);
  bound_[static_cast<size_t>(&t - file_->tensors().data())] = true;
  return t;
}

WeightView LlamaModel::matrix(const std::string& name, size_t in_dim, size_t out_dim) {
  const gguf::TensorInfo& t = bind(name);
  if (t.dims.size() != 2 || t.dims[0] != in_dim || t.dims[1] != out_dim) {
    std::string got;
    for (uint64_t d : t.dims) got += (got.empty() ? "" : ", ") + std::to_string(d);
    fail("{}: tensor '{}' has shape [{}], expected [{}, {}]", file_->label(), name, got, in_dim,
         out_dim);
  }
  return WeightView{t.dtype, t.data, out_dim, in_dim};
}

WeightView LlamaModel::rows_of(const WeightView& w, size_t first, size_t count) {
  return WeightView{w.dtype, w.row(first), count, w.in_dim};
}

std::vector<float> LlamaModel::vector(const std::string& name, size_t n) {
  const gguf::TensorInfo& t = bind(name);
  if (t.dims.size() != 1 || t.dims[0] != n) {
    fail("{}: tensor '{}' should be a vector of {} elements", file_->label(), name, n);
  }
  std::vector<float> out(n);
  dequantize_row(t.dtype, t.data, out.data(), n);
  return out;
}

namespace {

// The layer count the file's tensors give: one more than the highest N of a blk.N.* tensor
// (0 when there is none).
uint64_t layers_in_tensors(const gguf::File& file) {
  constexpr std::string_view kPrefix = "blk.";
  uint64_t layers = 0;
  for (const gguf::TensorInfo& t : file.tensors()) {
    if (!t.name.starts_with(kPrefix)) continue;
    uint64_t index = 0;
    size_t i = kPrefix.size();
    // Ten digits at most: a bigger index is no layer block_count can name.
    for (; i < t.name.size() && i < kPrefix.size() + 10 && t.name[i] >= '0' && t.name[i] <= '9';
         ++i) {
      index = index * 10 + static_cast<uint64_t>(t.name[i] - '0');
    }
    if (i == kPrefix.size() || i == t.name.size() || t.name[i] != '.') continue;
    layers = std::max(layers, index + 1);
  }
  return layers;
}

}  // namespace

void LlamaModel::bind_weights() {
  const LlamaConfig& c = config_;
  const size_t d = c.n_embd;
  // Checked before layers are sized by it: a corrupt count would otherwise allocate for millions
  // of layers, or load a file with fewer while ignoring the rest.
  const uint64_t layers = layers_in_tensors(*file_);
  if (layers == 0) {
    fail("{}: {}.block_count is {} but the file has no layer tensors (blk.N.*)", file_->label(),
         c.architecture, c.n_layers);
  }
  if (layers != static_cast<uint64_t>(c.n_layers)) {
    fail("{}: {}.block_count is {} but the file's tensors are of {} layers (blk.0 to blk.{})",
         file_->label(), c.architecture, c.n_layers, layers, layers - 1);
  }
  bound_.assign(file_->tensors().size(), false);
  token_embd_ = &bind("token_embd.weight");
  const WeightView embd = matrix("token_embd.weight", d, c.n_vocab);
  output_norm_ = vector("output_norm.weight", d);
  // Without output.weight the classifier is tied to the embedding.
  output_ = file_->find_tensor("output.weight") ? matrix("output.weight", d, c.n_vocab) : embd;
  // Per-pair rope factors: Llama 3.1's rope_freqs, else LongRoPE's long factors when the
  // context kvcache runs with (the file's) exceeds the one the short factors were made for, as
  // llama.cpp chooses at that context. The choice is fixed per file, so cached keys stay valid.
  const std::string factors_name =
      file_->find_tensor("rope_freqs.weight") != nullptr ? "rope_freqs.weight"
      : c.context_length > c.rope_original_context       ? "rope_factors_long.weight"
                                                         : "rope_factors_short.weight";
  // Phi-3 files carry both LongRoPE sets; the one not chosen is deliberately left unread.
  for (const char* pair : {"rope_factors_long.weight", "rope_factors_short.weight"}) {
    const gguf::TensorInfo* other = file_->find_tensor(pair);
    if (other != nullptr && factors_name.starts_with("rope_factors_")) {
      bound_[static_cast<size_t>(other - file_->tensors().data())] = true;
    }
  }
  if (file_->find_tensor(factors_name) != nullptr) {
    rope_freq_factors_ = vector(factors_name, c.n_rot / 2);
    for (float f : rope_freq_factors_) {
      if (!(f > 0.0f) || !std::isfinite(f)) {
        fail("{}: {} holds {}; every factor must be positive and finite", file_->label(),
             factors_name, f);
      }
    }
  }
  layers_.resize(c.n_layers);
  uint64_t matrices = 0;
  for (int l = 0; l < c.n_layers; ++l) {
    const std::string p = "blk." + std::to_string(l) + ".";
    LayerWeights& w = layers_[l];
    w.attn_norm = vector(p + "attn_norm.weight", d);
    w.ffn_norm = vector(p + "ffn_norm.weight", d);
    // phi3 fuses Q, K and V into one matrix, and the FFN's gate and up (gate first): their
    // parts are views of consecutive rows, computed exactly as separate matrices would be.
    if (file_->find_tensor(p + "attn_qkv.weight") != nullptr) {
      const WeightView qkv = matrix(p + "attn_qkv.weight", d, c.q_dim() + 2 * c.kv_dim());
      w.wq = rows_of(qkv, 0, c.q_dim());
      w.wk = rows_of(qkv, c.q_dim(), c.kv_dim());
      w.wv = rows_of(qkv, c.q_dim() + c.kv_dim(), c.kv_dim());
    } else {
      w.wq = matrix(p + "attn_q.weight", d, c.q_dim());
      w.wk = matrix(p + "attn_k.weight", d, c.kv_dim());
      w.wv = matrix(p + "attn_v.weight", d, c.kv_dim());
    }
    w.wo = matrix(p + "attn_output.weight", c.q_dim(), d);
    if (file_->find_tensor(p + "ffn_gate.weight") == nullptr && c.architecture == "phi3") {
      const WeightView gate_up = matrix(p + "ffn_up.weight", d, 2 * static_cast<size_t>(c.n_ff));
      w.w_gate = rows_of(gate_up, 0, c.n_ff);
      w.w_up = rows_of(gate_up, c.n_ff, c.n_ff);
    } else {
      w.w_gate = matrix(p + "ffn_gate.weight", d, c.n_ff);
      w.w_up = matrix(p + "ffn_up.weight", d, c.n_ff);
    }
    w.w_down = matrix(p + "ffn_down.weight", c.n_ff, d);
    const auto optional_vector = [&](const std::string& name, size_t n) {
      return file_->find_tensor(name) != nullptr ? vector(name, n) : std::vector<float>{};
    };
    w.q_bias = optional_vector(p + "attn_q.bias", c.q_dim());
    w.k_bias = optional_vector(p + "attn_k.bias", c.kv_dim());
    w.v_bias = optional_vector(p + "attn_v.bias", c.kv_dim());
    if (c.qk_norm) {
      w.q_norm = vector(p + "attn_q_norm.weight", c.head_dim);
      w.k_norm = vector(p + "attn_k_norm.weight", c.head_dim);
    }
    if (c.post_norms) {
      w.post_attn_norm = vector(p + "post_attention_norm.weight", d);
      w.post_ffn_norm = vector(p + "post_ffw_norm.weight", d);
    }
    for (const WeightView* v : {&w.wq, &w.wk, &w.wv, &w.wo, &w.w_gate, &w.w_up, &w.w_down}) {
      matrices += v->row_stride() * v->out_dim;
      layer_matrix_elements_ += v->in_dim * v->out_dim;
    }
  }
  // As llama.cpp ("wrong number of tensors"): a tensor nothing reads means the file is not the
  // model its metadata describes (extra layers, biases or experts kvcache would silently skip).
  const auto unused = std::find(bound_.begin(), bound_.end(), false);
  if (unused != bound_.end()) {
    fail(
        "{}: tensor '{}' is not used by this {}-layer {} model ({} of the file's {} tensors are "
        "unused): the file does not match its metadata",
        file_->label(), file_->tensors()[static_cast<size_t>(unused - bound_.begin())].name,
        c.n_layers, c.architecture, std::count(bound_.begin(), bound_.end(), false), bound_.size());
  }
  bound_.clear();
  bound_.shrink_to_fit();
  bytes_read_per_token_ = matrices + output_.row_stride() * output_.out_dim;
  for (const auto& t : file_->tensors()) weight_bytes_ += t.bytes;
}

uint64_t LlamaModel::multiply_adds(int start, int tokens) const {
  if (tokens <= 0) return 0;
  const auto& c = config_;
  uint64_t keys_seen = 0;  // summed over layers and positions
  for (int l = 0; l < c.n_layers; ++l) {
    for (int64_t p = start; p < start + tokens; ++p) {
      keys_seen += c.layer_slides(l) ? std::min<int64_t>(p + 1, c.sliding_window) : p + 1;
    }
  }
  // Per key, each query head takes head_dim multiply-adds for its score and head_dim for the
  // weighted value.
  return layer_matrix_elements_ * static_cast<uint64_t>(tokens) +
         2 * static_cast<uint64_t>(c.q_dim()) * keys_seen + output_.in_dim * output_.out_dim;
}

namespace {

void rms_norm(const float* x, const float* weight, float* out, size_t n, float eps) {
  float sum = 0.0f;
  for (size_t i = 0; i < n; ++i) sum += x[i] * x[i];
  const float scale = 1.0f / std::sqrt(sum / static_cast<float>(n) + eps);
  for (size_t i = 0; i < n; ++i) out[i] = x[i] * scale * weight[i];
}

// Rotates each head's pairs by their angles: adjacent pairs (x[2i], x[2i+1]) as llama.cpp's
// normal mode, or halves (x[i], x[i + n_rot/2]) as its NEOX mode.
void apply_rope(float* x, int n_heads, int head_dim, int n_rot, RopeLayout layout,
                const float* cos_t, const float* sin_t) {
  const int half = n_rot / 2;
  for (int h = 0; h < n_heads; ++h) {
    float* v = x + static_cast<size_t>(h) * head_dim;
    for (int i = 0; i < half; ++i) {
      const int ia = layout == RopeLayout::kAdjacent ? 2 * i : i;
      const int ib = layout == RopeLayout::kAdjacent ? 2 * i + 1 : i + half;
      const float a = v[ia], b = v[ib];
      v[ia] = a * cos_t[i] - b * sin_t[i];
      v[ib] = a * sin_t[i] + b * cos_t[i];
    }
  }
}

// x = cap * tanh(x / cap), gemma2's soft limit on attention scores and logits.
void soft_cap(float* x, size_t n, float cap) {
  for (size_t i = 0; i < n; ++i) x[i] = cap * std::tanh(x[i] / cap);
}

// GELU in its tanh form, as llama.cpp's gelu.
float gelu(float x) {
  constexpr float kSqrt2OverPi = 0.7978845608028654f;
  return 0.5f * x * (1.0f + std::tanh(kSqrt2OverPi * x * (1.0f + 0.044715f * x * x)));
}

void add_bias(float* x, const std::vector<float>& bias) {
  for (size_t i = 0; i < bias.size(); ++i) x[i] += bias[i];
}

// RMS-normalises each head of x in place with the per-head weight (qwen3's Q/K norm).
void norm_heads(float* x, int n_heads, int head_dim, const std::vector<float>& weight, float eps) {
  for (int h = 0; h < n_heads; ++h) {
    float* v = x + static_cast<size_t>(h) * head_dim;
    rms_norm(v, weight.data(), v, head_dim, eps);
  }
}

// Consecutive rows of one sequence, attended together (a tile of queries).
struct QueryTile {
  size_t first_row = 0;
  size_t rows = 0;
};

// Splits rows into tiles of at most max_rows consecutive rows that share their first KV block:
// rows of one sequence, or of sequences that share a cached prefix (cascade attention: each
// shared block is then read once for all of them).
std::vector<QueryTile> query_tiles(std::span<const BatchRow> rows, size_t max_rows) {
  std::vector<QueryTile> tiles;
  for (size_t r = 0; r < rows.size(); ++r) {
    const kv::BlockTable& first = *rows[tiles.empty() ? r : tiles.back().first_row].table;
    // Holes (blocks released behind a window) say nothing about sharing.
    const kv::BlockId front = rows[r].table->blocks().front();
    if (tiles.empty() || tiles.back().rows == max_rows ||
        (rows[r].table != &first &&
         (front == kv::BlockTable::kNoBlock || front != first.blocks().front()))) {
      tiles.push_back({r, 0});
    }
    ++tiles.back().rows;
  }
  return tiles;
}

// Whole-block readers of one block position, across the sequences of a tile, grouped by the
// block each reads.
struct BlockReaders {
  std::vector<std::pair<kv::BlockId, size_t>> full;  // (block, query)
  std::vector<size_t> queries;                       // a group's queries, in order

  // Calls fn(block, queries) for each group of queries reading the same block, in order of
  // block id then query.
  template <class Fn>
  void for_each_group(Fn&& fn) {
    std::sort(full.begin(), full.end());
    for (size_t i = 0; i < full.size();) {
      queries.clear();
      size_t e = i;
      for (; e < full.size() && full[e].first == full[i].first; ++e) {
        queries.push_back(full[e].second);
      }
      fn(full[i].first, std::span<const size_t>(queries));
      i = e;
    }
  }
};

}  // namespace

void LlamaModel::attention(ThreadPool& threads, kv::BlockPool& pool, std::span<const BatchRow> rows,
                           int layer, int kv_layer, std::span<const uint16_t* const> own_keys,
                           ForwardScratch& s) const {
  const LlamaConfig& c = config_;
  const kv::KvGeometry& g = pool.geometry();
  const int hd = c.head_dim;
  const int group = c.n_heads / c.n_kv_heads;
  const size_t window = c.layer_slides(layer) ? static_cast<size_t>(c.sliding_window) : 0;
  const float scale =
      c.attention_scale > 0.0f ? c.attention_scale : 1.0f / std::sqrt(static_cast<float>(hd));
  const int bt = g.block_tokens;
  const bool channel_keys = g.keys_by_channel();
  const size_t channel_slab = kernels::channel_slab_bytes(g.k_dtype, static_cast<size_t>(hd));
  // A task is one KV head of one tile of rows (of one sequence, or of sequences sharing a
  // prefix): every query of the tile (its rows times the heads of the GQA group) that reads a
  // block reads it while it is in the first-level cache, instead of each query streaming the
  // whole context. Each query's scores, softmax and weighted sum still run alone, in block
  // order, through the same kernels, so a row's result does not depend on the tile it falls in.
  // Thirty-two queries of a head of 64 or more: their scores at a depth of 4,096 (590 KB) still
  // fit a Zen 4's second-level cache, and each key and value read serves twice the work of
  // sixteen (measured, 110M prefill of 512 tokens at depth 4,096: 6-37% faster; 64 gained no
  // more). Smaller heads (stories260K's 8) take more queries per tile, as many as a head of 64
  // would take in multiply-adds, while their scores fit in kScoreBytes, so that each block's
  // visit and kernel calls serve enough work.
  constexpr size_t kTileQueries = 32, kScoreBytes = 256 * 1024;
  size_t max_pos = 0;
  for (const BatchRow& row : rows) max_pos = std::max<size_t>(max_pos, row.pos);
  const size_t tile_queries =
      hd >= 64 ? kTileQueries
               : std::clamp<size_t>(kScoreBytes / ((max_pos + 1) * sizeof(float)), kTileQueries,
                                    kTileQueries * 64 / static_cast<size_t>(hd));
  const std::vector<QueryTile> tiles =
      query_tiles(rows, std::max<size_t>(1, tile_queries / static_cast<size_t>(group)));
  const size_t tasks = tiles.size() * static_cast<size_t>(c.n_kv_heads);
  // Each task reads up to (max_pos + 1) keys and values of head_dim each.
  const size_t grain = std::max<size_t>(1, 8192 / ((max_pos + 1) * hd));
  threads.parallel_for(
      tasks,
      [&](size_t begin, size_t end) {
        std::vector<float> scores, sums;
        std::vector<size_t> n_pos, first_key, everyone;
        std::vector<const float*> q_at, q_ptrs, p_ptrs;
        std::vector<float*> attn_at;
        std::vector<float*> out_ptrs;
        BlockReaders readers;
        std::vector<size_t> members;
        for (size_t task = begin; task < end; ++task) {
          // Heads outermost: a thread's share of the tasks is whole heads, each over every
          // tile, so causal tiles (later ones attend further) are spread evenly.
          const QueryTile& tile = tiles[task % tiles.size()];
          const int kvh = static_cast<int>(task / tiles.size());
          const size_t queries = tile.rows * static_cast<size_t>(group);
          // Query j is head kvh * group + j % group of row first_row + j / group.
          const auto q_of = [&](size_t j) {
            const size_t r = tile.first_row + j / group;
            const size_t h = static_cast<size_t>(kvh) * group + j % group;
            return r * c.q_dim() + h * hd;
          };
          n_pos.resize(queries);
          first_key.resize(queries);
          q_at.resize(queries);
          attn_at.resize(queries);
          everyone.resize(queries);
          size_t longest = 0, shortest = SIZE_MAX, first_block = SIZE_MAX, last_first_key = 0;
          for (size_t j = 0; j < queries; ++j) {
            n_pos[j] = static_cast<size_t>(rows[tile.first_row + j / group].pos) + 1;
            first_key[j] = window > 0 && n_pos[j] > window ? n_pos[j] - window : 0;
            q_at[j] = s.q.data() + q_of(j);
            attn_at[j] = s.attn.data() + q_of(j);
            everyone[j] = j;
            longest = std::max(longest, n_pos[j]);
            shortest = std::min(shortest, n_pos[j]);
            first_block = std::min(first_block, first_key[j] / bt * bt);
            last_first_key = std::max(last_first_key, first_key[j]);
          }
          // Query j's scores and weights cover the blocks from the one holding its first key;
          // those before its window inside that block get weight 0.
          const auto sees_block = [&](size_t j, size_t t0) {
            return t0 < n_pos[j] && t0 + bt > first_key[j];
          };
          scores.resize(queries * longest);
          const kv::KvRun k_run = g.run(kv_layer, 0, kvh);
          const kv::KvRun v_run = g.run(kv_layer, 1, kvh);
          // Keys and values of one (layer, kv head) sit at a fixed stride within each block: score
          // and accumulate a block's run of positions at a time, in position order, reading the
          // stored bytes in place whatever their dtype.
          // The block of query j's sequence that holds position t0.
          const auto block_of = [&](size_t j, size_t t0) {
            return rows[tile.first_row + j / group].table->block_of(t0);
          };
          const auto kv_rows = [&](DType dtype, kv::BlockId id, const kv::KvRun& run) {
            return kernels::KvRows{dtype, pool.data(id) + run.offset, run.stride, run.first,
                                   run.stride == 0};
          };
          // Keys grouped per channel: query j's own block, as f16 (see forward()).
          const auto own_block_keys = [&](size_t j) {
            const uint16_t* keys = own_keys[tile.first_row + j / group] +
                                   static_cast<size_t>(kvh) * bt * static_cast<size_t>(hd);
            return kernels::KvRows{DType::F16, reinterpret_cast<const uint8_t*>(keys),
                                   static_cast<size_t>(hd) * sizeof(uint16_t), 0};
          };
          // A (layer, kv head)'s keys or values of one block are a few KiB or less, and
          // consecutive blocks lie anywhere in the pool, where the hardware prefetchers cannot
          // follow: the block's first kernel call requests the run about kPrefetchBytes ahead (at
          // least two blocks) as it reads its own, a few lines with each row. Tiles of many
          // queries need it too (measured: 16 sequences decoding after a shared prompt, and
          // TinyLlama's 8 query heads per KV head at depth, gained 6-28%).
          constexpr size_t kPrefetchBytes = 8192;
          const kv::BlockTable& lead = *rows[tile.first_row].table;
          const auto run_ahead = [&](size_t t0, const kv::KvRun& run) -> const uint8_t* {
            const size_t run_bytes = run.stride == 0 ? channel_slab : bt * run.stride;
            const size_t blocks_ahead = std::clamp<size_t>(kPrefetchBytes / run_bytes, 2, 16);
            const size_t ahead = t0 + blocks_ahead * bt;
            // The lead sequence may be shorter than the tile's longest (a shared prefix).
            if (ahead >= std::min(longest, lead.capacity_tokens()) ||
                lead.block_of(ahead) == kv::BlockTable::kNoBlock) {
              return nullptr;
            }
            return pool.data(lead.block_of(ahead)) + run.offset;
          };
          // Calls partial(j, block, n) for each query that sees only the first n positions of
          // block position t0, and whole(block, queries) for those that see all of it, grouped
          // by the block they read (one group when the tile is one sequence).
          const bool one_table =
              std::all_of(rows.begin() + tile.first_row, rows.begin() + tile.first_row + tile.rows,
                          [&](const BatchRow& r) { return r.table == &lead; });
          // Positions before shared_tokens lie in blocks every row's table shares with lead's.
          size_t shared_tokens = lead.capacity_tokens();
          for (size_t r = tile.first_row; r < tile.first_row + tile.rows; ++r) {
            if (rows[r].table == &lead) continue;
            const std::vector<kv::BlockId>& mine = rows[r].table->blocks();
            const std::vector<kv::BlockId>& theirs = lead.blocks();
            size_t b = 0;
            const size_t n_blocks =
                std::min({mine.size(), theirs.size(), shared_tokens / static_cast<size_t>(bt)});
            while (b < n_blocks && mine[b] == theirs[b]) ++b;
            shared_tokens = b * static_cast<size_t>(bt);
          }
          // With own_apart (keys grouped per channel), a query's own block is read apart even
          // when the query sees all of it.
          const auto visit = [&](size_t t0, bool own_apart, auto&& partial, auto&& whole) {
            // Every query sees the whole block, which all of their sequences hold (the common
            // case, away from the causal diagonal and the window's edge): one group of them all.
            if (t0 + static_cast<size_t>(bt) <= shared_tokens && t0 >= last_first_key &&
                t0 + static_cast<size_t>(bt) + (own_apart ? 1 : 0) <= shortest) {
              whole(lead.block_of(t0), std::span<const size_t>(everyone));
              return;
            }
            members.clear();
            readers.full.clear();
            const kv::BlockId lead_block = one_table ? lead.block_of(t0) : kv::BlockId{};
            for (size_t j = 0; j < queries; ++j) {
              if (!sees_block(j, t0)) continue;
              const size_t n = std::min<size_t>(bt, n_pos[j] - t0);
              const kv::BlockId id = one_table ? lead_block : block_of(j, t0);
              if (n < static_cast<size_t>(bt) ||
                  (own_apart && n_pos[j] - t0 <= static_cast<size_t>(bt))) {
                partial(j, id, n);
              } else if (one_table) {
                members.push_back(j);
              } else {
                readers.full.emplace_back(id, j);
              }
            }
            if (!members.empty()) whole(lead_block, std::span<const size_t>(members));
            if (!readers.full.empty()) readers.for_each_group(whole);
          };
          for (size_t t0 = first_block; t0 < longest; t0 += bt) {
            const uint8_t* k_ahead = run_ahead(t0, k_run);
            // The queries that see a whole block share each key row's read (the queries of
            // sequences sharing a prefix included); those whose causal limit falls inside it
            // score their own prefix of it.
            visit(
                t0, channel_keys,
                [&](size_t j, kv::BlockId id, size_t n) {
                  kernels::kv_scores(
                      channel_keys ? own_block_keys(j) : kv_rows(g.k_dtype, id, k_run), q_at[j], n,
                      hd, scale, scores.data() + j * longest + t0);
                },
                [&](kv::BlockId id, std::span<const size_t> js) {
                  q_ptrs.clear();
                  out_ptrs.clear();
                  for (size_t j : js) {
                    q_ptrs.push_back(q_at[j]);
                    out_ptrs.push_back(scores.data() + j * longest + t0);
                  }
                  kernels::KvRows keys = kv_rows(g.k_dtype, id, k_run);
                  keys.ahead = std::exchange(k_ahead, nullptr);
                  kernels::kv_scores_queries(keys, q_ptrs.data(), q_ptrs.size(), bt, hd, scale,
                                             out_ptrs.data());
                });
          }
          sums.resize(queries);
          for (size_t j = 0; j < queries; ++j) {
            float* p = scores.data() + j * longest;
            const size_t begin = first_key[j] / bt * bt, first = first_key[j], end = n_pos[j];
            if (c.attn_softcap > 0.0f) soft_cap(p + first, end - first, c.attn_softcap);
            std::fill(p + begin, p + first, 0.0f);
            sums[j] = kernels::softmax_exp(p + first, end - first);
            std::fill_n(attn_at[j], hd, 0.0f);
          }
          for (size_t t0 = first_block; t0 < longest; t0 += bt) {
            const uint8_t* v_ahead = run_ahead(t0, v_run);
            // As with the keys: the queries that weigh a whole block share each row's read.
            visit(
                t0, false,
                [&](size_t j, kv::BlockId id, size_t n) {
                  kernels::kv_accumulate(kv_rows(g.v_dtype, id, v_run),
                                         scores.data() + j * longest + t0, n, hd, attn_at[j]);
                },
                [&](kv::BlockId id, std::span<const size_t> js) {
                  p_ptrs.clear();
                  out_ptrs.clear();
                  for (size_t j : js) {
                    p_ptrs.push_back(scores.data() + j * longest + t0);
                    out_ptrs.push_back(attn_at[j]);
                  }
                  kernels::KvRows values = kv_rows(g.v_dtype, id, v_run);
                  values.ahead = std::exchange(v_ahead, nullptr);
                  kernels::kv_accumulate_queries(values, p_ptrs.data(), p_ptrs.size(), bt, hd,
                                                 out_ptrs.data());
                });
          }
          for (size_t j = 0; j < queries; ++j) {
            float* out = attn_at[j];
            const float inv = 1.0f / sums[j];
            for (int i = 0; i < hd; ++i) out[i] *= inv;
          }
        }
      },
      // A causal tile's cost grows with its position, so its timings teach no thread shares.
      grain, /*equal_items=*/false);
}

std::span<const float> LlamaModel::forward(ThreadPool& threads, kv::BlockPool& pool,
                                           std::span<const BatchRow> rows,
                                           ForwardScratch& s) const {
  const LlamaConfig& c = config_;
  const kv::KvGeometry& g = pool.geometry();
  // Where only some layers slide the pool may split them into two groups of blocks
  // (LlamaConfig::kv_cache_geometry), each row then holding a table of each.
  const bool split = g.split_window > 0;
  int group_layers = c.n_layers;
  if (split) {
    if (g.split_window != c.kv_split_window()) {
      fail("KV pool splits windowed layers at {} tokens but the model's window is {}",
           g.split_window, c.kv_split_window());
    }
    group_layers = 0;
    for (int l = 0; l < c.n_layers; ++l) {
      group_layers = std::max(group_layers, c.kv_slot(l).second + 1);
    }
  }
  if (g.n_layers != group_layers || g.n_kv_heads != c.n_kv_heads || g.head_dim != c.head_dim) {
    fail(
        "KV pool geometry ({} layers, {} KV heads, head dim {}) does not match the model "
        "({}, {}, {})",
        g.n_layers, g.n_kv_heads, g.head_dim, c.n_layers, c.n_kv_heads, c.head_dim);
  }
  const size_t n = rows.size();
  const size_t d = c.n_embd;
  size_t n_logits = 0;
  for (const BatchRow& row : rows) {
    if (row.token < 0 || row.token >= c.n_vocab) {
      fail("token id {} is outside the vocabulary of {} tokens", row.token, c.n_vocab);
    }
    if (row.table == nullptr || &row.table->pool() != &pool || row.pos < 0 ||
        static_cast<size_t>(row.pos) >= row.table->capacity_tokens()) {
      fail("position {} is not covered by its sequence's KV blocks", row.pos);
    }
    if (split && (row.window_table == nullptr || &row.window_table->pool() != &pool ||
                  static_cast<size_t>(row.pos) >= row.window_table->capacity_tokens())) {
      fail("position {} is not covered by its sequence's windowed layers' KV blocks", row.pos);
    }
    // A table releases the blocks behind its layers' window (KvGeometry::window_tokens); the
    // keys a row reads must still be held.
    const auto check_held = [&](const kv::BlockTable& table, int window) {
      const auto p = static_cast<size_t>(row.pos);
      const auto w = static_cast<size_t>(window);
      const size_t first_key = w > 0 && p + 1 > w ? p + 1 - w : 0;
      if (first_key / static_cast<size_t>(g.block_tokens) < table.first_held()) {
        fail("position {} reads keys from position {}, whose block its sequence has released",
             row.pos, first_key);
      }
    };
    check_held(*row.table, c.kv_window());
    if (split) check_held(*row.window_table, c.kv_split_window());
    n_logits += row.want_logits ? 1 : 0;
  }

  s.x.resize(n * d);
  s.xb.resize(n * d);
  s.q.resize(n * c.q_dim());
  s.k.resize(n * c.kv_dim());
  s.v.resize(n * c.kv_dim());
  s.attn.resize(n * c.q_dim());
  s.gate.resize(n * c.n_ff);
  s.up.resize(n * c.n_ff);
  const int half_rot = c.n_rot / 2;
  s.rope_cos.resize(n * half_rot);
  s.rope_sin.resize(n * half_rot);

  const size_t embd_row = row_bytes(token_embd_->dtype, d);
  for (size_t r = 0; r < n; ++r) {
    dequantize_row(token_embd_->dtype, token_embd_->data + rows[r].token * embd_row,
                   s.x.data() + r * d, d);
    if (c.embedding_scale > 0.0f) {
      for (size_t i = 0; i < d; ++i) s.x[r * d + i] *= c.embedding_scale;
    }
    for (int i = 0; i < half_rot; ++i) {
      const double freq = std::pow(static_cast<double>(c.rope_theta), -2.0 * i / c.n_rot);
      const double factor = rope_freq_factors_.empty() ? 1.0 : rope_freq_factors_[i];
      // As llama.cpp: the position's angle divided by the pair's factor, then scaled linearly.
      const double angle = c.rope_freq_scale * (rows[r].pos * freq / factor);
      s.rope_cos[r * half_rot + i] = static_cast<float>(std::cos(angle)) * c.rope_attn_factor;
      s.rope_sin[r * half_rot + i] = static_cast<float>(std::sin(angle)) * c.rope_attn_factor;
    }
  }

  // xb = RMSNorm(x) * weight, row by row.
  const auto norm_rows = [&](const std::vector<float>& weight) {
    threads.parallel_for(
        n,
        [&](size_t b, size_t e) {
          for (size_t r = b; r < e; ++r) {
            rms_norm(&s.x[r * d], weight.data(), &s.xb[r * d], d, c.rms_eps);
          }
        },
        std::max<size_t>(1, (1 << 14) / d));
  };
  // gemma2's norms after attention and after the FFN: xb = RMSNorm(xb) * weight, row by row
  // (nothing without them).
  const auto norm_in_place = [&](const std::vector<float>& weight) {
    if (weight.empty()) return;
    for (size_t r = 0; r < n; ++r) {
      rms_norm(&s.xb[r * d], weight.data(), &s.xb[r * d], d, c.rms_eps);
    }
  };
  // Keys grouped per channel (quantised keys) are quantised a block at a time: each row's key
  // goes, as f16, into the staging area of its (sequence, block), which is the sequence's open
  // keys for the block it continues and scratch for the blocks after it in this batch. A block
  // whose last token is in the batch is quantised before attention, so later rows read it as
  // every later step will; each row reads its own block's keys as f16, as a decode step does.
  const bool channel_keys = g.keys_by_channel();
  const size_t bt = static_cast<size_t>(g.block_tokens);
  struct KeyBlock {
    const kv::BlockTable* table;
    size_t index;       // the block's position in the table
    int last_slot = 0;  // the batch's last slot in it
    bool open = false;  // staged in the table's open keys (else scratch area `area`)
    size_t area = 0;
  };
  // The rows as each group of layers sees them: with their full layers' tables, and (split)
  // with their windowed layers' tables.
  std::vector<BatchRow> window_rows;
  if (split) {
    window_rows.assign(rows.begin(), rows.end());
    for (BatchRow& row : window_rows) row.table = row.window_table;
  }
  const std::span<const BatchRow> group_rows[2] = {rows, window_rows};
  std::vector<KeyBlock> key_blocks[2];
  std::vector<size_t> key_block_of_row[2];
  size_t areas = 0;
  for (int group = 0; channel_keys && group < (split ? 2 : 1); ++group) {
    const std::span<const BatchRow> grows = group_rows[group];
    std::vector<KeyBlock>& blocks = key_blocks[group];
    key_block_of_row[group].resize(n);
    for (size_t r = 0; r < n; ++r) {
      const size_t index = static_cast<size_t>(grows[r].pos) / bt;
      const int slot = static_cast<int>(static_cast<size_t>(grows[r].pos) % bt);
      const auto same = [&](const KeyBlock& b) {
        return b.table == grows[r].table && b.index == index;
      };
      auto it = std::find_if(blocks.begin(), blocks.end(), same);
      if (it == blocks.end()) {
        const bool table_seen = std::any_of(blocks.begin(), blocks.end(), [&](const KeyBlock& b) {
          return b.table == grows[r].table;
        });
        if (grows[r].table->open_key_blocks().size() != g.open_key_blocks()) {
          fail("a sequence's table holds no open-key blocks for its quantised keys (reserve it)");
        }
        blocks.push_back({grows[r].table, index, slot, !table_seen, 0});
        it = std::prev(blocks.end());
      }
      it->last_slot = std::max(it->last_slot, slot);
      key_block_of_row[group][r] = static_cast<size_t>(it - blocks.begin());
    }
    for (KeyBlock& b : blocks) {
      if (!b.open) b.area = areas++;
    }
  }
  if (channel_keys) s.staged_keys.resize(areas * g.open_layer_bytes() / sizeof(uint16_t));
  const size_t head_keys = bt * static_cast<size_t>(c.head_dim);  // one head's staged keys
  std::vector<const uint16_t*> own_keys(channel_keys ? n : 0);
  const auto staged = [&](const KeyBlock& b, int kv_layer) {
    return b.open ? b.table->open_keys(kv_layer)
                  : s.staged_keys.data() + b.area * c.n_kv_heads * head_keys;
  };
  for (int l = 0; l < c.n_layers; ++l) {
    const LayerWeights& w = layers_[l];
    const auto [group, kl] = split ? c.kv_slot(l) : std::pair{0, l};
    const std::span<const BatchRow> grows = group_rows[group];
    const std::vector<KeyBlock>& blocks = key_blocks[group];
    norm_rows(w.attn_norm);
    const WeightView qkv[] = {w.wq, w.wk, w.wv};
    float* const qkv_out[] = {s.q.data(), s.k.data(), s.v.data()};
    matmul_stacked(threads, qkv, s.xb.data(), n, qkv_out, s.activations);
    for (size_t r = 0; r < n; ++r) {
      const float* cs = &s.rope_cos[r * half_rot];
      const float* sn = &s.rope_sin[r * half_rot];
      float* q = &s.q[r * c.q_dim()];
      float* k = &s.k[r * c.kv_dim()];
      add_bias(q, w.q_bias);
      add_bias(k, w.k_bias);
      add_bias(&s.v[r * c.kv_dim()], w.v_bias);
      if (c.qk_norm) {
        norm_heads(q, c.n_heads, c.head_dim, w.q_norm, c.rms_eps);
        norm_heads(k, c.n_kv_heads, c.head_dim, w.k_norm, c.rms_eps);
      }
      apply_rope(q, c.n_heads, c.head_dim, c.n_rot, c.rope_layout, cs, sn);
      apply_rope(k, c.n_kv_heads, c.head_dim, c.n_rot, c.rope_layout, cs, sn);
      const kv::BlockTable& table = *grows[r].table;
      uint8_t* block = pool.data(table.block_of(rows[r].pos));
      const int slot = table.slot_of(rows[r].pos);
      if (channel_keys) {
        uint16_t* keys = staged(blocks[key_block_of_row[group][r]], kl);
        for (int h = 0; h < c.n_kv_heads; ++h) {
          kernels::quantize(DType::F16, k + h * c.head_dim,
                            reinterpret_cast<uint8_t*>(keys + h * head_keys + slot * c.head_dim),
                            static_cast<size_t>(c.head_dim));
        }
      } else {
        g.store_token(block, kl, 0, slot, k);
      }
      g.store_token(block, kl, 1, slot, &s.v[r * c.kv_dim()]);
    }
    if (channel_keys) {
      for (const KeyBlock& b : blocks) {
        if (b.last_slot + 1 == g.block_tokens) {
          g.store_block_keys(pool.data(b.table->blocks()[b.index]), kl, staged(b, kl));
        }
      }
      for (size_t r = 0; r < n; ++r) own_keys[r] = staged(blocks[key_block_of_row[group][r]], kl);
    }
    attention(threads, pool, grows, l, kl, own_keys, s);
    // A sequence's last block still partly filled keeps its keys in the open keys.
    for (size_t i = 0; i < blocks.size(); ++i) {
      const KeyBlock& b = blocks[i];
      const bool last =
          std::none_of(blocks.begin() + static_cast<std::ptrdiff_t>(i) + 1, blocks.end(),
                       [&](const KeyBlock& o) { return o.table == b.table; });
      if (!last || b.open || b.last_slot + 1 == g.block_tokens) continue;
      const uint16_t* from = staged(b, kl);
      uint16_t* to = b.table->open_keys(kl);
      for (int h = 0; h < c.n_kv_heads; ++h) {
        std::copy_n(from + h * head_keys, (b.last_slot + 1) * c.head_dim, to + h * head_keys);
      }
    }
    matmul(threads, w.wo, s.attn.data(), n, s.xb.data(), s.activations);
    norm_in_place(w.post_attn_norm);
    for (size_t i = 0; i < n * d; ++i) s.x[i] += s.xb[i];
    norm_rows(w.ffn_norm);
    const WeightView gate_up[] = {w.w_gate, w.w_up};
    float* const gate_up_out[] = {s.gate.data(), s.up.data()};
    matmul_stacked(threads, gate_up, s.xb.data(), n, gate_up_out, s.activations);
    threads.parallel_for(
        n * c.n_ff,
        [&](size_t b, size_t e) {
          if (!c.ffn_gelu) return kernels::silu_mul(&s.gate[b], &s.up[b], e - b);
          for (size_t i = b; i < e; ++i) s.gate[i] = gelu(s.gate[i]) * s.up[i];
        },
        1 << 14);
    matmul(threads, w.w_down, s.gate.data(), n, s.xb.data(), s.activations);
    norm_in_place(w.post_ffn_norm);
    for (size_t i = 0; i < n * d; ++i) s.x[i] += s.xb[i];
  }

  s.logits_in.resize(n_logits * d);
  size_t m = 0;
  for (size_t r = 0; r < n; ++r) {
    if (!rows[r].want_logits) continue;
    rms_norm(&s.x[r * d], output_norm_.data(), &s.logits_in[m * d], d, c.rms_eps);
    ++m;
  }
  s.logits.resize(n_logits * c.n_vocab);
  if (n_logits > 0) {
    matmul(threads, output_, s.logits_in.data(), n_logits, s.logits.data(), s.activations);
    if (c.final_softcap > 0.0f) soft_cap(s.logits.data(), s.logits.size(), c.final_softcap);
  }
  return {s.logits.data(), s.logits.size()};
}

}  // namespace kvc::model
