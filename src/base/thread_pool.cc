#include "base/thread_pool.h"

#include <algorithm>
#include <chrono>
#include <cmath>

#include "base/error.h"

namespace kvc {

namespace {
// A decode step issues hundreds of short parallel regions, and a futex wake-up per region
// would cost more than the work, so waiters first spin briefly, then yield the core (so that
// on an oversubscribed machine the thread being waited for can run), then sleep.
constexpr int kSpinPolls = 1 << 12;
constexpr int kYieldPolls = 1 << 8;

std::atomic<bool> learned_splits{true};

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#endif
}

// Polls load() until it differs from `from`, spinning then yielding; returns the last value
// read (equal to `from` when the caller should block).
template <typename Load, typename T>
T poll_while_equal(const Load& load, T from) {
  T v = load();
  for (int i = 0; v == from && i < kSpinPolls; ++i) {
    cpu_relax();
    v = load();
  }
  for (int i = 0; v == from && i < kYieldPolls; ++i) {
    std::this_thread::yield();
    v = load();
  }
  return v;
}
}  // namespace

ThreadPool::ThreadPool(int n_threads) : n_threads_(n_threads) {
  if (n_threads < 1) fail("thread count must be at least 1, got {}", n_threads);
  share_.assign(n_threads, 1.0 / n_threads);
  timing_.resize(n_threads);
  bounds_.resize(n_threads + 1);
  workers_.reserve(n_threads - 1);
  for (int i = 1; i < n_threads; ++i) workers_.emplace_back([this, i] { worker_loop(i); });
}

ThreadPool::~ThreadPool() {
  stop_.store(true);
  generation_.fetch_add(1);
  generation_.notify_all();
  for (auto& t : workers_) t.join();
}

void ThreadPool::worker_loop(int index) {
  uint64_t seen = 0;
  for (;;) {
    uint64_t g =
        poll_while_equal([&] { return generation_.load(std::memory_order_acquire); }, seen);
    while (g == seen) {
      generation_.wait(seen);
      g = generation_.load(std::memory_order_acquire);
    }
    seen = g;
    if (stop_.load()) return;
    (*job_)(index);
    if (pending_.fetch_sub(1, std::memory_order_acq_rel) == 1) pending_.notify_all();
  }
}

void ThreadPool::run(const std::function<void(int)>& fn) {
  if (n_threads_ == 1) {
    fn(0);
    return;
  }
  job_ = &fn;
  pending_.store(n_threads_ - 1, std::memory_order_release);
  generation_.fetch_add(1, std::memory_order_acq_rel);
  generation_.notify_all();
  fn(0);
  int left = pending_.load(std::memory_order_acquire);
  while (left != 0) {
    left = poll_while_equal([&] { return pending_.load(std::memory_order_acquire); }, left);
    if (left == 0) break;
    pending_.wait(left);
    left = pending_.load(std::memory_order_acquire);
  }
}

void ThreadPool::parallel_for(size_t n, const std::function<void(size_t, size_t)>& fn, size_t grain,
                              bool equal_items) {
  // Waking a thread costs microseconds, so small jobs stay on fewer threads.
  const size_t parts = std::clamp<size_t>(n / std::max<size_t>(grain, 1), 1, n_threads_);
  if (parts == 1 || n <= 1) {
    if (n > 0) fn(0, n);
    return;
  }
  const bool learned = learned_splits.load(std::memory_order_relaxed);
  const auto share = [&](size_t i) { return learned ? share_[i] : 1.0; };
  double total = 0.0;
  for (size_t i = 0; i < parts; ++i) total += share(i);
  double before = 0.0;
  bounds_[0] = 0;
  for (size_t i = 1; i < parts; ++i) {
    before += share(i - 1);
    // At least one item in every range.
    const auto at = static_cast<size_t>(std::llround(static_cast<double>(n) * before / total));
    bounds_[i] = std::clamp(at, bounds_[i - 1] + 1, n - (parts - i));
  }
  bounds_[parts] = n;
  run([&](int index) {
    const size_t i = static_cast<size_t>(index);
    if (i >= parts) return;
    const auto start = std::chrono::steady_clock::now();
    fn(bounds_[i], bounds_[i + 1]);
    timing_[i] = {bounds_[i + 1] - bounds_[i],
                  std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count()};
  });
  if (learned && equal_items && parts == static_cast<size_t>(n_threads_)) learn_shares();
}

void ThreadPool::set_learned_splits(bool learned) {
  learned_splits.store(learned, std::memory_order_relaxed);
}

void ThreadPool::learn_shares() {
  // Only regions long enough to time say how the threads compare.
  constexpr double kMinSeconds = 4e-6;
  // The weight of one region's rates once shares have settled: over tens of regions (a decode
  // step runs about a hundred), so that one noisy region moves them little. The first regions
  // weigh more (a running mean), so that a pool finds its threads' speeds within a few.
  constexpr double kLearnRate = 0.125;
  // Whatever the timings say, no thread's share leaves [kFloor, kCeiling] / size() (before the
  // shares are scaled back to a sum of 1), so a thread stalled once keeps some of the work.
  constexpr double kFloor = 0.25, kCeiling = 2.0;
  double rate_sum = 0.0;
  for (const RangeTiming& t : timing_) {
    if (t.seconds < kMinSeconds) return;
    rate_sum += static_cast<double>(t.items) / t.seconds;
  }
  ++learned_;
  const double weight = std::max(kLearnRate, 1.0 / static_cast<double>(learned_));
  double sum = 0.0;
  for (int i = 0; i < n_threads_; ++i) {
    const double measured = static_cast<double>(timing_[i].items) / timing_[i].seconds / rate_sum;
    share_[i] = std::clamp(share_[i] + weight * (measured - share_[i]), kFloor / n_threads_,
                           kCeiling / n_threads_);
    sum += share_[i];
  }
  for (double& s : share_) s /= sum;
}

}  // namespace kvc
