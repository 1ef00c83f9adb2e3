// The engine: many concurrent requests turned into one stream of batched forward passes over
// a shared, prefix-cached KV pool, on its own thread. It owns the thread, the intake queue and
// the step loop; the Scheduler decides what runs, the KvCacheManager decides what is cached.
//
// Thread-safety: every public function may be called from any thread. submit() takes only the
// intake lock; stats() reads a snapshot the step loop publishes; explain, pin, flush,
// close_session and namespace_stats take the state lock, which a step holds only while
// planning and while recording results, never during the forward pass. The thread sleeps when
// no step can make progress and wakes on a submission, a cancellation, a cache operation or
// shutdown.
#pragma once

#include <atomic>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "base/histogram.h"
#include "base/mutex.h"
#include "base/thread_pool.h"
#include "engine/kv_cache_manager.h"
#include "engine/request.h"
#include "engine/scheduler.h"
#include "kv/block_pool.h"
#include "kv/prefix_index.h"
#include "model/llama_model.h"
#include "model/tokenizer.h"

namespace kvc::engine {

struct EngineOptions {
  uint64_t kv_memory_bytes = 0;   // 0: default_kv_pool_bytes (kv_pool_size.h)
  int block_tokens = 0;           // 0: kv::block_tokens_for the key dtype
  DType kv_k_dtype = DType::F16;  // keys' storage type in the KV pool
  DType kv_v_dtype = DType::F16;  // values' storage type
  int threads = 0;                // 0: all cores
  int max_batch_tokens = 512;     // tokens per forward pass (decodes + prefill chunks)
  int max_running = 16;           // sequences admitted at once
  size_t max_waiting = 256;       // queued requests before "overloaded"
  bool prefix_cache = true;
  bool partial_reuse = true;
  bool cache_aware = false;
  int max_passed_over = 8;
  int reserve_blocks = 1;   // free blocks kept per running sequence when admitting
  int max_preemptions = 4;  // times one request may be preempted before it is protected
  double session_ttl_ms = 10 * 60 * 1000.0;
  size_t session_max_blocks = 256;      // blocks a session keeps pinned between turns
  size_t tenant_pinned_max_blocks = 0;  // per namespace, sessions and pins; 0: pool / 4
  TierOptions kv_tiers;                 // disk and Redis behind the pool; none by default
  // Called on the engine thread before each forward pass, outside the state lock (tests use it
  // to show that cache operations never wait for compute).
  std::function<void()> before_forward;
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
  KvCacheCounts blocks;
  kv::PrefixIndexStats cache;
  TierCounts tiers;
};

class Engine {
 public:
  // Builds the KV cache and starts the step thread. model and tokenizer must outlive the engine.
  Engine(const model::LlamaModel& model, const model::Tokenizer& tokenizer,
         const EngineOptions& options);
  ~Engine();
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  // Queues a request that will run. Throws RequestError: kInvalid (bad fields), kTooLarge (its
  // prompt and max_tokens could never fit the pool or the context: says both figures),
  // kOverloaded (the waiting queue is full) or kShutdown.
  std::shared_ptr<RequestHandle> submit(Request request);
  // Queues requests that arrive together (the choices of one API request, a benchmark's
  // batch): all or none are accepted, and the step that follows sees every one of them. Throws
  // as submit() does, for the first request that fails or for the whole group.
  std::vector<std::shared_ptr<RequestHandle>> submit_all(std::vector<Request> requests);

  // Stops admitting, lets running and waiting requests finish for up to drain_ms, cancels
  // the rest, and joins the step thread. Idempotent.
  void shutdown(double drain_ms = 0);

  // Ends a session: its blocks are unpinned (and stay cached until evicted).
  bool close_session(const std::string& id);

  // Cache operations; each waits at most for a step's planning, never for a forward pass.
  kv::PrefixMatch explain(const kv::Hash256& ns, std::span<const int32_t> tokens) const;
  // Pins the prefix's cached blocks (within the tenant's pinned allowance); returns the lease.
  kv::PinLease pin(const kv::Hash256& ns, std::span<const int32_t> tokens, double ttl_ms);
  size_t flush_cache();
  // Deletes every block stored in the lower tiers (disk); returns how many.
  size_t flush_tiers();
  // Waits until every block offered to the lower tiers is written.
  void drain_tiers();

