#include "model/gguf_writer.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>

#include "base/error.h"

namespace kvc::gguf {

namespace {

static_assert(std::endian::native == std::endian::little, "GGUF is written little-endian");

constexpr uint32_t kMagic = 0x46554747;  // "GGUF" little-endian
constexpr uint32_t kVersion = 3;
constexpr uint64_t kDefaultAlignment = 32;
constexpr size_t kMaxTensorName = 63;  // llama.cpp rejects names of GGML_MAX_NAME (64) or more
constexpr size_t kWriteChunk = size_t{64} << 20;  // progress granularity for big tensors
const std::string kAlignmentKey = "general.alignment";

uint64_t align_up(uint64_t n, uint64_t a) {
  return (n + a - 1) / a * a;
}

bool valid_alignment(uint64_t a) {
  return a != 0 && (a & (a - 1)) == 0 && a <= kMaxAlignment;
}

template <typename T>
void put(std::vector<uint8_t>& out, T v) {
  // resize + memcpy rather than insert: GCC 12 at -O3 misreads the insert as an overflow.
  const size_t at = out.size();
  out.resize(at + sizeof(T));
  std::memcpy(out.data() + at, &v, sizeof(T));
}

void put_string(std::vector<uint8_t>& out, const std::string& s) {
  put<uint64_t>(out, s.size());
  out.insert(out.end(), s.begin(), s.end());
}

// Throws unless v holds the variant alternative its type needs, in range, with arrays at most
// kMaxArrayDepth deep; depth counts the arrays enclosing v.
void check_value(const std::string& key, const Value& v, int depth) {
  const auto bad = [&](std::string_view why) {
    fail("gguf writer: key '{}': {} value {}", key, value_type_name(v.type), why);
  };
  const auto* u = std::get_if<uint64_t>(&v.data);
  const auto* i = std::get_if<int64_t>(&v.data);
  const auto* d = std::get_if<double>(&v.data);
  const auto fits_u = [&](uint64_t max) {
    if (u == nullptr) bad("does not hold an unsigned integer");
    if (*u > max) bad(fmt::format("{} is out of range", *u));
  };
  const auto fits_i = [&](int64_t min, int64_t max) {
    if (i == nullptr) bad("does not hold a signed integer");
    if (*i < min || *i > max) bad(fmt::format("{} is out of range", *i));
  };
  switch (v.type) {
    case ValueType::kU8:
      return fits_u(std::numeric_limits<uint8_t>::max());
    case ValueType::kU16:
      return fits_u(std::numeric_limits<uint16_t>::max());
    case ValueType::kU32:
      return fits_u(std::numeric_limits<uint32_t>::max());
    case ValueType::kU64:
      return fits_u(std::numeric_limits<uint64_t>::max());
    case ValueType::kI8:
      return fits_i(std::numeric_limits<int8_t>::min(), std::numeric_limits<int8_t>::max());
    case ValueType::kI16:
      return fits_i(std::numeric_limits<int16_t>::min(), std::numeric_limits<int16_t>::max());
    case ValueType::kI32:
      return fits_i(std::numeric_limits<int32_t>::min(), std::numeric_limits<int32_t>::max());
    case ValueType::kI64:
      return fits_i(std::numeric_limits<int64_t>::min(), std::numeric_limits<int64_t>::max());
    case ValueType::kF32:
    case ValueType::kF64:
      if (d == nullptr) bad("does not hold a floating-point number");
      if (v.type == ValueType::kF32 && std::isfinite(*d) &&
          std::fabs(*d) > std::numeric_limits<float>::max()) {
        bad(fmt::format("{} does not fit a 32-bit float", *d));
      }
      return;
    case ValueType::kBool:
      if (!std::holds_alternative<bool>(v.data)) bad("does not hold a bool");
      return;
    case ValueType::kString:
      if (v.as_string() == nullptr) bad("does not hold a string");
      return;
    case ValueType::kArray: {
      const Value::Array* items = v.as_array();
      if (items == nullptr) bad("does not hold an array");
      if (depth >= kMaxArrayDepth) bad(fmt::format("nests deeper than {}", kMaxArrayDepth));
      if (value_type_name(v.element_type) == "unknown") {
        bad(fmt::format("has unknown element type {}", static_cast<uint32_t>(v.element_type)));
      }
      for (const Value& item : *items) {
        if (item.type != v.element_type) {
          bad(fmt::format("of {} holds an element of type {}", value_type_name(v.element_type),
                          value_type_name(item.type)));
        }
        check_value(key, item, depth + 1);
      }
      return;
    }
  }
  fail("gguf writer: key '{}': unknown value type {}", key, static_cast<uint32_t>(v.type));
}

// Counts metadata memory where the reader does, so that the writer refuses what it would.
void count_memory(MetadataMemory& memory, const std::string& key, uint64_t bytes,
                  uint64_t file_bytes) {
  if (!memory.add(bytes, file_bytes)) {
    fail(
        "gguf writer: key '{}': metadata would take {} bytes of memory to read, over the {} "
        "allowed for {} bytes of file",
        key, memory.total() + bytes, MetadataMemory::limit(file_bytes), file_bytes);
  }
}

// The value's payload (no type tag); v has passed check_value.
void put_value(std::vector<uint8_t>& out, const Value& v, const std::string& key,
               MetadataMemory& memory) {
  switch (v.type) {
    case ValueType::kU8:
      return put(out, static_cast<uint8_t>(std::get<uint64_t>(v.data)));
    case ValueType::kU16:
      return put(out, static_cast<uint16_t>(std::get<uint64_t>(v.data)));
    case ValueType::kU32:
      return put(out, static_cast<uint32_t>(std::get<uint64_t>(v.data)));
    case ValueType::kU64:
      return put(out, std::get<uint64_t>(v.data));
    case ValueType::kI8:
      return put(out, static_cast<int8_t>(std::get<int64_t>(v.data)));
    case ValueType::kI16:
      return put(out, static_cast<int16_t>(std::get<int64_t>(v.data)));
    case ValueType::kI32:
      return put(out, static_cast<int32_t>(std::get<int64_t>(v.data)));
    case ValueType::kI64:
      return put(out, std::get<int64_t>(v.data));
    case ValueType::kF32:
      return put(out, static_cast<float>(std::get<double>(v.data)));
    case ValueType::kF64:
      return put(out, std::get<double>(v.data));
    case ValueType::kBool:
      return put<uint8_t>(out, std::get<bool>(v.data) ? 1 : 0);
    case ValueType::kString: {
      const std::string& text = std::get<std::string>(v.data);
      put_string(out, text);
      return count_memory(memory, key, text.size(), out.size());
    }
    case ValueType::kArray: {
      const auto& items = std::get<Value::Array>(v.data);
      put(out, static_cast<uint32_t>(v.element_type));
      put<uint64_t>(out, items.size());
      count_memory(memory, key, items.size() * sizeof(Value),
                   out.size() + items.size() * min_encoded_size(v.element_type));
      for (const Value& item : items) put_value(out, item, key, memory);
      return;
    }
  }
}

// Owns the temporary file while it is written; removes it unless committed.
class TempFile {
 public:
  explicit TempFile(const std::string& path) : path_(path), tmp_(path + ".tmp") {
    fd_ = ::open(tmp_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd_ < 0) fail("cannot create '{}': {}", tmp_, std::strerror(errno));
  }
  ~TempFile() {
    if (fd_ >= 0) ::close(fd_);
    if (!committed_) ::unlink(tmp_.c_str());
  }
  TempFile(const TempFile&) = delete;
  TempFile& operator=(const TempFile&) = delete;

