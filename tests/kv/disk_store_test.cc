#include "kv/disk_store.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fmt/format.h>

#include <atomic>
#include <csignal>
#include <fstream>
#include <numeric>
#include <thread>

#include "base/error.h"
#include "kv/tier_fixtures.h"
#include "scratch_dir.h"

namespace kvc::kv {
namespace {

namespace fs = std::filesystem;

using namespace tier_fixtures;

// A fresh directory inside the test's scratch directory.
fs::path fresh_dir(const std::string& name) {
  const fs::path d = kvc::testing::scratch_dir() / fmt::format("disk-{}", name);
  fs::create_directories(d);
  return d;
}

size_t block_bytes() {
  return kTierHeaderBytes + identity().geometry.bytes_per_block();
}

// Blocks whose slot headers are whole in dir's segment files.
size_t blocks_on_disk(const fs::path& dir) {
  return DiskStore::stored_blocks(dir).size();
}

// Every file in dir but the stores' lock files.
size_t data_files(const fs::path& dir) {
  size_t n = 0;
  for (const auto& e : fs::directory_iterator(dir)) {
    n += e.is_regular_file() && e.path().extension() != ".lock" ? 1 : 0;
  }
  return n;
}

TEST(DiskStore, RoundTripsABlock) {
  const fs::path dir = fresh_dir("roundtrip");
  DiskStore store(dir, TierCodec(identity()), 1 << 20);
  const auto p = payload(1);
  ASSERT_TRUE(store.put(ns_of(1), hash_of(1), 4, p));
  EXPECT_TRUE(store.contains(hash_of(1)));
  const auto where = store.location(hash_of(1));
  ASSERT_TRUE(where);
  EXPECT_TRUE(fs::exists(where->file));
  EXPECT_EQ(where->bytes, block_bytes());
  EXPECT_EQ(store.slot_bytes(), block_bytes());
  const auto stored = DiskStore::stored_blocks(dir);
  ASSERT_EQ(stored.size(), 1u);
  EXPECT_EQ(stored[0].hash, hash_of(1));
  std::vector<uint8_t> out(p.size());
  ASSERT_TRUE(store.get(ns_of(1), hash_of(1), out));
  EXPECT_EQ(out, p);
  const DiskStoreStats st = store.stats();
  EXPECT_EQ(st.blocks, 1u);
  EXPECT_EQ(st.writes, 1u);
  EXPECT_EQ(st.hits, 1u);
  EXPECT_EQ(st.bytes, block_bytes());
  EXPECT_FALSE(store.get(ns_of(1), hash_of(2), out));
  EXPECT_EQ(store.stats().misses, 1u);
}

TEST(DiskStore, FindsItsBlocksAgainAfterARestart) {
  const fs::path dir = fresh_dir("restart");
  {
    DiskStore store(dir, TierCodec(identity()), 1 << 20);
    for (int i = 0; i < 5; ++i) ASSERT_TRUE(store.put(ns_of(1), hash_of(i), 4, payload(i)));
  }
  // A copy of the segment under a far number: its blocks are the same ones, found once.
  const auto stored = DiskStore::stored_blocks(dir);
  ASSERT_EQ(stored.size(), 5u);
  const fs::path segment = stored[0].location.file;
  const std::string far = segment.filename().string().substr(0, 16) + "-999999999.kvs";
  fs::copy_file(segment, dir / far);
  DiskStore again(dir, TierCodec(identity()), 1 << 20);
  EXPECT_EQ(again.stats().found_at_open, 5u);
  EXPECT_EQ(DiskStore::stored_blocks(dir).size(), 5u);  // the copies' slots were freed
  for (int i = 0; i < 5; ++i) {
    std::vector<uint8_t> out(payload(i).size());
    ASSERT_TRUE(again.get(ns_of(1), hash_of(i), out)) << i;
    EXPECT_EQ(out, payload(i));
  }
}

TEST(DiskStore, NeverUsesOrDeletesBlocksOfAnotherModelOrLayout) {
  const fs::path dir = fresh_dir("foreign");
  {
    DiskStore store(dir, TierCodec(identity()), 1 << 20);
    ASSERT_TRUE(store.put(ns_of(1), hash_of(1), 4, payload(1)));
  }
  TierIdentity other_model = identity();
  other_model.model_fingerprint.fill(8);
  TierIdentity other_dtype = identity();
  other_dtype.geometry.k_dtype = DType::F16;
  TierIdentity other_geometry = identity();
  other_geometry.geometry.block_tokens = 8;
  for (const TierIdentity& id : {other_model, other_dtype, other_geometry}) {
    DiskStore store(dir, TierCodec(id), 1 << 20);
    EXPECT_EQ(store.stats().found_at_open, 0u);
    EXPECT_EQ(store.stats().foreign_files, 1u);
    EXPECT_FALSE(store.contains(hash_of(1)));
    std::vector<uint8_t> out(id.geometry.bytes_per_block());
    EXPECT_FALSE(store.get(ns_of(1), hash_of(1), out));
    EXPECT_EQ(store.clear(), 0u);
  }
  const auto stored = DiskStore::stored_blocks(dir);
  ASSERT_EQ(stored.size(), 1u);
  EXPECT_EQ(stored[0].hash, hash_of(1));
}

// Two processes writing the same model's slots in one directory would overwrite each other's
// blocks: the second is refused with a clear error; another layout may share the directory.
TEST(DiskStore, ASecondStoreOfTheSameLayoutInOneDirectoryIsRefused) {
  const fs::path dir = fresh_dir("locked");
  DiskStore store(dir, TierCodec(identity()), 1 << 20);
  EXPECT_THAT([&] { DiskStore(dir, TierCodec(identity()), 1 << 20); },
              ::testing::ThrowsMessage<Error>(::testing::HasSubstr("another kvcache process")));
  TierIdentity other = identity();
  other.geometry.block_tokens = 8;
  DiskStore beside(dir, TierCodec(other), 1 << 20);
  ASSERT_TRUE(
      beside.put(ns_of(1), hash_of(1), 4, std::vector<uint8_t>(other.geometry.bytes_per_block())));
  ASSERT_TRUE(store.put(ns_of(1), hash_of(2), 4, payload(2)));
  std::vector<uint8_t> out(payload(2).size());
  ASSERT_TRUE(store.get(ns_of(1), hash_of(2), out));
  EXPECT_EQ(out, payload(2));
}

// Freed slots are written again before the segment grows, and a freed block is not found by
// the next scan.
TEST(DiskStore, ReusesFreedSlotsAndForgetsFreedBlocks) {
  const fs::path dir = fresh_dir("reuse");
  {
    DiskStore store(dir, TierCodec(identity()), 1 << 20);
    for (int i = 0; i < 4; ++i) ASSERT_TRUE(store.put(ns_of(1), hash_of(i), 4, payload(i)));
    const auto freed = store.location(hash_of(1));
    ASSERT_TRUE(store.erase(hash_of(1)));
    ASSERT_TRUE(store.put(ns_of(1), hash_of(9), 4, payload(9)));
    EXPECT_EQ(store.location(hash_of(9))->offset, freed->offset);
    ASSERT_TRUE(store.erase(hash_of(2)));
  }
  DiskStore again(dir, TierCodec(identity()), 1 << 20);
  EXPECT_EQ(again.stats().found_at_open, 3u);
  EXPECT_FALSE(again.contains(hash_of(1)));
  EXPECT_FALSE(again.contains(hash_of(2)));
  std::vector<uint8_t> out(payload(0).size());
  for (const int i : {0, 3, 9}) {
    ASSERT_TRUE(again.get(ns_of(1), hash_of(i), out)) << i;
    EXPECT_EQ(out, payload(i));
  }
}

// Slots are freed and written again while other threads read them: a read that loses the
// race is a miss, never a wrong block and never counted as damage.
TEST(DiskStore, ReadsRacingWithSlotReuseReturnTheRightBlockOrNothing) {
  const fs::path dir = fresh_dir("race");
  DiskStore store(dir, TierCodec(identity()), 3 * block_bytes());
  std::atomic<bool> stop{false};
  std::atomic<int> hits{0}, wrong{0};
  std::vector<std::thread> readers;
  for (int r = 0; r < 2; ++r) {
    readers.emplace_back([&, r] {
      std::vector<uint8_t> out(payload(0).size());
      for (int i = r; !stop.load(); i = (i + 1) % 8) {
        if (!store.get(ns_of(1), hash_of(i), out)) continue;
        ++hits;
        if (out != payload(i)) ++wrong;
      }
    });
  }
  // On a loaded machine the readers may not run at all during 3,000 puts: the writer goes on
  // (boundedly) until they have read something, so that the race is really exercised.
  for (int round = 0; round < 3000 || (hits.load() == 0 && round < 3'000'000); ++round)
    store.put(ns_of(1), hash_of(round % 8), 4, payload(round % 8));
  stop = true;
  for (std::thread& t : readers) t.join();
  EXPECT_EQ(wrong.load(), 0);
  EXPECT_GT(hits.load(), 0);
  EXPECT_EQ(store.stats().corrupt, 0u);
  EXPECT_EQ(store.stats().read_errors, 0u);
  EXPECT_LE(store.stats().bytes, 3 * block_bytes());
}

TEST(DiskStore, RefusesAndDeletesDamagedBlocks) {
  const fs::path dir = fresh_dir("damaged");
  DiskStore store(dir, TierCodec(identity()), 1 << 20);
  for (int i = 0; i < 4; ++i) ASSERT_TRUE(store.put(ns_of(1), hash_of(i), 4, payload(i)));
  // 3 (the last slot of its segment): truncated payload; 1: a flipped payload byte; 2: a
  // flipped header byte; 0: read under another namespace.
  const DiskBlockLocation last = *store.location(hash_of(3));
  ASSERT_EQ(fs::file_size(last.file), last.offset + block_bytes());
  fs::resize_file(last.file, last.offset + block_bytes() - 5);
  auto flip = [&](int i, size_t offset) {
    const DiskBlockLocation at = *store.location(hash_of(i));
    std::fstream f(at.file, std::ios::in | std::ios::out | std::ios::binary);
    f.seekg(static_cast<std::streamoff>(at.offset + offset));
    char c = 0;
    f.read(&c, 1);
    c = static_cast<char>(c ^ 0x10);
    f.seekp(static_cast<std::streamoff>(at.offset + offset));
    f.write(&c, 1);
  };
  flip(1, kTierHeaderBytes + 17);
  flip(2, 150);  // inside the payload size field
  std::vector<uint8_t> out(payload(0).size());
  EXPECT_FALSE(store.get(ns_of(1), hash_of(3), out));
  EXPECT_FALSE(store.get(ns_of(1), hash_of(1), out));
  EXPECT_FALSE(store.get(ns_of(1), hash_of(2), out));
  EXPECT_FALSE(store.get(ns_of(2), hash_of(0), out));
  EXPECT_EQ(store.stats().corrupt, 4u);
  EXPECT_EQ(store.stats().blocks, 0u);
  EXPECT_EQ(store.stats().bytes, 0u);
  EXPECT_EQ(blocks_on_disk(dir), 0u);
  // The store keeps working.
  ASSERT_TRUE(store.put(ns_of(1), hash_of(0), 4, payload(0)));
  ASSERT_TRUE(store.get(ns_of(1), hash_of(0), out));
  EXPECT_EQ(out, payload(0));
  EXPECT_EQ(blocks_on_disk(dir), 1u);
}

TEST(DiskStore, StaysWithinItsBudgetDroppingTheLeastRecentlyUsed) {
  const fs::path dir = fresh_dir("budget");
  {
    DiskStore store(dir, TierCodec(identity()), 3 * block_bytes());
    for (int i = 0; i < 3; ++i) ASSERT_TRUE(store.put(ns_of(1), hash_of(i), 4, payload(i)));
    std::vector<uint8_t> out(payload(0).size());
    ASSERT_TRUE(store.get(ns_of(1), hash_of(0), out));  // 0 is now the most recently used
    ASSERT_TRUE(store.put(ns_of(1), hash_of(3), 4, payload(3)));
    EXPECT_TRUE(store.contains(hash_of(0)));
    EXPECT_FALSE(store.contains(hash_of(1)));
    EXPECT_EQ(blocks_on_disk(dir), 3u);
    EXPECT_EQ(store.stats().evictions, 1u);
    EXPECT_EQ(store.stats().bytes, 3 * block_bytes());
  }
  // A smaller budget after a restart trims to it.
  DiskStore smaller(dir, TierCodec(identity()), 2 * block_bytes());
  EXPECT_EQ(smaller.stats().blocks, 2u);
  EXPECT_EQ(blocks_on_disk(dir), 2u);
}

// Files that only look like the store's, and links, are never written, followed or deleted:
// the store writes its blocks in other segments.
TEST(DiskStore, LeavesFilesItDoesNotRecogniseAlone) {
  const fs::path dir = fresh_dir("leftovers");
  std::string tag;
  {
    DiskStore store(dir, TierCodec(identity()), 1 << 20);
    ASSERT_TRUE(store.put(ns_of(1), hash_of(1), 4, payload(1)));
    const fs::path segment = store.location(hash_of(1))->file;
    tag = segment.filename().string().substr(0, 16);
    EXPECT_EQ(segment.filename().string(), tag + "-000000.kvs");
    EXPECT_EQ(store.clear(), 1u);
    fs::remove(segment);
  }
  const auto named = [&](int n) { return dir / fmt::format("{}-{:06}.kvs", tag, n); };
  std::ofstream(dir / "notes.txt") << "not ours";
  std::ofstream(named(0)) << "bad magic, not a segment";
  fs::create_directories(named(1));
  const fs::path target = kvc::testing::scratch_dir() / "leftovers-target";
  std::ofstream(target) << "must survive";
  fs::create_symlink(target, named(2));
  {
    DiskStore store(dir, TierCodec(identity()), 1 << 20);
    EXPECT_EQ(store.stats().blocks, 0u);
    EXPECT_EQ(store.stats().foreign_files, 1u);
    ASSERT_TRUE(store.put(ns_of(1), hash_of(1), 4, payload(1)));
    std::vector<uint8_t> out(payload(1).size());
    ASSERT_TRUE(store.get(ns_of(1), hash_of(1), out));
    EXPECT_EQ(out, payload(1));
    EXPECT_NE(store.location(hash_of(1))->file, named(0));
    EXPECT_NE(store.location(hash_of(1))->file, named(2));
    EXPECT_EQ(store.clear(), 1u);
    std::ifstream bad(named(0));
    EXPECT_EQ(std::string(std::istreambuf_iterator<char>(bad), {}), "bad magic, not a segment");
    EXPECT_TRUE(fs::is_directory(named(1)));
    std::ifstream kept(target);
    EXPECT_EQ(std::string(std::istreambuf_iterator<char>(kept), {}), "must survive");
    EXPECT_TRUE(fs::exists(dir / "notes.txt"));
  }
  // Removing the stores' files takes the real segment and the lock, and nothing else.
  EXPECT_EQ(DiskStore::remove_files(dir), 3u);  // segments 0 (bad magic) and 3, the lock
  EXPECT_TRUE(fs::is_directory(named(1)));
  EXPECT_TRUE(fs::is_symlink(named(2)));
  EXPECT_TRUE(fs::exists(dir / "notes.txt"));
  EXPECT_TRUE(fs::exists(target));
}

TEST(DiskStore, AFailedWriteLeavesNoBlockAndIsCounted) {
  const fs::path dir = fresh_dir("full");
  // A file size limit below one block makes every write fail as a full disk would; it is set
  // in a child process so that nothing else in this test program is limited.
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    std::signal(SIGXFSZ, SIG_IGN);
    rlimit limit{100, 100};
    setrlimit(RLIMIT_FSIZE, &limit);
    DiskStore store(dir, TierCodec(identity()), 1 << 20);
    const bool wrote = store.put(ns_of(1), hash_of(1), 4, payload(1));
    const DiskStoreStats st = store.stats();
    _exit(!wrote && st.write_errors == 1 && st.bytes == 0 && st.blocks == 0 ? 0 : 1);
  }
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0);
  EXPECT_EQ(data_files(dir), 0u);  // not even an empty segment
  // A block bigger than the whole budget is refused, not written.
  DiskStore tiny(dir, TierCodec(identity()), block_bytes() - 1);
  EXPECT_FALSE(tiny.put(ns_of(1), hash_of(1), 4, payload(1)));
  EXPECT_EQ(tiny.stats().write_errors, 1u);
}

