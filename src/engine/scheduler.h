// The scheduler: the waiting queue and the running set, admission, victim choice and the
// token budget. Each step it turns the running sequences into a list of (sequence, tokens to
// run) under the budget. It never touches blocks itself: every block decision goes through the
// KV cache manager.
//
// Admission takes a waiting request when its uncached blocks fit in what could be freed for
// it, leaving one block of growth per running sequence (so that admitting never forces the
// next step to preempt); with nothing running, any request the pool can hold fits, so an
// accepted request always runs. A preempted request is readmitted only under the same rule.
// Preemptions are bounded: a request preempted max_preemptions times is not chosen as a victim
// again, and if it must yield once more it comes back only with blocks for its whole output
// reserved, so no request is preempted more than max_preemptions + 1 times. Under a sliding
// window those blocks cannot be taken ahead (the window's blocks are released as it runs): the
// request's peak, less what it holds, is its claim instead, which admissions and the others'
// growth leave free.
//
// Thread-safety: none; the engine calls it under its state mutex.
#pragma once

#include <deque>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "engine/kv_cache_manager.h"
#include "engine/sequence.h"

namespace kvc::engine {

struct SchedulerOptions {
  int max_batch_tokens = 512;  // tokens per forward pass (decodes + prefill chunks)
  int max_running = 16;        // sequences admitted at once
  // Admit the waiting request with the longest cached prefix first, but never pass over a
  // request more than max_passed_over times.
  bool cache_aware = false;
  int max_passed_over = 8;
  int reserve_blocks = 1;     // free blocks kept per running sequence for its growth
  int max_preemptions = 4;    // times one request may be preempted before it is protected
  size_t context_length = 0;  // the model's context (bounds a request's output)
};

// One step's work.
struct StepPlan {
  std::vector<std::pair<Sequence*, size_t>> rows;  // (sequence, tokens to run)
  // Newly admitted this step, with what the cache gave each.
  std::vector<std::pair<Sequence*, kv::PrefixMatch>> admitted;
  size_t preempted = 0;
  // Sequences that cannot make progress at all, with the reason; the engine fails them.
  std::vector<std::pair<Sequence*, std::string>> failed;
  bool empty() const {
    return rows.empty() && admitted.empty() && preempted == 0 && failed.empty();
  }
};

class Scheduler {
 public:
  explicit Scheduler(const SchedulerOptions& options);

  // Adds a newly submitted request at the back of the waiting queue.
  void enqueue(std::unique_ptr<Sequence> s);
  // Admits what fits, then plans the step's rows under the token budget, growing tables
  // through the manager and preempting victims when blocks run out.
  StepPlan plan(KvCacheManager& kv);
  // Removes finished sequences from both queues; returns them.
  std::vector<std::unique_ptr<Sequence>> take_finished();
  // Every sequence, running first (shutdown, cancellation checks).
  std::vector<Sequence*> all();

  size_t running() const { return running_.size(); }
  size_t waiting() const { return waiting_.size(); }
  const SchedulerOptions& options() const { return options_; }

 private:
  void admit(KvCacheManager& kv, StepPlan& plan);
  bool fits(KvCacheManager& kv, Sequence& s);
  // The tokens s is admitted for (its whole output once protected) and the chunk its blocks are
  // counted at: max_batch_tokens, or 1 where the pool cannot hold a whole chunk's reach.
  std::pair<size_t, size_t> admission_extent(KvCacheManager& kv, const Sequence& s) const;
  // Blocks a protected, admitted s may still take under a sliding window: its peak less what it
  // holds (0 otherwise).
  size_t claim(KvCacheManager& kv, const Sequence& s) const;
  // The claims of the running sequences other than except.
  size_t claimed(KvCacheManager& kv, const Sequence* except) const;
  // Whether a running request is still prefilling a block that s would share (admitting s now
  // would compute those keys and values twice).
  bool shares_pending_prefill(KvCacheManager& kv, Sequence& s);
  Sequence* pick_victim(const Sequence& requester);
  void preempt(KvCacheManager& kv, Sequence& s, StepPlan& plan);

  SchedulerOptions options_;
  std::vector<std::unique_ptr<Sequence>> running_;
  std::deque<std::unique_ptr<Sequence>> waiting_;
};

}  // namespace kvc::engine
