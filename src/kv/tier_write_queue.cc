#include "kv/tier_write_queue.h"

#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <exception>

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

const TierWrite* TierWriteQueue::find(const Hash256& hash) const {
  for (const TierWrite& w : queue_) {
    if (w.hash == hash) return &w;
  }
  return nullptr;
}

bool TierWriteQueue::holds(const Hash256& hash) const {
  MutexLock lock(mu_);
  return find(hash) != nullptr;
}

bool TierWriteQueue::read(const Hash256& ns, const Hash256& hash, std::span<uint8_t> out) const {
  MutexLock lock(mu_);
  const TierWrite* w = find(hash);
  if (w == nullptr || w->ns != ns || w->payload.size() != out.size()) return false;
  std::copy(w->payload.begin(), w->payload.end(), out.begin());
  return true;
}

TierWriteStats TierWriteQueue::stats() const {
  MutexLock lock(mu_);
  return stats_;
}

namespace {

// Processor time this thread has used, in milliseconds.
double thread_cpu_ms() {
  timespec t{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return static_cast<double>(t.tv_sec) * 1e3 + static_cast<double>(t.tv_nsec) * 1e-6;
}

}  // namespace

void TierWriteQueue::run() {
  // Writes are never urgent and the forward pass's threads are: on a machine with as many
  // threads as cores, the writer yields to them (best effort: a refusal changes nothing).
  errno = 0;
  const int nice_now = getpriority(PRIO_PROCESS, static_cast<id_t>(gettid()));
  if (errno == 0)
    setpriority(PRIO_PROCESS, static_cast<id_t>(gettid()), std::min(19, nice_now + 10));
  for (;;) {
    // The block stays at the front of the queue while it is written, so that readers still
    // find it there; a deque's push_back leaves it in place.
    const TierWrite* w = nullptr;
    {
      MutexLock lock(mu_);
      while (queue_.empty() && !stop_) work_cv_.wait(lock);
      if (queue_.empty()) break;  // stopping, and everything queued is written
      w = &queue_.front();
      busy_ = true;
    }
    const double cpu_start = thread_cpu_ms();
    // A write that throws (a codec's library failing, memory running out) counts as failed:
    // the block is only not stored, and the writer goes on with the next.
    bool ok = false;
    try {
      ok = write_(*w);
    } catch (const std::exception&) {
      ok = false;
    }
    const double cpu_ms = thread_cpu_ms() - cpu_start;
    {
      MutexLock lock(mu_);
      stats_.write_cpu_ms += cpu_ms;
      busy_ = false;
      --stats_.queued;
      stats_.queued_bytes -= w->payload.size();
      ++(ok ? stats_.written : stats_.failed);
      queue_.pop_front();
    }
    idle_cv_.notify_all();
  }
  idle_cv_.notify_all();
}

}  // namespace kvc::kv
