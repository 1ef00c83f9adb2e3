// The disk tier's store: KV blocks in fixed-size slots of a few segment files in one
// directory, found again after a restart (even after kill -9), within a byte budget.
//
// Why slots rather than a file per block: creating a file costs the file system an inode
// (0.1 to 0.8 ms of processor time per block on ext4 here, more than recomputing a small
// model's block), while writing into a slot of an open file costs a copy (about 0.01 ms), so
// the cost model can afford to keep what comes back.
//
// Layout: segment files "<tag>-<number>.kvs", where tag (16 hex digits) is a hash of the model
// fingerprint and the KV layout, so models and layouts sharing a directory never share a
// file. A segment starts with a 4 KiB header (magic "KVCSEG01", version, slot bytes, slots per
// segment) and then holds slots of one stored block each: the TierBlockHeader and the payload
// (a slot is as large as the header plus the pool's block, the largest stored form). A write
// fills the payload first and the header last, so a write interrupted by kill -9 leaves a slot
// without a header, which no scan indexes; a torn write that still has one fails its checksum
// when read. A slot is freed by punching a hole over it (or zeroing its header where the file
// system cannot punch), so its block is not found again. Opening the store scans the headers
// of its segments and indexes each whole-looking block of this model and layout; files of
// other models or layouts are left alone. The store holds an exclusive lock on "<tag>.lock"
// while open: a second process using the same model and layout in the same directory is
// refused at start-up rather than overwriting its slots. A block that fails its checks when
// read (truncated, a flipped byte, wrong namespace) is freed, counted and reported missing:
// the caller recomputes it.
//
// This is a mechanism: which blocks to write, read or evict is decided by the KV cache manager.
// Over budget (counted in slots), the store drops its least recently used blocks to make room
// for a write; after a restart, blocks count as used in slot order.
//
// Thread-safety: every function may be called from any thread (one internal lock; the
// payload I/O of reads and writes happens outside it).
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <vector>

#include "base/mutex.h"
#include "kv/content_hash.h"
#include "kv/tier_block.h"
#include "kv/tier_codec.h"

namespace kvc::kv {

struct DiskStoreStats {
  size_t blocks = 0;           // blocks indexed now
  uint64_t bytes = 0;          // their slots' bytes (the budget's unit)
  uint64_t found_at_open = 0;  // blocks indexed by the scan when the store opened
  uint64_t foreign_files = 0;  // segment files of another model or layout, left alone
  uint64_t writes = 0;         // blocks written
  uint64_t write_errors = 0;   // writes that failed (disk full, I/O error)
  uint64_t hits = 0;           // reads that returned a block
  uint64_t misses = 0;         // reads of blocks the store does not hold
  uint64_t corrupt = 0;        // reads refused by the checks (slot freed)
  uint64_t read_errors = 0;    // reads that failed at the file system
  uint64_t evictions = 0;      // blocks dropped to stay within the budget
  uint64_t bytes_written = 0;
  uint64_t bytes_read = 0;
};

// Where a block's slot lies: for tools and tests.
struct DiskBlockLocation {
  std::filesystem::path file;
  uint64_t offset = 0;  // of the slot's TierBlockHeader
  uint64_t bytes = 0;   // header and stored payload
};

struct StoredDiskBlock {
  Hash256 hash{};
  DiskBlockLocation location;
};

class DiskStore {
 public:
  // Opens dir (creating it if needed) for blocks of the codec's identity, keeping at most
  // max_bytes of slots. Throws Error when dir cannot be created or used, or when another
  // process holds it for the same model and layout. codec packs and checks blocks (identity,
  // compression, encryption).
  DiskStore(std::filesystem::path dir, TierCodec codec, uint64_t max_bytes);
  ~DiskStore();
  DiskStore(const DiskStore&) = delete;
  DiskStore& operator=(const DiskStore&) = delete;