  // The latest snapshot (published after every step and cache operation).
  EngineStats stats() const;
  kv::NamespaceStats namespace_stats(const kv::Hash256& ns) const;
  // Latency histograms in milliseconds.
  const Histogram& ttft_histogram() const { return ttft_; }
  const Histogram& itl_histogram() const { return itl_; }
  const Histogram& e2e_histogram() const { return e2e_; }
  const Histogram& queue_histogram() const { return queue_; }

  const kv::KvGeometry& geometry() const { return geometry_; }
  size_t num_blocks() const { return num_blocks_; }
  size_t arena_bytes() const { return arena_bytes_; }
  size_t tenant_pinned_max_blocks() const { return tenant_cap_; }
  const EngineOptions& options() const { return options_; }
  const model::LlamaModel& model() const { return model_; }
  const model::Tokenizer& tokenizer() const { return tokenizer_; }
  // The namespace of a tenant salt (and adapter) for this engine's model and KV layout.
  kv::Hash256 namespace_for(const std::string& tenant_salt, const std::string& adapter = "") const;

 private:
  void loop();
  // One step; false when it could make no progress (nothing to run, nothing changed).
  bool step();
  // Ends every request with an error naming what made a step throw, so that one failed step
  // (a bug, memory running out) costs the requests it held and not the process.
  void fail_all(const std::string& what) EXCLUDES(state_mu_);
  // A validated, not yet queued sequence for request; throws RequestError as submit() does.
  std::unique_ptr<Sequence> make_sequence(Request request);
  void intake() REQUIRES(state_mu_) EXCLUDES(intake_mu_);
  void finish(Sequence& s, FinishReason reason, const std::string& error = {}) REQUIRES(state_mu_);
  void after_row(Sequence& s, std::span<const float> logits) REQUIRES(state_mu_);
  // Copies the cache's counts into the stats snapshot, then tells finished requests they ended
  // (under the state lock).
  void publish_stats() REQUIRES(state_mu_);
  size_t scheduler_running() const;
  void wake() EXCLUDES(intake_mu_);
  // Times a few prefill passes of a scratch sequence for the tiers' cost model (start-up).
  void calibrate_costs() REQUIRES(state_mu_);

  const model::LlamaModel& model_;
  const model::Tokenizer& tokenizer_;
  EngineOptions options_;
  kv::Hash256 model_fingerprint_{};
  kv::KvGeometry geometry_;
  size_t num_blocks_ = 0;
  size_t arena_bytes_ = 0;
  size_t tenant_cap_ = 0;
  std::unique_ptr<ThreadPool> threads_;
  model::ForwardScratch scratch_;

  // Guards the KV cache manager and the scheduler (and the sequences they hold).
  mutable Mutex state_mu_;
  std::unique_ptr<KvCacheManager> kv_ GUARDED_BY(state_mu_);
  std::unique_ptr<Scheduler> scheduler_ GUARDED_BY(state_mu_);
  // kv_'s pool, for the forward pass, which runs unlocked: it touches only the blocks of the
  // sequences planned for the step, which no cache operation frees or changes meanwhile.
  kv::BlockPool* pool_ = nullptr;
  struct Ending {
    std::shared_ptr<RequestHandle> handle;
    RequestStats stats;
    std::string error;
  };
  std::vector<Ending> endings_
      GUARDED_BY(state_mu_);  // finished requests not yet told (see publish_stats)

  // Guards the intake queue and the wake-up state, so submit() never waits for a step.
  mutable Mutex intake_mu_;
  CondVar intake_cv_;
  std::vector<std::unique_ptr<Sequence>> incoming_ GUARDED_BY(intake_mu_);
  size_t queued_ GUARDED_BY(intake_mu_) = 0;  // incoming + waiting, for the overload check
  // Bumped by every event that may let a blocked step progress.
  uint64_t wakes_ GUARDED_BY(intake_mu_) = 0;
  bool accepting_ GUARDED_BY(intake_mu_) = true;
  bool stop_ GUARDED_BY(intake_mu_) = false;
  double drain_deadline_ms_ GUARDED_BY(intake_mu_) = 0;
  // Cancellations wake the engine through this, which outlives the engine in their handles.
  struct Waker;
  std::shared_ptr<Waker> waker_;

  std::atomic<size_t> running_count_{0};  // the scheduler's running count, read without locks
  std::atomic<uint64_t> next_id_{1};
  mutable Mutex stats_mu_;
  // Counters, plus the snapshot fields published by publish_stats().
  EngineStats stats_ GUARDED_BY(stats_mu_);
  Histogram ttft_, itl_, e2e_, queue_;  // each locks itself
  std::thread thread_;
};

}  // namespace kvc::engine
