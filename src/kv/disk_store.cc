#include "kv/disk_store.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <vector>

#include "base/error.h"

namespace kvc::kv {
namespace {

namespace fs = std::filesystem;

constexpr std::string_view kSuffix = ".kvb";
constexpr std::string_view kTempMarker = ".kvb.tmp.";

bool is_hex64(std::string_view s) {
  if (s.size() != 64) return false;
  for (char c : s) {
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return false;
  }
  return true;
}

std::optional<Hash256> parse_hex64(std::string_view s) {
  if (!is_hex64(s)) return std::nullopt;
  Hash256 h{};
  for (size_t i = 0; i < 32; ++i) {
    auto nibble = [](char c) { return c <= '9' ? c - '0' : c - 'a' + 10; };
    h[i] = static_cast<uint8_t>(nibble(s[2 * i]) << 4 | nibble(s[2 * i + 1]));
  }
  return h;
}

// A temporary file of an interrupted write: "." + 64 hex + ".kvb.tmp." + anything.
bool is_temp_name(std::string_view name) {
  return name.size() > 1 + 64 + kTempMarker.size() && name[0] == '.' &&
         is_hex64(name.substr(1, 64)) && name.substr(65, kTempMarker.size()) == kTempMarker;
}

bool write_all(int fd, const uint8_t* p, size_t n) {
  while (n > 0) {
    const ssize_t w = ::write(fd, p, n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return false;
    p += w;
    n -= static_cast<size_t>(w);
  }
  return true;
}

// Reads exactly n bytes; false on error or end of file.
bool read_all(int fd, uint8_t* p, size_t n) {
  while (n > 0) {
    const ssize_t r = ::read(fd, p, n);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return false;
    p += r;
    n -= static_cast<size_t>(r);
  }
  return true;
}

struct Fd {
  int fd = -1;
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
};

}  // namespace

std::string DiskStore::file_name(const Hash256& block_hash) {
  return to_hex(block_hash) + std::string(kSuffix);
}

DiskStore::DiskStore(std::filesystem::path dir, TierIdentity identity, uint64_t max_bytes)
    : dir_(std::move(dir)), identity_(identity), max_bytes_(max_bytes) {
  std::error_code ec;
  fs::create_directories(dir_, ec);
  if (!fs::is_directory(dir_, ec)) {
    fail("--kv-disk {}: not a directory that can be created or used{}", dir_.string(),
         ec ? ": " + ec.message() : "");
  }
  scan();
}

void DiskStore::scan() {
  struct Found {
    Hash256 hash;
    uint64_t bytes;
    fs::file_time_type mtime;
  };
  std::vector<Found> found;
  uint64_t foreign = 0;
  std::error_code ec;
  for (const fs::directory_entry& e : fs::directory_iterator(dir_, ec)) {
    const std::string name = e.path().filename().string();
    std::error_code fec;
    if (!e.is_regular_file(fec) || e.is_symlink(fec)) continue;
    if (is_temp_name(name)) {
      fs::remove(e.path(), fec);  // an interrupted write of ours: never renamed, never used
      continue;
    }
    if (name.size() != 64 + kSuffix.size() || !name.ends_with(kSuffix)) continue;
    const auto hash = parse_hex64(std::string_view(name).substr(0, 64));
    if (!hash) continue;
    Fd f{::open(e.path().c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW)};
    std::array<uint8_t, kTierHeaderBytes> head{};
    std::string why;
    if (f.fd < 0 || !read_all(f.fd, head.data(), head.size())) {
      ++foreign;
      continue;
    }
    const auto h = decode_tier_header(head, why);
    const KvGeometry& g = identity_.geometry;
    if (!h || h->block_hash != *hash || h->model_fingerprint != identity_.model_fingerprint ||
        h->n_layers != g.n_layers || h->n_kv_heads != g.n_kv_heads || h->head_dim != g.head_dim ||
        h->block_tokens != g.block_tokens || h->k_dtype != g.k_dtype || h->v_dtype != g.v_dtype) {
      ++foreign;
      continue;
    }
    found.push_back({*hash, e.file_size(fec), e.last_write_time(fec)});
  }
  // Oldest first, so the least recently written blocks are the first evicted.
  std::sort(found.begin(), found.end(),
            [](const Found& a, const Found& b) { return a.mtime < b.mtime; });
  MutexLock lock(mu_);
  for (const Found& f : found) {
    Entry& e = entries_[f.hash];
    e.bytes = f.bytes;
    touch_locked(f.hash, e);
    stats_.bytes += f.bytes;
  }
  stats_.found_at_open = found.size();
  stats_.foreign_files = foreign;
  // A smaller budget than last time: trim to it.
  while (stats_.bytes > max_bytes_ && !by_use_.empty()) {
    remove_locked(by_use_.begin()->second);
    ++stats_.evictions;
  }
}

void DiskStore::touch_locked(const Hash256& block_hash, Entry& e) {
  if (e.last_used != 0) by_use_.erase(e.last_used);
  e.last_used = ++clock_;
  by_use_.emplace(e.last_used, block_hash);
}

uint64_t DiskStore::remove_locked(Hash256 block_hash) {
  auto it = entries_.find(block_hash);
  if (it == entries_.end()) return 0;
  const uint64_t bytes = it->second.bytes;
  by_use_.erase(it->second.last_used);
  entries_.erase(it);
  stats_.bytes -= bytes;
  std::error_code ec;
  fs::remove(dir_ / file_name(block_hash), ec);
  return bytes;
}

bool DiskStore::contains(const Hash256& block_hash) const {
  MutexLock lock(mu_);
  return entries_.count(block_hash) > 0;
}

bool DiskStore::put(const Hash256& ns, const Hash256& block_hash, uint32_t token_count,
                    std::span<const uint8_t> payload) {
  const uint64_t bytes = kTierHeaderBytes + payload.size();
  uint64_t n = 0;
  {
    MutexLock lock(mu_);
    if (entries_.count(block_hash) > 0 || writing_.count(block_hash) > 0) return true;
    if (bytes > max_bytes_) {
      ++stats_.write_errors;
      return false;
    }
    while (stats_.bytes + bytes > max_bytes_ && !by_use_.empty()) {
      remove_locked(by_use_.begin()->second);
      ++stats_.evictions;
    }
    if (stats_.bytes + bytes > max_bytes_) {  // the rest of the budget is being written
      ++stats_.write_errors;
      return false;
    }
    stats_.bytes += bytes;
    writing_.emplace(block_hash, bytes);
    n = ++temp_counter_;
  }
  const std::vector<uint8_t> data =
      encode_tier_block(make_tier_header(identity_, ns, block_hash, token_count), payload);
  const fs::path final_path = dir_ / file_name(block_hash);
  const fs::path temp_path =
      dir_ / fmt::format(".{}{}{}.{}", to_hex(block_hash), kTempMarker, ::getpid(), n);
  bool ok = false;
  {
    Fd f{::open(temp_path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0600)};
    ok = f.fd >= 0 && write_all(f.fd, data.data(), data.size());
    if (f.fd >= 0 && ::close(f.fd) != 0) ok = false;
    f.fd = -1;
  }
  std::error_code ec;
  if (ok) {
    fs::rename(temp_path, final_path, ec);
    ok = !ec;
  }
  if (!ok) fs::remove(temp_path, ec);
  MutexLock lock(mu_);
  writing_.erase(block_hash);
  if (!ok) {
    stats_.bytes -= bytes;
    ++stats_.write_errors;
    return false;
  }
  Entry& e = entries_[block_hash];
  e.bytes = bytes;
  touch_locked(block_hash, e);
  ++stats_.writes;
  stats_.bytes_written += bytes;
  return true;
}

bool DiskStore::get(const Hash256& ns, const Hash256& block_hash, std::span<uint8_t> out) {
  {
    MutexLock lock(mu_);
    auto it = entries_.find(block_hash);
    if (it == entries_.end()) {
      ++stats_.misses;
      return false;
    }
    touch_locked(block_hash, it->second);
  }
  const fs::path path = dir_ / file_name(block_hash);
  Fd f{::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW)};
  std::string why;
  std::array<uint8_t, kTierHeaderBytes> head{};
  const bool io_error = f.fd < 0;
  const int open_errno = io_error ? errno : 0;
  std::optional<TierBlockHeader> h;
  if (!io_error) {
    if (read_all(f.fd, head.data(), head.size())) {
      h = decode_tier_header(head, why);
    } else {
      why = "truncated header";
    }
  }
  if (h) {
    if (h->payload_bytes != out.size()) {
      why = fmt::format("payload of {} bytes, the pool's blocks hold {}", h->payload_bytes,
                        out.size());
    } else if (!read_all(f.fd, out.data(), out.size())) {
      why = "truncated payload";
    } else {
      uint8_t extra = 0;
      if (::read(f.fd, &extra, 1) != 0) {
        why = "bytes after the payload";
      } else {
        why = check_tier_block(*h, identity_, ns, block_hash, out);
      }
    }
  }
  MutexLock lock(mu_);
  if (io_error) {
    // Gone from under us (deleted by hand) or unreadable: forget it.
    remove_locked(block_hash);
    ++(open_errno == ENOENT ? stats_.misses : stats_.read_errors);
    return false;
  }
  if (!h || !why.empty()) {
    remove_locked(block_hash);
    ++stats_.corrupt;
    return false;
  }
  ++stats_.hits;
  stats_.bytes_read += kTierHeaderBytes + out.size();
  return true;
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
  return n;
}

DiskStoreStats DiskStore::stats() const {
  MutexLock lock(mu_);
  DiskStoreStats s = stats_;
  s.blocks = entries_.size();
  return s;
}

}  // namespace kvc::kv
