#include "kv/tier_write_queue.h"

namespace kvc::kv {

TierWriteQueue::TierWriteQueue(std::function<bool(const TierWrite&)> write,
                               uint64_t max_queued_bytes)
    : write_(std::move(write)), max_bytes_(max_queued_bytes) {
  thread_ = std::thread([this] { run(); });
}

TierWriteQueue::~TierWriteQueue() {
  {
    MutexLock lock(mu_);
    stop_ = true;
  }
  work_cv_.notify_all();
  thread_.join();
}

bool TierWriteQueue::offer(TierWrite w) {
  {
    MutexLock lock(mu_);
    ++stats_.offered;
    if (stop_ || stats_.queued_bytes + w.payload.size() > max_bytes_) {
      ++stats_.dropped;
      return false;
    }
    stats_.queued_bytes += w.payload.size();
    ++stats_.queued;
    queue_.push_back(std::move(w));
  }
  work_cv_.notify_one();
  return true;
}

void TierWriteQueue::drain() {
  MutexLock lock(mu_);
  while (!queue_.empty() || busy_) idle_cv_.wait(lock);
}

TierWriteStats TierWriteQueue::stats() const {
  MutexLock lock(mu_);
  return stats_;
}

void TierWriteQueue::run() {
  for (;;) {
    TierWrite w;
    {
      MutexLock lock(mu_);
      while (queue_.empty() && !stop_) work_cv_.wait(lock);
      if (queue_.empty()) break;  // stopping, and everything queued is written
      w = std::move(queue_.front());
      queue_.pop_front();
      busy_ = true;
    }
    const bool ok = write_(w);
    {
      MutexLock lock(mu_);
      busy_ = false;
      --stats_.queued;
      stats_.queued_bytes -= w.payload.size();
      ++(ok ? stats_.written : stats_.failed);
    }
    idle_cv_.notify_all();
  }
  idle_cv_.notify_all();
}

}  // namespace kvc::kv