// kill -9 in the middle of writing: every block found at the next open is whole and correct
// (a slot's header is written after its payload, so an interrupted write is never found).
TEST(DiskStore, AfterKillNineEveryBlockFoundIsWhole) {
  const fs::path dir = fresh_dir("kill9");
  int ready[2];
  ASSERT_EQ(pipe(ready), 0);
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    close(ready[0]);
    DiskStore store(dir, TierCodec(identity(), TierCompression::kZstd, std::nullopt), 1 << 30);
    for (int i = 0;; ++i) {
      store.put(ns_of(1), hash_of(i % 60000), 4, payload(i % 60000));
      if (i == 50 && write(ready[1], "x", 1) != 1) _exit(2);
    }
  }
  close(ready[1]);
  char c = 0;
  ASSERT_EQ(read(ready[0], &c, 1), 1);  // at least 50 blocks written
  close(ready[0]);
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  kill(child, SIGKILL);
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFSIGNALED(status));

  DiskStore again(dir, TierCodec(identity()), 1 << 30);
  const size_t found = again.stats().found_at_open;
  EXPECT_GE(found, 50u);
  std::vector<uint8_t> out(payload(0).size());
  size_t whole = 0;
  for (int i = 0; i < 60000 && whole < found; ++i) {
    if (!again.contains(hash_of(i))) continue;
    ASSERT_TRUE(again.get(ns_of(1), hash_of(i), out)) << i;
    EXPECT_EQ(out, payload(i));
    ++whole;
  }
  EXPECT_EQ(whole, found);
  EXPECT_EQ(again.stats().corrupt, 0u);
  std::printf("[ measured ] %zu whole blocks found after kill -9\n", found);
}

