// Writes blocks to a lower tier behind the step loop: the step thread offers a copy of a
// block and returns at once; one background thread performs the writes in order. Until a
// block's write has finished, readers find it in the queue (a write-back buffer), so a block
// offered as the pool evicts it is never missed by a request that follows at once.
//
// The queue is bounded in bytes: when the tier cannot keep up, new offers are dropped and
// counted (a block not stored is recomputed later, never waited for). The writer thread runs
// at a lower priority than the process (nice + 10) and measures the processor time of each
// write, so that a policy can weigh what storing costs the forward pass.
//
// Thread-safety: offer, drain and stats may be called from any thread.
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <span>
#include <thread>
#include <vector>

#include "base/mutex.h"
#include "kv/content_hash.h"

namespace kvc::kv {

struct TierWrite {
  Hash256 ns{};
  Hash256 hash{};
  uint32_t tokens = 0;
  std::vector<uint8_t> payload;
};

struct TierWriteStats {
  uint64_t offered = 0;
  uint64_t written = 0;
  uint64_t failed = 0;      // the write function returned false
  uint64_t dropped = 0;     // refused because the queue was full
  double write_cpu_ms = 0;  // processor time the writes (written and failed) took
  size_t queued = 0;
  uint64_t queued_bytes = 0;
};

class TierWriteQueue {
 public:
  // write stores one block and says whether it succeeded; it runs on the queue's thread.
  TierWriteQueue(std::function<bool(const TierWrite&)> write, uint64_t max_queued_bytes);
  // Finishes the writes already queued, then stops the thread.
  ~TierWriteQueue();
  TierWriteQueue(const TierWriteQueue&) = delete;
  TierWriteQueue& operator=(const TierWriteQueue&) = delete;

  // Queues w; false (and counted) when the queue's byte bound would be exceeded.
  bool offer(TierWrite w);
  // Waits until every queued write has been performed.
  void drain();
  // Whether the block with this chained hash is queued (or being written).
  bool holds(const Hash256& hash) const;
  // Copies the queued block (ns, hash) into out; false if it is not queued or not out's size.
  bool read(const Hash256& ns, const Hash256& hash, std::span<uint8_t> out) const;
  TierWriteStats stats() const;

 private:
  void run();
  const TierWrite* find(const Hash256& hash) const REQUIRES(mu_);

  const std::function<bool(const TierWrite&)> write_;
  const uint64_t max_bytes_;
  mutable Mutex mu_;
  CondVar work_cv_, idle_cv_;
  std::deque<TierWrite> queue_ GUARDED_BY(mu_);
  bool busy_ GUARDED_BY(mu_) = false;
  bool stop_ GUARDED_BY(mu_) = false;
  TierWriteStats stats_ GUARDED_BY(mu_);
  std::thread thread_;
};

}  // namespace kvc::kv
