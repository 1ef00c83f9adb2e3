#include "kv/disk_store.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fmt/format.h>

#include <csignal>
#include <fstream>
#include <numeric>
#include <thread>

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

TEST(DiskStore, RoundTripsABlock) {
  const fs::path dir = fresh_dir("roundtrip");
  DiskStore store(dir, TierCodec(identity()), 1 << 20);
  const auto p = payload(1);
  ASSERT_TRUE(store.put(ns_of(1), hash_of(1), 4, p));
  EXPECT_TRUE(store.contains(hash_of(1)));
  EXPECT_TRUE(fs::exists(dir / DiskStore::file_name(hash_of(1))));
  EXPECT_EQ(fs::file_size(dir / DiskStore::file_name(hash_of(1))), block_bytes());
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
  DiskStore again(dir, TierCodec(identity()), 1 << 20);
  EXPECT_EQ(again.stats().found_at_open, 5u);
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
  EXPECT_TRUE(fs::exists(dir / DiskStore::file_name(hash_of(1))));
}

TEST(DiskStore, RefusesAndDeletesDamagedBlocks) {
  const fs::path dir = fresh_dir("damaged");
  DiskStore store(dir, TierCodec(identity()), 1 << 20);
  for (int i = 0; i < 4; ++i) ASSERT_TRUE(store.put(ns_of(1), hash_of(i), 4, payload(i)));
  // 0: truncated payload; 1: a flipped payload byte; 2: a flipped header byte; 3: read under
  // another namespace.
  fs::resize_file(dir / DiskStore::file_name(hash_of(0)), block_bytes() - 5);
  auto flip = [&](int i, size_t offset) {
    std::fstream f(dir / DiskStore::file_name(hash_of(i)),
                   std::ios::in | std::ios::out | std::ios::binary);
    f.seekg(static_cast<std::streamoff>(offset));
    char c = 0;
    f.read(&c, 1);
    c = static_cast<char>(c ^ 0x10);
    f.seekp(static_cast<std::streamoff>(offset));
    f.write(&c, 1);
  };
  flip(1, kTierHeaderBytes + 17);
  flip(2, 150);  // inside the payload size field
  std::vector<uint8_t> out(payload(0).size());
  EXPECT_FALSE(store.get(ns_of(1), hash_of(0), out));
  EXPECT_FALSE(store.get(ns_of(1), hash_of(1), out));
  EXPECT_FALSE(store.get(ns_of(1), hash_of(2), out));
  EXPECT_FALSE(store.get(ns_of(2), hash_of(3), out));
  EXPECT_EQ(store.stats().corrupt, 4u);
  EXPECT_EQ(store.stats().blocks, 0u);
  EXPECT_EQ(store.stats().bytes, 0u);
  for (int i = 0; i < 4; ++i) EXPECT_FALSE(fs::exists(dir / DiskStore::file_name(hash_of(i))));
  // The store keeps working.
  ASSERT_TRUE(store.put(ns_of(1), hash_of(0), 4, payload(0)));
  ASSERT_TRUE(store.get(ns_of(1), hash_of(0), out));
  EXPECT_EQ(out, payload(0));
}

TEST(DiskStore, StaysWithinItsBudgetDroppingTheLeastRecentlyUsed) {
  const fs::path dir = fresh_dir("budget");
  DiskStore store(dir, TierCodec(identity()), 3 * block_bytes());
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(store.put(ns_of(1), hash_of(i), 4, payload(i)));
  std::vector<uint8_t> out(payload(0).size());
  ASSERT_TRUE(store.get(ns_of(1), hash_of(0), out));  // 0 is now the most recently used
  ASSERT_TRUE(store.put(ns_of(1), hash_of(3), 4, payload(3)));
  EXPECT_TRUE(store.contains(hash_of(0)));
  EXPECT_FALSE(store.contains(hash_of(1)));
  EXPECT_FALSE(fs::exists(dir / DiskStore::file_name(hash_of(1))));
  EXPECT_EQ(store.stats().evictions, 1u);
  EXPECT_EQ(store.stats().bytes, 3 * block_bytes());
  // A smaller budget after a restart trims to it.
  DiskStore smaller(dir, TierCodec(identity()), 2 * block_bytes());
  EXPECT_EQ(smaller.stats().blocks, 2u);
  size_t files = 0;
  for (const auto& e : fs::directory_iterator(dir)) files += e.is_regular_file();
  EXPECT_EQ(files, 2u);
}

TEST(DiskStore, RemovesOnlyItsOwnInterruptedWritesAtOpen) {
  const fs::path dir = fresh_dir("leftovers");
  const std::string temp = fmt::format(".{}.kvb.tmp.123.4", to_hex(hash_of(1)));
  std::ofstream(dir / temp) << "half a block";
  std::ofstream(dir / "notes.txt") << "not ours";
  std::ofstream(dir / DiskStore::file_name(hash_of(2))) << "bad magic, not a block";
  fs::create_directories(dir / DiskStore::file_name(hash_of(3)));
  const fs::path target = kvc::testing::scratch_dir() / "leftovers-target";
  std::ofstream(target) << "must survive";
  fs::create_symlink(target, dir / DiskStore::file_name(hash_of(4)));
  DiskStore store(dir, TierCodec(identity()), 1 << 20);
  EXPECT_FALSE(fs::exists(dir / temp));
  EXPECT_TRUE(fs::exists(dir / "notes.txt"));
  EXPECT_TRUE(fs::exists(dir / DiskStore::file_name(hash_of(2))));
  EXPECT_TRUE(fs::is_directory(dir / DiskStore::file_name(hash_of(3))));
  EXPECT_TRUE(fs::exists(target));
  EXPECT_EQ(store.stats().blocks, 0u);
  EXPECT_EQ(store.clear(), 0u);
  EXPECT_TRUE(fs::exists(target));
  EXPECT_TRUE(fs::exists(dir / "notes.txt"));
}

TEST(DiskStore, AFailedWriteLeavesNoFileAndIsCounted) {
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
  size_t files = 0;
  for (const auto& e : fs::directory_iterator(dir)) files += e.is_regular_file() ? 1 : 0;
  EXPECT_EQ(files, 0u);
  // A block bigger than the whole budget is refused, not written.
  DiskStore tiny(dir, TierCodec(identity()), block_bytes() - 1);
  EXPECT_FALSE(tiny.put(ns_of(1), hash_of(1), 4, payload(1)));
  EXPECT_EQ(tiny.stats().write_errors, 1u);
}

// kill -9 in the middle of writing: every block found at the next open is whole and correct
// (writes are a temporary file renamed into place), and the interrupted temporary is removed.
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
  for (const auto& e : fs::directory_iterator(dir)) {
    EXPECT_EQ(e.path().extension(), ".kvb") << e.path();  // no temporary left behind
  }
  std::printf("[ measured ] %zu whole blocks found after kill -9\n", found);
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
