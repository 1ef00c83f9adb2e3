// The tier write queue: writes happen in order behind the caller, a full queue drops and
// counts, and each write's processor time is measured on the writer thread at a lower priority.
#include "kv/tier_write_queue.h"

#include <sys/resource.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cmath>
#include <stdexcept>
#include <thread>
#include <vector>

namespace kvc::kv {
namespace {

TierWrite write_of(uint8_t id, size_t bytes) {
  TierWrite w;
  w.hash[0] = id;
  w.tokens = 16;
  w.payload.assign(bytes, id);
  return w;
}

TEST(TierWriteQueue, WritesInOrderAndMeasuresTheirProcessorTime) {
  std::vector<uint8_t> order;
  std::atomic<int> writer_nice{-100};
  volatile double sink = 0;
  TierWriteQueue q(
      [&](const TierWrite& w) {
        errno = 0;
        writer_nice = getpriority(PRIO_PROCESS, static_cast<id_t>(gettid()));
        // Some real work, so that the thread's processor clock moves.
        double x = 0;
        for (int i = 0; i < 2'000'000; ++i) x += std::sqrt(static_cast<double>(i + w.hash[0]));
        sink = x;
        order.push_back(w.hash[0]);
        return w.hash[0] != 3;  // the third write fails
      },
      1 << 20);
  for (uint8_t i = 1; i <= 4; ++i) EXPECT_TRUE(q.offer(write_of(i, 1024)));
  q.drain();
  const TierWriteStats s = q.stats();
  EXPECT_EQ(order, (std::vector<uint8_t>{1, 2, 3, 4}));
  EXPECT_EQ(s.offered, 4u);
  EXPECT_EQ(s.written, 3u);
  EXPECT_EQ(s.failed, 1u);
  EXPECT_EQ(s.queued, 0u);
  EXPECT_EQ(s.queued_bytes, 0u);
  EXPECT_GT(s.write_cpu_ms, 0.0);
  errno = 0;
  const int caller_nice = getpriority(PRIO_PROCESS, static_cast<id_t>(gettid()));
  EXPECT_EQ(writer_nice.load(), std::min(19, caller_nice + 10));
}

// A write that throws (a codec library failing, memory running out) once ended the writer
// thread and with it the process: it counts as failed and the writer goes on.
TEST(TierWriteQueue, AWriteThatThrowsCountsAsFailedAndTheNextIsWritten) {
  std::vector<uint8_t> written;
  TierWriteQueue q(
      [&](const TierWrite& w) {
        if (w.hash[0] == 2) throw std::runtime_error("codec failed");
        written.push_back(w.hash[0]);
        return true;
      },
      1 << 20);
  for (uint8_t i = 1; i <= 3; ++i) EXPECT_TRUE(q.offer(write_of(i, 64)));
  q.drain();
  const TierWriteStats s = q.stats();
  EXPECT_EQ(written, (std::vector<uint8_t>{1, 3}));
  EXPECT_EQ(s.written, 2u);
  EXPECT_EQ(s.failed, 1u);
  EXPECT_EQ(s.queued, 0u);
}

// Until its write has finished, a block is read from the queue, and only under its namespace.
TEST(TierWriteQueue, AQueuedBlockIsReadFromTheQueueUntilWritten) {
  std::atomic<bool> release{false};
  TierWriteQueue q(
      [&](const TierWrite&) {
        while (!release) std::this_thread::yield();
        return true;
      },
      1 << 20);
  TierWrite a = write_of(1, 64), b = write_of(2, 64);
  a.ns[0] = 7;
  b.ns[0] = 7;
  const Hash256 ns = a.ns, hash_a = a.hash, hash_b = b.hash;
  EXPECT_TRUE(q.offer(std::move(a)));  // taken by the writer, which waits
  EXPECT_TRUE(q.offer(std::move(b)));  // waits in the queue
  std::vector<uint8_t> out(64, 0);
  for (const Hash256& h : {hash_a, hash_b}) {
    EXPECT_TRUE(q.holds(h));
    EXPECT_TRUE(q.read(ns, h, out));
    EXPECT_EQ(out, std::vector<uint8_t>(64, h[0]));
  }
  EXPECT_FALSE(q.read(Hash256{}, hash_a, out));  // another namespace
  std::vector<uint8_t> small(8);
  EXPECT_FALSE(q.read(ns, hash_a, small));  // another size
  EXPECT_FALSE(q.holds(Hash256{}));
  release = true;
  q.drain();
  EXPECT_FALSE(q.holds(hash_a));
  EXPECT_FALSE(q.read(ns, hash_b, out));
}

TEST(TierWriteQueue, AFullQueueDropsAndCounts) {
  std::atomic<bool> release{false};
  TierWriteQueue q(
      [&](const TierWrite&) {
        while (!release) std::this_thread::yield();
        return true;
      },
      3000);
  EXPECT_TRUE(q.offer(write_of(1, 1000)));
  EXPECT_TRUE(q.offer(write_of(2, 1000)));
  EXPECT_TRUE(q.offer(write_of(3, 1000)));
  EXPECT_FALSE(q.offer(write_of(4, 1000)));  // 4000 bytes would exceed the bound
  release = true;
  q.drain();
  const TierWriteStats s = q.stats();
  EXPECT_EQ(s.offered, 4u);
  EXPECT_EQ(s.dropped, 1u);
  EXPECT_EQ(s.written, 3u);
}

}  // namespace
}  // namespace kvc::kv
