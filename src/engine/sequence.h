// One request inside the engine: its tokens, its block table, its sampler and its progress.
// Shared by the engine's three objects; the caller's view is RequestHandle.
//
// Thread-safety: none; only the engine thread (and code it calls under its state lock) touches
// a Sequence.
#pragma once

#include <algorithm>
#include <cstdint>
#include <memory>
#include <vector>

#include "engine/request.h"
#include "engine/stop_matcher.h"
#include "kv/block_table.h"
#include "kv/prefix_index.h"
#include "model/sampler.h"

namespace kvc::engine {

struct Sequence {
  uint64_t id = 0;
  Request req;
  std::shared_ptr<RequestHandle> handle;
  std::vector<int32_t> tokens;  // prompt, then sampled tokens; the last may not be written yet
  size_t written = 0;           // tokens whose keys and values are in the table
  std::unique_ptr<kv::BlockTable> table;  // null while waiting
  // The windowed layers' blocks where the pool splits them from the full ones (Gemma 2).
  std::unique_ptr<kv::BlockTable> window_table;
  std::unique_ptr<model::Sampler> sampler;
  std::unique_ptr<StopMatcher> stop;
  RequestStats stats;
  bool admitted_once = false;
  bool done = false;
  bool preempted = false;  // waiting again after a preemption
  // Preempted max_preemptions times: readmitted only with blocks for its whole output
  // reserved, so it is never preempted again.
  bool reserve_all = false;
  int passed_over = 0;  // times a later request was admitted first (cache-aware order)
  double submitted_ms = 0, admitted_ms = 0, first_token_ms = 0, last_token_ms = 0;

  // The KV cache manager's memo of the cached prefix, valid while the index version is unchanged.
  kv::PrefixMatch lookup;
  uint64_t lookup_version = 0;  // 0: no lookup yet

  // Tokens of prompt and output at most (within the context).
  size_t longest(size_t context) const {
    return std::min(context, req.prompt.size() + static_cast<size_t>(req.max_tokens));
  }
  // Tokens still to write before the next sampled token.
  size_t pending() const { return tokens.size() - written; }
  bool decoding() const { return pending() == 1 && stats.generated_tokens > 0; }
};

}  // namespace kvc::engine