  void write(const uint8_t* p, size_t n) {
    while (n > 0) {
      const ssize_t w = ::write(fd_, p, n);
      if (w < 0 && errno == EINTR) continue;
      if (w <= 0) fail("cannot write '{}': {}", tmp_, w < 0 ? std::strerror(errno) : "no progress");
      p += w;
      n -= static_cast<size_t>(w);
    }
  }

  void commit() {
    const int fd = fd_;
    fd_ = -1;
    // close() can report a deferred write error (e.g. on NFS), so it is checked.
    if (::close(fd) != 0) fail("cannot write '{}': {}", tmp_, std::strerror(errno));
    if (std::rename(tmp_.c_str(), path_.c_str()) != 0) {
      fail("cannot rename '{}' to '{}': {}", tmp_, path_, std::strerror(errno));
    }
    committed_ = true;
  }

 private:
  std::string path_;
  std::string tmp_;
  int fd_ = -1;
  bool committed_ = false;
};

}  // namespace

Value make_uint(ValueType type, uint64_t v) {
  return Value{type, ValueType::kU8, v};
}
Value make_int(ValueType type, int64_t v) {
  return Value{type, ValueType::kU8, v};
}
Value make_float(ValueType type, double v) {
  return Value{type, ValueType::kU8, v};
}
Value make_bool(bool v) {
  return Value{ValueType::kBool, ValueType::kU8, v};
}
Value make_string(std::string v) {
  return Value{ValueType::kString, ValueType::kU8, std::move(v)};
}
Value make_array(ValueType element_type, Value::Array items) {
  return Value{ValueType::kArray, element_type, std::move(items)};
}

void Writer::set(std::string key, Value value) {
  if (key.empty()) fail("gguf writer: metadata key is empty");
  check_value(key, value, 0);
  if (key == kAlignmentKey) {
    const auto a = value.as_u64();
    if (value.type != ValueType::kU32 || !valid_alignment(*a)) {
      fail("gguf writer: key '{}' must be a u32 power of two up to {}, got {} {}", key,
           kMaxAlignment, value_type_name(value.type), value.describe());
    }
    alignment_ = *a;
  }
  for (auto& [k, v] : metadata_) {
    if (k == key) {
      v = std::move(value);
      return;
    }
  }
  metadata_.emplace_back(std::move(key), std::move(value));
}

void Writer::set_u32(std::string key, uint32_t v) {
  set(std::move(key), make_uint(ValueType::kU32, v));
}
void Writer::set_i32(std::string key, int32_t v) {
  set(std::move(key), make_int(ValueType::kI32, v));
}
void Writer::set_u64(std::string key, uint64_t v) {
  set(std::move(key), make_uint(ValueType::kU64, v));
}
void Writer::set_f32(std::string key, float v) {
  set(std::move(key), make_float(ValueType::kF32, v));
}
void Writer::set_bool(std::string key, bool v) {
  set(std::move(key), make_bool(v));
}
void Writer::set_string(std::string key, std::string v) {
  set(std::move(key), make_string(std::move(v)));
}

void Writer::set_string_array(std::string key, std::vector<std::string> v) {
  Value::Array items;
  items.reserve(v.size());
  for (auto& s : v) items.push_back(make_string(std::move(s)));
  set(std::move(key), make_array(ValueType::kString, std::move(items)));
}

void Writer::set_f32_array(std::string key, std::vector<float> v) {
  Value::Array items;
  items.reserve(v.size());
  for (float f : v) items.push_back(make_float(ValueType::kF32, f));
  set(std::move(key), make_array(ValueType::kF32, std::move(items)));
}

void Writer::set_i32_array(std::string key, std::vector<int32_t> v) {
  Value::Array items;
  items.reserve(v.size());
  for (int32_t i : v) items.push_back(make_int(ValueType::kI32, i));
  set(std::move(key), make_array(ValueType::kI32, std::move(items)));
}

const Value* Writer::find(const std::string& key) const {
  for (const auto& [k, v] : metadata_) {
    if (k == key) return &v;
  }
  return nullptr;
}

void Writer::add_tensor(std::string name, std::vector<uint64_t> dims, DType dtype, Fill fill) {
  if (name.empty() || name.size() > kMaxTensorName) {
    fail("gguf writer: tensor name '{}' must have 1 to {} bytes", name, kMaxTensorName);
  }
  if (std::any_of(tensors_.begin(), tensors_.end(),
                  [&](const Tensor& t) { return t.name == name; })) {
    fail("gguf writer: duplicate tensor '{}'", name);
  }
  if (dims.empty() || dims.size() > kMaxDims) {
    fail("gguf writer: tensor '{}' has {} dimensions (1 to {} allowed)", name, dims.size(),
         kMaxDims);
  }
  uint64_t elements = 1;
  for (size_t d = 0; d < dims.size(); ++d) {
    if (dims[d] == 0 || dims[d] > kMaxDim || elements > kMaxElements / dims[d]) {
      fail("gguf writer: tensor '{}' has an invalid dimension {} = {}", name, d, dims[d]);
    }
    elements *= dims[d];
  }
  if (dims[0] % block_elements(dtype) != 0) {
    fail("gguf writer: tensor '{}' of type {} has a row of {} elements, not a multiple of {}", name,
         dtype_name(dtype), dims[0], block_elements(dtype));
  }
  if (!fill) fail("gguf writer: tensor '{}' has no fill function", name);
  const uint64_t bytes = elements / block_elements(dtype) * block_bytes(dtype);
  tensors_.push_back(Tensor{std::move(name), std::move(dims), dtype, bytes, std::move(fill)});
}

void Writer::set_alignment(uint64_t a) {
  if (!valid_alignment(a)) {
    fail("gguf writer: alignment {} is not a power of two up to {}", a, kMaxAlignment);
  }
  if (a != kDefaultAlignment) {
    set_u32(kAlignmentKey, static_cast<uint32_t>(a));
    return;
  }
  alignment_ = a;
  std::erase_if(metadata_, [](const auto& kv) { return kv.first == kAlignmentKey; });
}

std::vector<uint64_t> Writer::data_layout() const {
  std::vector<uint64_t> layout;
  layout.reserve(tensors_.size() + 1);
  uint64_t at = 0;
  for (const Tensor& t : tensors_) {
    layout.push_back(at);
    // Every tensor, the last included, is padded as llama.cpp does, whose reader expects it.
    at = align_up(at + t.bytes, alignment_);
  }
  layout.push_back(at);
  return layout;
}

std::vector<uint8_t> Writer::encode_header(const std::vector<uint64_t>& layout) const {
  std::vector<uint8_t> out;
  put(out, kMagic);
  put(out, kVersion);
  put<uint64_t>(out, tensors_.size());
  put<uint64_t>(out, metadata_.size());
  MetadataMemory memory;
  for (const auto& [key, value] : metadata_) {
    put_string(out, key);
    count_memory(memory, key, sizeof(Value) + key.size(), out.size());
    put(out, static_cast<uint32_t>(value.type));
    put_value(out, value, key, memory);
  }
  for (size_t i = 0; i < tensors_.size(); ++i) {
    const Tensor& t = tensors_[i];
    put_string(out, t.name);
    put(out, static_cast<uint32_t>(t.dims.size()));
    for (uint64_t d : t.dims) put(out, d);
    put(out, ggml_type_id(t.dtype));
    put(out, layout[i]);
  }
  out.resize(align_up(out.size(), alignment_), 0);
  return out;
}

uint64_t Writer::file_size() const {
  const auto layout = data_layout();
  return encode_header(layout).size() + layout.back();
}

void Writer::write(const std::string& path,
                   const std::function<void(uint64_t, uint64_t)>& progress) const {
  const auto layout = data_layout();
  const std::vector<uint8_t> header = encode_header(layout);
  const uint64_t total = header.size() + layout.back();
  const auto report = [&](uint64_t done) {
    if (progress) progress(done, total);
  };

  TempFile file(path);
  file.write(header.data(), header.size());
  uint64_t done = header.size();
  report(done);

  const std::vector<uint8_t> zeros(alignment_, 0);
  std::vector<uint8_t> buffer;  // reused: grows to the largest tensor, never beyond
  for (size_t i = 0; i < tensors_.size(); ++i) {
    const Tensor& t = tensors_[i];
    buffer.assign(t.bytes, 0);
    t.fill(buffer.data(), buffer.size());
    for (size_t at = 0; at < buffer.size(); at += kWriteChunk) {
      const size_t n = std::min(kWriteChunk, buffer.size() - at);
      file.write(buffer.data() + at, n);
      done += n;
      if (at + n < buffer.size()) report(done);
    }
    const uint64_t pad = layout[i + 1] - layout[i] - t.bytes;
    file.write(zeros.data(), pad);
    done += pad;
    report(done);
  }
  file.commit();
}

std::vector<uint8_t> Writer::to_bytes() const {
  const auto layout = data_layout();
  std::vector<uint8_t> out = encode_header(layout);
  const uint64_t data_offset = out.size();
  out.resize(data_offset + layout.back(), 0);
  for (size_t i = 0; i < tensors_.size(); ++i) {
    tensors_[i].fill(out.data() + data_offset + layout[i], tensors_[i].bytes);
  }
  return out;
}

}  // namespace kvc::gguf
