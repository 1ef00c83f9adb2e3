// The engine: many concurrent requests turned into one stream of batched forward passes over
// a shared, prefix-cached KV pool, on its own thread.
//
// Each step has a token budget: running decodes first, then chunks of pending prefills.
// Requests are admitted when the uncached part of their prompt fits in free and evictable
// blocks; when blocks run out mid-decode a victim (lowest priority, then newest) is preempted
// and requeued, keeping its sealed blocks cached so that it resumes from them. Sessions pin a
// conversation's blocks between turns.
#pragma once

#include <atomic>
#include <condition_variable>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "base/histogram.h"
#include "base/thread_pool.h"
#include "engine/request.h"
#include "kv/block_pool.h"
#include "kv/prefix_index.h"
#include "model/llama_model.h"
#include "model/tokenizer.h"

namespace kvc::engine {

struct EngineOptions {
  uint64_t kv_memory_bytes = 0;  // 0: room for max_running full contexts
  int block_tokens = 16;
  DType kv_dtype = DType::F32;
  int threads = 0;             // 0: all cores
  int max_batch_tokens = 512;  // tokens per forward pass (decodes + prefill chunks)
  int max_running = 16;        // sequences admitted at once
  size_t max_waiting = 256;    // queued requests before "overloaded"
  bool prefix_cache = true;
  bool partial_reuse = true;
  // Admit the waiting request with the longest cached prefix first, but never pass over a
  // request more than max_passed_over times.
  bool cache_aware = false;
  int max_passed_over = 8;
  int reserve_blocks = 1;  // free blocks a request must leave for its decode when admitted
  double session_ttl_ms = 10 * 60 * 1000.0;
  size_t session_max_blocks = 0;  // 0: no cap on the blocks a session keeps pinned
};

struct EngineStats {
  size_t running = 0;
  size_t waiting = 0;
  uint64_t submitted = 0;
  uint64_t finished = 0;
  uint64_t rejected_overloaded = 0;
  uint64_t rejected_too_large = 0;
  uint64_t cancelled = 0;
  uint64_t preemptions = 0;
  uint64_t steps = 0;
  uint64_t prompt_tokens = 0;
  uint64_t cached_prompt_tokens = 0;
  uint64_t generated_tokens = 0;
  size_t sessions = 0;
  kv::PoolCounts blocks;
  kv::PrefixIndexStats cache;
};

class Engine {
 public:
  // Builds the pool and the prefix index and starts the step thread. model and tokenizer must
  // outlive the engine.
  Engine(const model::LlamaModel& model, const model::Tokenizer& tokenizer,
         const EngineOptions& options);
  ~Engine();
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  // Queues a request. Throws RequestError: kInvalid (bad fields), kTooLarge (could never fit
  // the pool or the context: says how many blocks it needs and how many exist), kOverloaded
  // (the waiting queue is full) or kShutdown.
  std::shared_ptr<RequestHandle> submit(Request request);

  // Stops admitting, lets running and waiting requests finish for up to drain_ms, cancels
  // the rest, and joins the step thread. Idempotent.
  void shutdown(double drain_ms = 0);

  // Ends a session: its blocks are unpinned (and stay cached until evicted).
  bool close_session(const std::string& id);

  // Cache operations, serialised with the step loop (each waits at most one step).
  kv::PrefixMatch explain(const kv::Hash256& ns, std::span<const int32_t> tokens) const;
  size_t pin(const kv::Hash256& ns, std::span<const int32_t> tokens, double ttl_ms);
  size_t flush_cache();

  EngineStats stats() const;
  kv::NamespaceStats namespace_stats(const kv::Hash256& ns) const;
  // Latency histograms in milliseconds.
  const Histogram& ttft_histogram() const { return ttft_; }
  const Histogram& itl_histogram() const { return itl_; }
  const Histogram& e2e_histogram() const { return e2e_; }
  const Histogram& queue_histogram() const { return queue_; }

  const kv::BlockPool& pool() const { return *pool_; }
  const EngineOptions& options() const { return options_; }
  const model::LlamaModel& model() const { return model_; }
  const model::Tokenizer& tokenizer() const { return tokenizer_; }
  // The namespace of a tenant salt (and adapter) for this engine's model and KV layout.
  kv::Hash256 namespace_for(const std::string& tenant_salt, const std::string& adapter = "") const;

 private:
  struct Sequence;
  struct Session {
    kv::Hash256 ns{};
    std::vector<int32_t> pinned;  // the tokens currently pinned
    double expires_at_ms = 0;
  };

  void loop();
  bool step();
  void intake();
  void admit();
  bool fits(const Sequence& s) const;
  // Whether a running request is still prefilling at least one more block that s shares
  // (admitting s now would compute those keys and values twice).
  bool shares_pending_prefill(const Sequence& s) const;
  void start(Sequence& s);
  bool make_room(Sequence& s, size_t tokens);
  Sequence* pick_victim(const Sequence& requester);
  void preempt(Sequence& s);
  void finish(Sequence& s, const std::string& reason, const std::string& error = {});
  void after_row(Sequence& s, std::span<const float> logits);
  void expire_sessions();
  void keep_session(Sequence& s);

  const model::LlamaModel& model_;
  const model::Tokenizer& tokenizer_;
  EngineOptions options_;
  kv::Hash256 model_fingerprint_{};
  std::unique_ptr<kv::BlockPool> pool_;
  std::unique_ptr<kv::PrefixIndex> index_;
  std::unique_ptr<ThreadPool> threads_;
  model::ForwardScratch scratch_;

  // Guards the pool, the index, the sequences and sessions: held by the step thread for a
  // whole step and by cache operations.
  mutable std::mutex state_mu_;
  std::vector<std::unique_ptr<Sequence>> running_;
  std::deque<std::unique_ptr<Sequence>> waiting_;
  std::map<std::string, Session> sessions_;

  // Guards the intake queue only, so submit() never waits for a step.
  mutable std::mutex intake_mu_;
  std::condition_variable intake_cv_;
  std::vector<std::unique_ptr<Sequence>> incoming_;
  size_t queued_ = 0;                     // incoming + waiting, for the overload check
  std::atomic<size_t> running_count_{0};  // running_.size(), readable without state_mu_
  bool accepting_ = true;
  bool stop_ = false;
  double drain_deadline_ms_ = 0;

  std::atomic<uint64_t> next_id_{1};
  mutable std::mutex stats_mu_;
  EngineStats stats_;
  Histogram ttft_, itl_, e2e_, queue_;
  std::thread thread_;
};

}  // namespace kvc::engine
