// The disk tier's store: KV blocks as single files in one directory, found again after a
// restart (even after kill -9), within a byte budget.
//
// Each block is one file named by its chained hash (64 hex digits + ".kvb") holding a
// TierBlockHeader and the payload. Writes go to a temporary file in the same directory that is
// then renamed over the name, so a reader sees a whole block or none. Opening the store scans
// the directory and indexes the files whose header matches this model and layout; files of
// other models or layouts are left alone and never used. Deletion is always of single files
// the store recognises by name and header, never recursive. A block that fails its checks when
// read (truncated, a flipped byte, wrong namespace) is deleted, counted and reported missing:
// the caller recomputes it.
//
// This is a mechanism: which blocks to write, read or evict is decided by the KV cache manager.
// Over budget, the store drops its least recently used blocks to make room for a write.
//
// Thread-safety: every function may be called from any thread (one internal lock; file I/O
// for reads and writes happens outside it).
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <unordered_map>

#include "base/mutex.h"
#include "kv/content_hash.h"
#include "kv/tier_block.h"
#include "kv/tier_codec.h"

namespace kvc::kv {

struct DiskStoreStats {
  size_t blocks = 0;           // blocks indexed now
  uint64_t bytes = 0;          // their file bytes
  uint64_t found_at_open = 0;  // blocks indexed by the scan when the store opened
  uint64_t foreign_files = 0;  // files of another model or layout, left alone
  uint64_t writes = 0;         // blocks written
  uint64_t write_errors = 0;   // writes that failed (disk full, I/O error)
  uint64_t hits = 0;           // reads that returned a block
  uint64_t misses = 0;         // reads of blocks the store does not hold
  uint64_t corrupt = 0;        // reads refused by the checks (file deleted)
  uint64_t read_errors = 0;    // reads that failed at the file system
  uint64_t evictions = 0;      // blocks deleted to stay within the budget
  uint64_t bytes_written = 0;
  uint64_t bytes_read = 0;
};

class DiskStore {
 public:
  // Opens dir (creating it if needed) for blocks of identity, keeping at most max_bytes of
  // block files. Throws Error when dir cannot be created or is not a directory.
  // codec packs and checks blocks (identity, compression, encryption).
  DiskStore(std::filesystem::path dir, TierCodec codec, uint64_t max_bytes);

  // True when the block is indexed (a read may still find it corrupt).
  bool contains(const Hash256& block_hash) const;
  // Stores payload as block block_hash of namespace ns holding token_count tokens, replacing
  // nothing if it is already there; evicts the least recently used blocks first to stay within
  // the budget. False (and counted) when the write fails; a failed write leaves no file.
  bool put(const Hash256& ns, const Hash256& block_hash, uint32_t token_count,
           std::span<const uint8_t> payload);
  // Reads block block_hash of namespace ns into out (exactly the payload size); false when it
  // is absent, unreadable or fails a check (then it is deleted and counted as corrupt).
  bool get(const Hash256& ns, const Hash256& block_hash, std::span<uint8_t> out);
  // Deletes one block's file; false when it was not indexed.
  bool erase(const Hash256& block_hash);
  // Deletes every block file indexed; returns how many.
  size_t clear();

  DiskStoreStats stats() const;
  const std::filesystem::path& dir() const { return dir_; }
  uint64_t max_bytes() const { return max_bytes_; }

  // The file name of a block: 64 hex digits and ".kvb".
  static std::string file_name(const Hash256& block_hash);

 private:
  struct Entry {
    uint64_t bytes = 0;
    uint64_t last_used = 0;
  };
  void scan();
  // Deletes the indexed file of block (under the lock); returns its bytes. By value: callers
  // pass keys that live in the maps this erases from.
  uint64_t remove_locked(Hash256 block_hash) REQUIRES(mu_);
  void touch_locked(const Hash256& block_hash, Entry& e) REQUIRES(mu_);

  const std::filesystem::path dir_;
  const TierCodec codec_;
  const uint64_t max_bytes_;

  mutable Mutex mu_;
  std::map<Hash256, Entry> entries_ GUARDED_BY(mu_);
  std::map<uint64_t, Hash256> by_use_ GUARDED_BY(mu_);   // last_used -> block, oldest first
  std::map<Hash256, uint64_t> writing_ GUARDED_BY(mu_);  // blocks being written -> bytes held
  uint64_t clock_ GUARDED_BY(mu_) = 0;
  uint64_t temp_counter_ GUARDED_BY(mu_) = 0;
  DiskStoreStats stats_ GUARDED_BY(mu_);
};

}  // namespace kvc::kv