// A header torn by a crash mid-write (a header can span two pages, and a write be cut between
// them): its first bytes the new block's, the rest the slot's old header. Wherever the tear
// falls past the bytes both headers share, neither block is found at the next open.
TEST(DiskStore, ATornHeaderIsNeverFound) {
  for (size_t tear : {81u, 100u, 150u, 188u}) {  // bytes of the new header written
    const fs::path dir = fresh_dir(fmt::format("torn-{}", tear));
    DiskBlockLocation at;
    {
      DiskStore store(dir, TierCodec(identity()), 1 << 20);
      ASSERT_TRUE(store.put(ns_of(1), hash_of(1), 4, payload(1)));
      at = *store.location(hash_of(1));
    }
    const std::vector<uint8_t> next =
        TierCodec(identity()).encode(ns_of(1), hash_of(2), 4, payload(2));
    {
      std::fstream f(at.file, std::ios::in | std::ios::out | std::ios::binary);
      f.seekp(static_cast<std::streamoff>(at.offset + kTierHeaderBytes));
      f.write(reinterpret_cast<const char*>(next.data() + kTierHeaderBytes),
              static_cast<std::streamsize>(next.size() - kTierHeaderBytes));
      f.seekp(static_cast<std::streamoff>(at.offset));
      f.write(reinterpret_cast<const char*>(next.data()), static_cast<std::streamsize>(tear));
    }
    DiskStore again(dir, TierCodec(identity()), 1 << 20);
    EXPECT_EQ(again.stats().found_at_open, 0u) << "torn after " << tear << " bytes";
    EXPECT_FALSE(again.contains(hash_of(1)));
    EXPECT_FALSE(again.contains(hash_of(2)));
    EXPECT_EQ(again.stats().corrupt, 0u);
  }
}

