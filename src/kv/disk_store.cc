#include "kv/disk_store.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstring>
#include <vector>

#include "base/error.h"

namespace kvc::kv {
namespace {

namespace fs = std::filesystem;

constexpr std::string_view kSegmentSuffix = ".kvs";
constexpr std::array<char, 8> kSegmentMagic = {'K', 'V', 'C', 'S', 'E', 'G', '0', '1'};
constexpr uint32_t kSegmentVersion = 1;
constexpr uint64_t kSegmentHeaderBytes = 4096;
// A segment holds up to 64 MiB of slots (at least one, at most 4096).
constexpr uint64_t kSegmentTargetBytes = uint64_t{64} << 20;

uint64_t slots_per_segment_for(uint64_t slot_bytes) {
  return std::clamp<uint64_t>(kSegmentTargetBytes / slot_bytes, 1, 4096);
}

// 16 hex digits naming the model and KV layout of identity.
std::string layout_tag(const TierIdentity& id) {
  std::vector<uint8_t> bytes(id.model_fingerprint.begin(), id.model_fingerprint.end());
  const KvGeometry& g = id.geometry;
  for (const int v : {g.n_layers, g.n_kv_heads, g.head_dim, g.block_tokens,
                      static_cast<int>(g.k_dtype), static_cast<int>(g.v_dtype)}) {
    for (int i = 0; i < 4; ++i)
      bytes.push_back(static_cast<uint8_t>(static_cast<uint32_t>(v) >> (8 * i)));
  }
  return fmt::format("{:016x}", payload_checksum(bytes));
}

bool is_hex(std::string_view s) {
  return std::all_of(s.begin(), s.end(),
                     [](char c) { return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'); });
}

// The segment number of a file named "<16 hex>-<digits>.kvs" with that tag (any tag when tag
// is empty); nullopt for any other name.
std::optional<uint64_t> segment_number(std::string_view name, std::string_view tag) {
  if (name.size() < 16 + 1 + 1 + kSegmentSuffix.size() || !name.ends_with(kSegmentSuffix) ||
      name[16] != '-' || !is_hex(name.substr(0, 16)) ||
      (!tag.empty() && name.substr(0, 16) != tag)) {
    return std::nullopt;
  }
  const std::string_view digits = name.substr(17, name.size() - 17 - kSegmentSuffix.size());
  if (digits.empty() || digits.size() > 9 ||
      !std::all_of(digits.begin(), digits.end(), [](char c) { return c >= '0' && c <= '9'; })) {
    return std::nullopt;
  }
  return std::stoull(std::string(digits));
}

bool pwrite_all(int fd, const uint8_t* p, size_t n, uint64_t offset) {
  while (n > 0) {
    const ssize_t w = ::pwrite(fd, p, n, static_cast<off_t>(offset));
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return false;
    p += w;
    n -= static_cast<size_t>(w);
    offset += static_cast<uint64_t>(w);
  }
  return true;
}

// Reads up to n bytes at offset; the count read (short at the end of the file), or -1 on error.
ssize_t pread_up_to(int fd, uint8_t* p, size_t n, uint64_t offset) {
  size_t got = 0;
  while (got < n) {
    const ssize_t r = ::pread(fd, p + got, n - got, static_cast<off_t>(offset + got));
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) return -1;
    if (r == 0) break;
    got += static_cast<size_t>(r);
  }
  return static_cast<ssize_t>(got);
}

struct Fd {
  int fd = -1;
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
};

struct SegmentHeader {
  uint64_t slot_bytes = 0;
  uint64_t slots = 0;
};

std::array<uint8_t, 32> encode_segment_header(const SegmentHeader& h) {
  std::array<uint8_t, 32> b{};
  std::memcpy(b.data(), kSegmentMagic.data(), 8);
  const auto put = [&](size_t at, uint64_t v, int n) {
    for (int i = 0; i < n; ++i) b[at + i] = static_cast<uint8_t>(v >> (8 * i));
  };
  put(8, kSegmentVersion, 4);
  put(12, kSegmentHeaderBytes, 4);
  put(16, h.slot_bytes, 8);
  put(24, h.slots, 8);
  return b;
}

// The header of the segment open as fd; nullopt when it is not one of this format.
std::optional<SegmentHeader> read_segment_header(int fd) {
  std::array<uint8_t, 32> b{};
  if (pread_up_to(fd, b.data(), b.size(), 0) != static_cast<ssize_t>(b.size())) return std::nullopt;
  const auto get = [&](size_t at, int n) {
    uint64_t v = 0;
    for (int i = 0; i < n; ++i) v |= static_cast<uint64_t>(b[at + i]) << (8 * i);
    return v;
  };
  if (std::memcmp(b.data(), kSegmentMagic.data(), 8) != 0 || get(8, 4) != kSegmentVersion ||
      get(12, 4) != kSegmentHeaderBytes || get(16, 8) < kTierHeaderBytes || get(24, 8) == 0) {
    return std::nullopt;
  }
  return SegmentHeader{get(16, 8), get(24, 8)};
}

// Calls visit(segment number, fd, header, path) for each segment file of dir named with tag (any
// tag when empty), with fd -1 when it has no whole header; counts in *skipped the segment files
// of other tags and those without a whole header.
template <typename Visit>
void for_each_segment(const fs::path& dir, std::string_view tag, int open_flags, Visit visit,
                      uint64_t* skipped) {
  std::error_code ec;
  for (const fs::directory_entry& e : fs::directory_iterator(dir, ec)) {
    std::error_code fec;
    const std::string name = e.path().filename().string();
    if (!segment_number(name, "")) continue;
    const auto number = segment_number(name, tag);
    if (!number) {
      if (skipped) ++*skipped;
      continue;
    }
    // A directory or a link under a segment's name is never opened, followed or written.
    const int fd = e.is_symlink(fec) || !e.is_regular_file(fec)
                       ? -1
                       : ::open(e.path().c_str(), open_flags | O_CLOEXEC | O_NOFOLLOW);
    const auto header = fd >= 0 ? read_segment_header(fd) : std::nullopt;
    if (!header) {
      if (fd >= 0) {
        ::close(fd);
        if (skipped) ++*skipped;
      }
      visit(*number, -1, SegmentHeader{}, e.path());
      continue;
    }
    visit(*number, fd, *header, e.path());
  }
}

// Calls visit(slot index, offset, header) for each slot of the segment open as fd whose
// header is whole and parses; returns the slots the file holds (the last may be cut short).
template <typename Visit>
uint64_t for_each_slot_header(int fd, const SegmentHeader& h, Visit visit) {
  struct stat st {};
  const uint64_t size = ::fstat(fd, &st) == 0 ? static_cast<uint64_t>(st.st_size) : 0;
  const uint64_t slots =
      size <= kSegmentHeaderBytes
          ? 0
          : std::min(h.slots, (size - kSegmentHeaderBytes + h.slot_bytes - 1) / h.slot_bytes);
  std::array<uint8_t, kTierHeaderBytes> head{};
  for (uint64_t i = 0; i < slots; ++i) {
    const uint64_t offset = kSegmentHeaderBytes + i * h.slot_bytes;
    if (pread_up_to(fd, head.data(), head.size(), offset) != static_cast<ssize_t>(head.size())) {
      continue;
    }
    std::string why;
    if (const auto th = decode_tier_header(head, why)) visit(i, offset, *th);
  }
  return slots;
}
}  // namespace

DiskStore::DiskStore(std::filesystem::path dir, TierCodec codec, uint64_t max_bytes)
    : dir_(std::move(dir)),
      codec_(std::move(codec)),
      max_bytes_(max_bytes),
      slot_bytes_(kTierHeaderBytes + codec_.identity().geometry.bytes_per_block()),
      slots_per_segment_(slots_per_segment_for(slot_bytes_)),
      tag_(layout_tag(codec_.identity())) {
  std::error_code ec;
  fs::create_directories(dir_, ec);
  if (!fs::is_directory(dir_, ec)) {
    fail("--kv-disk {}: not a directory that can be created or used{}", dir_.string(),
         ec ? ": " + ec.message() : "");
  }
  const fs::path lock_path = dir_ / (tag_ + ".lock");
  lock_fd_ = ::open(lock_path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600);
  if (lock_fd_ < 0) {
    fail("--kv-disk {}: cannot open its lock file {}: {}", dir_.string(), lock_path.string(),
         std::strerror(errno));
  }
  if (::flock(lock_fd_, LOCK_EX | LOCK_NB) != 0) {
    const int err = errno;
    ::close(lock_fd_);
    lock_fd_ = -1;
    fail("--kv-disk {}: {}", dir_.string(),
         err == EWOULDBLOCK
             ? "another kvcache process is using it for the same model and KV layout (each "
               "process needs its own directory; share blocks between instances through "
               "--kv-redis)"
             : std::string("cannot lock it: ") + std::strerror(err));
  }
  scan();
}

DiskStore::~DiskStore() {
  MutexLock lock(mu_);
  for (const auto& [number, fd] : segments_) ::close(fd);
  if (lock_fd_ >= 0) ::close(lock_fd_);  // releases the lock
}

fs::path DiskStore::segment_path(uint64_t segment) const {
  return dir_ / fmt::format("{}-{:06}{}", tag_, segment, kSegmentSuffix);
}

uint64_t DiskStore::slot_offset(uint64_t slot) const {
  return kSegmentHeaderBytes + (slot % slots_per_segment_) * slot_bytes_;
}

void DiskStore::scan() {
  struct Found {
    Hash256 hash;
    uint64_t slot;
    uint64_t bytes;
  };
  std::vector<Found> found;
  uint64_t foreign = 0;
  std::map<uint64_t, int> open;
  std::map<uint64_t, uint64_t> high;
  std::set<uint64_t> unusable;
  for_each_segment(
      dir_, tag_, O_RDWR,
      [&](uint64_t number, int fd, const SegmentHeader& h, const fs::path&) {
        if (fd < 0 || h.slot_bytes != slot_bytes_ || h.slots != slots_per_segment_) {
          if (fd >= 0) {
            ::close(fd);
            ++foreign;
          }
          unusable.insert(number);  // another file holds this segment's name
          return;
        }
        open[number] = fd;
        high[number] =
            for_each_slot_header(fd, h, [&](uint64_t i, uint64_t, const TierBlockHeader& th) {
              if (identity_mismatch(th, codec_.identity()).empty() &&
                  th.payload_bytes + kTierHeaderBytes <= slot_bytes_) {
                found.push_back({th.block_hash, number * slots_per_segment_ + i,
                                 kTierHeaderBytes + th.payload_bytes});
              }
            });
      },
      &foreign);
  std::sort(found.begin(), found.end(),
            [](const Found& a, const Found& b) { return a.slot < b.slot; });
  MutexLock lock(mu_);
  segments_ = std::move(open);
  unusable_segments_ = std::move(unusable);
  segment_high_ = std::move(high);
  // The slots within each segment's file are free until a block is found in them.
  for (const auto& [number, slots] : segment_high_) {
    for (uint64_t i = 0; i < slots; ++i) free_slots_.insert(number * slots_per_segment_ + i);
  }
  for (const Found& f : found) {
    auto [it, fresh] = entries_.try_emplace(f.hash);
    if (!fresh) {  // the same block twice (a slot freed where holes cannot be punched)
      release_slot_locked(f.slot);
      continue;
    }
    free_slots_.erase(f.slot);
    it->second.slot = f.slot;
    it->second.bytes = f.bytes;
    touch_locked(f.hash, it->second);
    stats_.bytes += slot_bytes_;
  }
  stats_.found_at_open = entries_.size();
  stats_.foreign_files = foreign;
  // A smaller budget than last time: trim to it.
  while (stats_.bytes > max_bytes_ && !by_use_.empty()) {
    remove_locked(by_use_.begin()->second);
    ++stats_.evictions;
  }
}

int DiskStore::segment_fd_locked(uint64_t segment) {
  if (auto it = segments_.find(segment); it != segments_.end()) return it->second;
  const fs::path path = segment_path(segment);
  const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600);
  if (fd < 0) return -1;
  struct stat st {};
  bool ok = ::fstat(fd, &st) == 0;
  if (ok && st.st_size == 0) {
    const auto head = encode_segment_header({slot_bytes_, slots_per_segment_});
    ok = pwrite_all(fd, head.data(), head.size(), 0) && ::ftruncate(fd, kSegmentHeaderBytes) == 0;
    if (!ok) ::unlink(path.c_str());  // a disk too full for a segment's header leaves nothing
  } else if (ok) {
    const auto h = read_segment_header(fd);
    ok = h && h->slot_bytes == slot_bytes_ && h->slots == slots_per_segment_;
  }
  if (!ok) {
    ::close(fd);
    return -1;
  }
  segments_[segment] = fd;
  return fd;
}

uint64_t DiskStore::take_slot_locked() {
  while (!free_slots_.empty()) {
    const uint64_t s = *free_slots_.begin();
    free_slots_.erase(free_slots_.begin());
    if (unusable_segments_.count(s / slots_per_segment_) == 0) return s;
  }
  for (auto& [number, high] : segment_high_) {
    if (high < slots_per_segment_ && unusable_segments_.count(number) == 0) {
      return number * slots_per_segment_ + high++;
    }
  }
  uint64_t number = 0;  // a new segment, under the lowest number not taken
  while (segment_high_.count(number) > 0 || unusable_segments_.count(number) > 0) ++number;
  segment_high_[number] = 1;
  return number * slots_per_segment_;
}

void DiskStore::release_slot_locked(uint64_t slot) {
  ++generation_[slot];
  free_slots_.insert(slot);
  const auto it = segments_.find(slot / slots_per_segment_);
  if (it == segments_.end()) return;
  const uint64_t offset = slot_offset(slot);
  // The hole gives the space back; where the file system cannot punch one, a zeroed header is
  // enough for no scan to find the block again.
  if (::fallocate(it->second, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE,
                  static_cast<off_t>(offset), static_cast<off_t>(slot_bytes_)) != 0) {
    const std::array<uint8_t, kTierHeaderBytes> zeros{};
    pwrite_all(it->second, zeros.data(), zeros.size(), offset);
  }
}

void DiskStore::touch_locked(const Hash256& block_hash, Entry& e) {
  if (e.last_used != 0) by_use_.erase(e.last_used);
  e.last_used = ++clock_;
  by_use_.emplace(e.last_used, block_hash);
}

void DiskStore::remove_locked(Hash256 block_hash) {
  auto it = entries_.find(block_hash);
  if (it == entries_.end()) return;
  by_use_.erase(it->second.last_used);
  release_slot_locked(it->second.slot);
  entries_.erase(it);
  stats_.bytes -= slot_bytes_;
}

bool DiskStore::contains(const Hash256& block_hash) const {
  MutexLock lock(mu_);
  return entries_.count(block_hash) > 0;
}

std::optional<DiskBlockLocation> DiskStore::location(const Hash256& block_hash) const {
  MutexLock lock(mu_);
  const auto it = entries_.find(block_hash);
  if (it == entries_.end()) return std::nullopt;
  return DiskBlockLocation{segment_path(it->second.slot / slots_per_segment_),
                           slot_offset(it->second.slot), it->second.bytes};
}

bool DiskStore::put(const Hash256& ns, const Hash256& block_hash, uint32_t token_count,
                    std::span<const uint8_t> payload) {
  {
    MutexLock lock(mu_);
    if (entries_.count(block_hash) > 0 || writing_.count(block_hash) > 0) return true;
  }
  const std::vector<uint8_t> data = codec_.encode(ns, block_hash, token_count, payload);
  uint64_t slot = 0;
  int fd = -1;
  {
    MutexLock lock(mu_);
    if (entries_.count(block_hash) > 0 || writing_.count(block_hash) > 0) return true;
    if (slot_bytes_ > max_bytes_ || data.size() > slot_bytes_) {
      ++stats_.write_errors;
      return false;
    }
    while (stats_.bytes + slot_bytes_ > max_bytes_ && !by_use_.empty()) {
      remove_locked(by_use_.begin()->second);
      ++stats_.evictions;
    }
    if (stats_.bytes + slot_bytes_ > max_bytes_) {  // the rest of the budget is being written
      ++stats_.write_errors;
      return false;
    }
    // A segment whose name another file took since the scan is skipped (a few times at
    // most: a failure to create one is the file system's, such as a full disk).
    for (int attempt = 0; attempt < 4 && fd < 0; ++attempt) {
      slot = take_slot_locked();
      fd = segment_fd_locked(slot / slots_per_segment_);
      if (fd < 0 && std::filesystem::exists(segment_path(slot / slots_per_segment_))) {
        unusable_segments_.insert(slot / slots_per_segment_);
      } else if (fd < 0) {
        free_slots_.insert(slot);
        break;
      }
    }
    if (fd < 0) {
      ++stats_.write_errors;
      return false;
    }
    stats_.bytes += slot_bytes_;
    writing_.insert(block_hash);
  }
  // The payload first, the header last: a slot is found by a scan only once it is whole.
  const uint64_t offset = slot_offset(slot);
  const bool ok = pwrite_all(fd, data.data() + kTierHeaderBytes, data.size() - kTierHeaderBytes,
                             offset + kTierHeaderBytes) &&
                  pwrite_all(fd, data.data(), kTierHeaderBytes, offset);
  MutexLock lock(mu_);
  writing_.erase(block_hash);
  if (!ok) {
    release_slot_locked(slot);
    stats_.bytes -= slot_bytes_;
    ++stats_.write_errors;
    return false;
  }
  Entry& e = entries_[block_hash];
  e.slot = slot;
  e.bytes = data.size();
  touch_locked(block_hash, e);
  ++stats_.writes;
  stats_.bytes_written += data.size();
  return true;
}

bool DiskStore::get(const Hash256& ns, const Hash256& block_hash, std::span<uint8_t> out) {
  uint64_t slot = 0, generation = 0;
  int fd = -1;
  {
    MutexLock lock(mu_);
    auto it = entries_.find(block_hash);
    if (it == entries_.end()) {
      ++stats_.misses;
      return false;
    }
    touch_locked(block_hash, it->second);
    slot = it->second.slot;
    generation = generation_[slot];
    fd = segments_.at(slot / slots_per_segment_);
  }
  std::vector<uint8_t> stored(slot_bytes_);
  const ssize_t got = pread_up_to(fd, stored.data(), stored.size(), slot_offset(slot));
  std::string why;
  if (got >= 0) {
    const auto n = static_cast<size_t>(got);
    std::optional<TierBlockHeader> h;
    if (n < kTierHeaderBytes) {
      why = "truncated header";
    } else if (!(h = decode_tier_header(std::span(stored).first(kTierHeaderBytes), why))) {
      // why says what is wrong with the header
    } else if (h->payload_bytes > out.size()) {
      // Compression is kept only when it saves bytes: a stored payload is never larger.
      why = fmt::format("payload of {} bytes, the pool's blocks hold {}", h->payload_bytes,
                        out.size());
    } else if (kTierHeaderBytes + h->payload_bytes > n) {
      why = "truncated payload";
    } else {
      why = codec_.decode(*h, ns, block_hash,
                          std::span(stored).subspan(kTierHeaderBytes, h->payload_bytes), out);
    }
  }
  MutexLock lock(mu_);
  // A slot freed while it was read may have been written again meanwhile, and a read that
  // overlapped that write can pair one block's header bytes with another's (the page cache
  // copies without a lock against writers): even a read that passed every check is a miss.
  // While the generation stands, no write touched the slot, so what was read is whole.
  if (generation_[slot] != generation) {
    ++stats_.misses;
    return false;
  }
  if (got >= 0 && why.empty()) {
    ++stats_.hits;
    stats_.bytes_read += kTierHeaderBytes + out.size();
    return true;
  }
  remove_locked(block_hash);
  ++(got < 0 ? stats_.read_errors : stats_.corrupt);
  return false;
}

bool DiskStore::erase(const Hash256& block_hash) {
  MutexLock lock(mu_);
  if (entries_.count(block_hash) == 0) return false;
  remove_locked(block_hash);
  return true;
}

size_t DiskStore::clear() {
  MutexLock lock(mu_);
  size_t n = 0;
  while (!by_use_.empty()) {
    remove_locked(by_use_.begin()->second);
    ++n;
  }
  if (writing_.empty()) {
    for (const auto& [number, fd] : segments_) {
      if (::ftruncate(fd, kSegmentHeaderBytes) != 0) return n;  // keep the slots as they are
    }
    free_slots_.clear();
    for (auto& [number, high] : segment_high_) high = 0;
  }
  return n;
}

DiskStoreStats DiskStore::stats() const {
  MutexLock lock(mu_);
  DiskStoreStats s = stats_;
  s.blocks = entries_.size();
  return s;
}

std::vector<StoredDiskBlock> DiskStore::stored_blocks(const std::filesystem::path& dir) {
  std::vector<StoredDiskBlock> blocks;
  for_each_segment(
      dir, "", O_RDONLY,
      [&](uint64_t, int fd, const SegmentHeader& h, const fs::path& file) {
        if (fd < 0) return;
        for_each_slot_header(fd, h, [&](uint64_t, uint64_t offset, const TierBlockHeader& th) {
          blocks.push_back({th.block_hash, {file, offset, kTierHeaderBytes + th.payload_bytes}});
        });
        ::close(fd);
      },
      nullptr);
  return blocks;
}

size_t DiskStore::remove_files(const std::filesystem::path& dir) {
  std::vector<fs::path> doomed;
  std::error_code ec;
  for (const fs::directory_entry& e : fs::directory_iterator(dir, ec)) {
    std::error_code fec;
    if (!e.is_regular_file(fec) || e.is_symlink(fec)) continue;
    const std::string name = e.path().filename().string();
    const bool lock =
        name.size() == 16 + 5 && name.ends_with(".lock") && is_hex(name.substr(0, 16));
    if (lock || segment_number(name, "")) doomed.push_back(e.path());
  }
  size_t n = 0;
  for (const fs::path& p : doomed) n += fs::remove(p, ec) ? 1 : 0;
  return n;
}

}  // namespace kvc::kv