  // True when the block is indexed (a read may still find it corrupt).
  bool contains(const Hash256& block_hash) const;
  // Stores payload as block block_hash of namespace ns holding token_count tokens, replacing
  // nothing if it is already there; evicts the least recently used blocks first to stay within
  // the budget. False (and counted) when the write fails; a failed write leaves no block.
  bool put(const Hash256& ns, const Hash256& block_hash, uint32_t token_count,
           std::span<const uint8_t> payload);
  // Reads block block_hash of namespace ns into out (exactly the payload size); false when it
  // is absent, unreadable, fails a check (then its slot is freed and it counts as corrupt) or
  // was freed while it was read (a miss). After false, out holds nothing to use.
  bool get(const Hash256& ns, const Hash256& block_hash, std::span<uint8_t> out);
  // Frees one block's slot; false when it was not indexed.
  bool erase(const Hash256& block_hash);
  // Frees every block indexed (and shortens the segments when no write is in flight);
  // returns how many.
  size_t clear();

  DiskStoreStats stats() const;
  const std::filesystem::path& dir() const { return dir_; }
  uint64_t max_bytes() const { return max_bytes_; }
  // Bytes of one slot: a header and the largest stored payload.
  uint64_t slot_bytes() const { return slot_bytes_; }
  // Where block_hash is stored, when it is indexed.
  std::optional<DiskBlockLocation> location(const Hash256& block_hash) const;

  // The blocks whose slot headers are whole in the segment files of dir, whatever their model
  // or layout, with where each lies (reads headers only; for tools and tests).
  static std::vector<StoredDiskBlock> stored_blocks(const std::filesystem::path& dir);
  // Deletes the segment and lock files of every model and layout in dir (regular files known
  // by their names; nothing else, never recursively), for a directory no store has open;
  // returns how many.
  static size_t remove_files(const std::filesystem::path& dir);

 private:
  struct Entry {
    uint64_t slot = 0;
    uint64_t bytes = 0;  // header and stored payload
    uint64_t last_used = 0;
  };
  void scan();
  // The open segment holding slot (created with its header when new); -1 when it cannot be.
  int segment_fd_locked(uint64_t segment) REQUIRES(mu_);
  std::filesystem::path segment_path(uint64_t segment) const;
  uint64_t slot_offset(uint64_t slot) const;
  // A free slot in a usable segment, the lowest first so that segments stay dense.
  uint64_t take_slot_locked() REQUIRES(mu_);
  // Makes slot free, and its block unfindable on disk.
  void release_slot_locked(uint64_t slot) REQUIRES(mu_);
  // Frees the slot of block (under the lock). By value: callers pass keys that live in the
  // maps this erases from.
  void remove_locked(Hash256 block_hash) REQUIRES(mu_);
  void touch_locked(const Hash256& block_hash, Entry& e) REQUIRES(mu_);

  const std::filesystem::path dir_;
  const TierCodec codec_;
  const uint64_t max_bytes_;
  const uint64_t slot_bytes_;
  const uint64_t slots_per_segment_;
  const std::string tag_;
  int lock_fd_ = -1;

  mutable Mutex mu_;
  std::map<Hash256, Entry> entries_ GUARDED_BY(mu_);
  std::map<uint64_t, Hash256> by_use_ GUARDED_BY(mu_);  // last_used -> block, oldest first
  std::set<Hash256> writing_ GUARDED_BY(mu_);           // blocks being written
  std::map<uint64_t, int> segments_ GUARDED_BY(mu_);    // segment number -> open file
  // Free slots below their segment's high-water mark (the slots above it are free too).
  std::set<uint64_t> free_slots_ GUARDED_BY(mu_);
  std::map<uint64_t, uint64_t> segment_high_ GUARDED_BY(mu_);  // segment -> slots handed out
  // Segment numbers whose file is not one the store can use (another file took the name).
  std::set<uint64_t> unusable_segments_ GUARDED_BY(mu_);
  // Bumped whenever a slot is freed, so a read that raced with it is not taken for damage.
  std::map<uint64_t, uint64_t> generation_ GUARDED_BY(mu_);
  uint64_t clock_ GUARDED_BY(mu_) = 0;
  DiskStoreStats stats_ GUARDED_BY(mu_);
};

}  // namespace kvc::kv