TEST(DiskStore, HeaderRoundTripsEveryField) {
  TierBlockHeader h = make_tier_header(identity(), ns_of(3), hash_of(9), 3);
  h.flags = TierBlockHeader::kEncrypted;
  h.payload_bytes = 1234;
  h.payload_checksum = 0x0123456789abcdefull;
  std::iota(h.nonce.begin(), h.nonce.end(), 1);
  std::iota(h.tag.begin(), h.tag.end(), 50);
  const auto bytes = encode_tier_header(h);
  std::string why;
  const auto back = decode_tier_header(bytes, why);
  ASSERT_TRUE(back) << why;
  EXPECT_EQ(back->flags, h.flags);
  EXPECT_EQ(back->model_fingerprint, h.model_fingerprint);
  EXPECT_EQ(back->ns, h.ns);
  EXPECT_EQ(back->block_hash, h.block_hash);
  EXPECT_EQ(back->n_layers, 2);
  EXPECT_EQ(back->n_kv_heads, 2);
  EXPECT_EQ(back->head_dim, 4);
  EXPECT_EQ(back->block_tokens, 4);
  EXPECT_EQ(back->token_count, 3u);
  EXPECT_EQ(back->payload_bytes, 1234u);
  EXPECT_EQ(back->payload_checksum, h.payload_checksum);
  EXPECT_EQ(back->nonce, h.nonce);
  EXPECT_EQ(back->tag, h.tag);
  auto bad = bytes;
  bad[0] = 'X';
  EXPECT_FALSE(decode_tier_header(bad, why));
  EXPECT_THAT(why, ::testing::HasSubstr("magic"));
  bad = bytes;
  bad[4] = 9;
  EXPECT_FALSE(decode_tier_header(bad, why));
  EXPECT_THAT(why, ::testing::HasSubstr("version 9"));
  EXPECT_FALSE(decode_tier_header(std::span(bytes).first(100), why));
}

}  // namespace
}  // namespace kvc::kv
