#include "model/gguf.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <limits>
#include <new>
#include <numeric>

#include "base/error.h"

namespace kvc::gguf {

namespace {

constexpr uint32_t kMagic = 0x46554747;  // "GGUF" little-endian
constexpr uint64_t kMaxNameBytes = 1 << 16;
// Capacity reserved from a count the file gives, before its items are read: vectors grow with
// what is actually read beyond it.
constexpr uint64_t kMaxReserve = 1 << 16;

bool valid_type(uint32_t t) {
  return t <= static_cast<uint32_t>(ValueType::kF64);
}

class Cursor {
 public:
  Cursor(std::span<const uint8_t> bytes, const std::string& label) : bytes_(bytes), label_(label) {}

  uint64_t offset() const { return pos_; }
  uint64_t remaining() const { return bytes_.size() - pos_; }

  template <typename T>
  T read(std::string_view what) {
    need(sizeof(T), what);
    T v;
    std::memcpy(&v, bytes_.data() + pos_, sizeof(T));
    pos_ += sizeof(T);
    return v;
  }

  std::string read_string(std::string_view what) {
    const uint64_t at = pos_;
    const auto n = read<uint64_t>(what);
    if (n > remaining()) {
      fail("{}: {} at offset {} has length {} but only {} bytes remain (truncated or corrupt)",
           label_, what, at, n, remaining());
    }
    std::string s(reinterpret_cast<const char*>(bytes_.data() + pos_), n);
    pos_ += n;
    return s;
  }

  void need(uint64_t n, std::string_view what) const {
    if (n > remaining()) {
      fail("{}: truncated at offset {}: {} needs {} bytes, {} remain", label_, pos_, what, n,
           remaining());
    }
  }

 private:
  std::span<const uint8_t> bytes_;
  const std::string& label_;
  uint64_t pos_ = 0;
};

// Counts bytes of metadata memory once the cursor has read up to file_bytes; throws naming what
// when the file would make the reader take more than MetadataMemory allows.
void count_memory(MetadataMemory& memory, uint64_t bytes, uint64_t file_bytes,
                  const std::string& what, const std::string& label, uint64_t at) {
  if (!memory.add(bytes, file_bytes)) {
    fail(
        "{}: {}: the value at offset {} would take metadata to {} bytes of memory, over the {} "
        "allowed for {} bytes of file (corrupt, or too large for kvcache)",
        label, what, at, memory.total() + bytes, MetadataMemory::limit(file_bytes), file_bytes);
  }
}

Value read_value(Cursor& in, ValueType type, const std::string& what, const std::string& label,
                 int depth, MetadataMemory& memory) {
  Value v;
  v.type = type;
  switch (type) {
    case ValueType::kU8:
      v.data = uint64_t{in.read<uint8_t>(what)};
      break;
    case ValueType::kI8:
      v.data = int64_t{in.read<int8_t>(what)};
      break;
    case ValueType::kU16:
      v.data = uint64_t{in.read<uint16_t>(what)};
      break;
    case ValueType::kI16:
      v.data = int64_t{in.read<int16_t>(what)};
      break;
    case ValueType::kU32:
      v.data = uint64_t{in.read<uint32_t>(what)};
      break;
    case ValueType::kI32:
      v.data = int64_t{in.read<int32_t>(what)};
      break;
    case ValueType::kU64:
      v.data = in.read<uint64_t>(what);
      break;
    case ValueType::kI64:
      v.data = in.read<int64_t>(what);
      break;
    case ValueType::kF32:
      v.data = double{in.read<float>(what)};
      break;
    case ValueType::kF64:
      v.data = in.read<double>(what);
      break;
    case ValueType::kBool: {
      const uint64_t at = in.offset();
      const auto b = in.read<uint8_t>(what);
      if (b > 1) fail("{}: {}: bool at offset {} has value {}", label, what, at, b);
      v.data = b == 1;
      break;
    }
    case ValueType::kString: {
      const uint64_t at = in.offset();
      std::string text = in.read_string(what);
      count_memory(memory, text.size(), in.offset(), what, label, at);
      v.data = std::move(text);
      break;
    }
    case ValueType::kArray: {
      if (depth >= kMaxArrayDepth) {
        fail("{}: {}: arrays nested deeper than {} at offset {}", label, what, kMaxArrayDepth,
             in.offset());
      }
      const uint64_t at = in.offset();
      const auto element = in.read<uint32_t>(what);
      if (!valid_type(element)) {
        fail("{}: {}: unknown array element type {} at offset {}", label, what, element, at);
      }
      v.element_type = static_cast<ValueType>(element);
      const auto count = in.read<uint64_t>(what);
      if (count > in.remaining() / min_encoded_size(v.element_type)) {
        fail("{}: {}: array at offset {} claims {} elements, more than the {} bytes left", label,
             what, at, count, in.remaining());
      }
      // count <= remaining bytes, so neither product overflows.
      count_memory(memory, count * sizeof(Value),
                   in.offset() + count * min_encoded_size(v.element_type), what, label, at);
      Value::Array items;
      items.reserve(std::min(count, kMaxReserve));
      for (uint64_t i = 0; i < count; ++i) {
        items.push_back(read_value(in, v.element_type, what, label, depth + 1, memory));
      }
      v.data = std::move(items);
      break;
    }
  }
  return v;
}

}  // namespace

uint64_t MetadataMemory::limit(uint64_t file_bytes) {
  const uint64_t most_bytes = (kMaxMetadataMemory - kMetadataMemorySlack) / kMetadataMemoryPerByte;
  return file_bytes >= most_bytes ? kMaxMetadataMemory
                                  : kMetadataMemorySlack + kMetadataMemoryPerByte * file_bytes;
}

bool MetadataMemory::add(uint64_t bytes, uint64_t file_bytes) {
  const uint64_t allowed = limit(file_bytes);
  if (total_ > allowed || bytes > allowed - total_) return false;
  total_ += bytes;
  return true;
}

uint64_t min_encoded_size(ValueType t) {
  switch (t) {
    case ValueType::kU8:
    case ValueType::kI8:
    case ValueType::kBool:
      return 1;
    case ValueType::kU16:
    case ValueType::kI16:
      return 2;
    case ValueType::kU32:
    case ValueType::kI32:
    case ValueType::kF32:
      return 4;
    case ValueType::kU64:
    case ValueType::kI64:
    case ValueType::kF64:
    case ValueType::kString:
      return 8;
    case ValueType::kArray:
      return 12;
  }
  return 1;
}

std::string_view value_type_name(ValueType t) {
  static constexpr std::string_view names[] = {"u8",  "i8",  "u16",  "i16",    "u32",
                                               "i32", "f32", "bool", "string", "array",
                                               "u64", "i64", "f64"};
  const auto i = static_cast<uint32_t>(t);
  return i < std::size(names) ? names[i] : "unknown";
}

bool Value::is_integer() const {
  return std::holds_alternative<uint64_t>(data) || std::holds_alternative<int64_t>(data);
}

std::optional<uint64_t> Value::as_u64() const {
  if (const auto* u = std::get_if<uint64_t>(&data)) return *u;
  if (const auto* i = std::get_if<int64_t>(&data); i && *i >= 0) return static_cast<uint64_t>(*i);
  return std::nullopt;
}

std::optional<int64_t> Value::as_i64() const {
  if (const auto* i = std::get_if<int64_t>(&data)) return *i;
  if (const auto* u = std::get_if<uint64_t>(&data);
      u && *u <= static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
    return static_cast<int64_t>(*u);
  }
  return std::nullopt;
}

std::optional<double> Value::as_f64() const {
  if (const auto* d = std::get_if<double>(&data)) return *d;
  if (const auto* u = std::get_if<uint64_t>(&data)) return static_cast<double>(*u);
  if (const auto* i = std::get_if<int64_t>(&data)) return static_cast<double>(*i);
  return std::nullopt;
}

std::string Value::describe() const {
  if (const auto* u = std::get_if<uint64_t>(&data)) return std::to_string(*u);
  if (const auto* i = std::get_if<int64_t>(&data)) return std::to_string(*i);
  if (const auto* d = std::get_if<double>(&data)) return fmt::format("{:g}", *d);
  if (const auto* b = std::get_if<bool>(&data)) return *b ? "true" : "false";
  if (const auto* s = std::get_if<std::string>(&data)) {
    if (s->size() > 60) return fmt::format("\"{}...\" ({} bytes)", s->substr(0, 57), s->size());
    return fmt::format("\"{}\"", *s);
  }
  const auto& items = std::get<Array>(data);
  return fmt::format("[{} x {}]", items.size(), value_type_name(element_type));
}

uint64_t TensorInfo::elements() const {
  uint64_t n = 1;
  for (uint64_t d : dims) n *= d;
  return n;
}

std::unique_ptr<File> File::open(const std::string& path, Residency residency) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) fail("cannot open model file '{}': {}", path, std::strerror(errno));
  // Closes fd on every way out, the errors included (a mapping outlives its descriptor).
  struct Closer {
    int fd;
    ~Closer() { ::close(fd); }
  } closer{fd};
  struct stat st {};
  if (fstat(fd, &st) != 0) fail("cannot stat '{}': {}", path, std::strerror(errno));
  if (!S_ISREG(st.st_mode)) fail("'{}' is not a regular file", path);
  std::unique_ptr<File> file(new File());
  file->label_ = path;
  const auto size = static_cast<size_t>(st.st_size);
  if (size > 0 && residency == Residency::kMapped) {
    void* p = mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
    if (p == MAP_FAILED) fail("cannot map '{}': {}", path, std::strerror(errno));
    file->mapping_ = p;
    file->mapping_size_ = size;
    file->bytes_ = {static_cast<const uint8_t*>(p), size};
  } else if (size > 0) {
    try {
      file->loaded_ = HugePageMemory(size);
    } catch (const std::bad_alloc&) {
      fail("cannot allocate {} bytes to load '{}' (--mmap maps it instead)", size, path);
    }
    for (size_t done = 0; done < size;) {
      const ssize_t n =
          pread(fd, file->loaded_.data() + done, size - done, static_cast<off_t>(done));
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) fail("cannot read '{}' at byte {}: {}", path, done, std::strerror(errno));
      if (n == 0)
        fail("'{}' ended at byte {} while being read ({} bytes expected)", path, done, size);
      done += static_cast<size_t>(n);
    }
    file->bytes_ = {file->loaded_.data(), size};
  }
  file->parse_all();
  return file;
}

std::unique_ptr<File> File::parse(std::span<const uint8_t> bytes, std::string label) {
  std::unique_ptr<File> file(new File());
  file->label_ = std::move(label);
  file->bytes_ = bytes;
  file->parse_all();
  return file;
}

File::~File() {
  if (mapping_ != nullptr) munmap(mapping_, mapping_size_);
}

void File::parse_all() {
  Cursor in(bytes_, label_);
  if (bytes_.size() < 4) fail("{}: not a GGUF file: only {} bytes", label_, bytes_.size());
  const auto magic = in.read<uint32_t>("magic");
  if (magic != kMagic) {
    fail("{}: not a GGUF file: bad magic 0x{:08x} at offset 0 (expected 'GGUF')", label_, magic);
  }
  version_ = in.read<uint32_t>("version");
  if (version_ != 2 && version_ != 3) {
    fail("{}: unsupported GGUF version {} at offset 4 (kvcache reads versions 2 and 3)", label_,
         version_);
  }
  const auto n_tensors = in.read<uint64_t>("tensor count");
  const auto n_kv = in.read<uint64_t>("metadata count");
  // Each metadata pair takes at least 13 bytes and each tensor info at least 28.
  if (n_kv > in.remaining() / 13) {
    fail("{}: metadata count {} at offset 16 is larger than the file allows", label_, n_kv);
  }
  if (n_tensors > in.remaining() / 28) {
    fail("{}: tensor count {} at offset 8 is larger than the file allows", label_, n_tensors);
  }

  metadata_.reserve(std::min(n_kv, kMaxReserve));
  MetadataMemory memory;
  for (uint64_t i = 0; i < n_kv; ++i) {
    const uint64_t at = in.offset();
    std::string key = in.read_string("metadata key");
    if (key.empty()) fail("{}: metadata pair {} at offset {} has an empty key", label_, i, at);
    const uint64_t type_at = in.offset();
    // Messages about the value name its key.
    const std::string what = fmt::format("key '{}'", key);
    count_memory(memory, sizeof(Value) + key.size(), type_at, what, label_, at);
    const auto type = in.read<uint32_t>(what);
    if (!valid_type(type)) {
      fail("{}: key '{}': unknown value type {} at offset {}", label_, key, type, type_at);
    }
    Value value;
    try {
      value = read_value(in, static_cast<ValueType>(type), what, label_, 0, memory);
    } catch (const std::bad_alloc&) {
      fail("{}: key '{}': out of memory reading its value at offset {}", label_, key, type_at);
    }
    if (metadata_index_.count(key) != 0) {
      fail("{}: duplicate metadata key '{}' at offset {}", label_, key, at);
    }
    metadata_index_.emplace(key, metadata_.size());
    metadata_.emplace_back(std::move(key), std::move(value));
  }

  if (const Value* a = find("general.alignment")) {
    const auto align = a->as_u64();
    if (!align || *align == 0 || (*align & (*align - 1)) != 0 || *align > kMaxAlignment) {
      fail("{}: key 'general.alignment' must be a power of two up to 1 MiB, got {}", label_,
           a->describe());
    }
    alignment_ = *align;
  }

  tensors_.reserve(std::min(n_tensors, kMaxReserve));
  for (uint64_t i = 0; i < n_tensors; ++i) {
    const uint64_t at = in.offset();
    TensorInfo t;
    t.name = in.read_string("tensor name");
    if (t.name.size() > kMaxNameBytes) {
      fail("{}: tensor {} at offset {} has a {}-byte name", label_, i, at, t.name.size());
    }
    const std::string what = fmt::format("tensor '{}'", t.name);
    const auto n_dims = in.read<uint32_t>(what);
    if (n_dims == 0 || n_dims > kMaxDims) {
      fail("{}: tensor '{}' at offset {} has {} dimensions (1 to {} allowed)", label_, t.name, at,
           n_dims, kMaxDims);
    }
    uint64_t elements = 1;
    for (uint32_t d = 0; d < n_dims; ++d) {
      const auto dim = in.read<uint64_t>(what);
      if (dim == 0 || dim > kMaxDim || elements > kMaxElements / dim) {
        fail("{}: tensor '{}' has an invalid dimension {} = {}", label_, t.name, d, dim);
      }
      elements *= dim;
      t.dims.push_back(dim);
    }
    t.ggml_type = in.read<uint32_t>(what);
    t.offset = in.read<uint64_t>(what);
    const auto dtype = dtype_from_ggml(t.ggml_type);
    if (!dtype) {
      fail(
          "{}: tensor '{}' has type {} ({}), which kvcache does not support (f32, f16, bf16, "
          "q8_0, q4_0, q4_1, q5_0, q5_1, q2_K, q3_K, q4_K, q5_K, q6_K, iq4_nl)",
          label_, t.name, ggml_type_name(t.ggml_type), t.ggml_type);
    }
    t.dtype = *dtype;
    if (t.dims[0] % block_elements(t.dtype) != 0) {
      fail("{}: tensor '{}' of type {} has a row of {} elements, not a multiple of {}", label_,
           t.name, dtype_name(t.dtype), t.dims[0], block_elements(t.dtype));
    }
    t.bytes = elements / block_elements(t.dtype) * block_bytes(t.dtype);
    if (t.offset % alignment_ != 0) {
      fail("{}: tensor '{}' data offset {} is not aligned to {}", label_, t.name, t.offset,
           alignment_);
    }
    if (tensor_index_.count(t.name) != 0) fail("{}: duplicate tensor '{}'", label_, t.name);
    tensor_index_.emplace(t.name, tensors_.size());
    tensors_.push_back(std::move(t));
  }

  data_offset_ = (in.offset() + alignment_ - 1) / alignment_ * alignment_;
  for (auto& t : tensors_) {
    const uint64_t begin = data_offset_ + t.offset;
    if (t.offset > bytes_.size() || begin > bytes_.size() || t.bytes > bytes_.size() - begin) {
      fail("{}: tensor '{}' data [{}, {}) lies beyond the end of the file ({} bytes): truncated?",
           label_, t.name, begin, begin + t.bytes, bytes_.size());
    }
    t.data = bytes_.data() + begin;
  }
  // No byte of data belongs to two tensors (llama.cpp even wants them in order, back to back).
  std::vector<size_t> by_offset(tensors_.size());
  std::iota(by_offset.begin(), by_offset.end(), size_t{0});
  std::sort(by_offset.begin(), by_offset.end(),
            [&](size_t a, size_t b) { return tensors_[a].offset < tensors_[b].offset; });
  for (size_t i = 1; i < by_offset.size(); ++i) {
    const TensorInfo& before = tensors_[by_offset[i - 1]];
    const TensorInfo& t = tensors_[by_offset[i]];
    if (t.offset < before.offset + before.bytes) {
      fail("{}: tensor '{}' data [{}, {}) overlaps tensor '{}' data [{}, {}) (corrupt file)",
           label_, t.name, data_offset_ + t.offset, data_offset_ + t.offset + t.bytes, before.name,
           data_offset_ + before.offset, data_offset_ + before.offset + before.bytes);
    }
  }
}

const Value* File::find(std::string_view key) const {
  auto it = metadata_index_.find(key);
  return it == metadata_index_.end() ? nullptr : &metadata_[it->second].second;
}

const TensorInfo* File::find_tensor(std::string_view name) const {
  auto it = tensor_index_.find(name);
  return it == tensor_index_.end() ? nullptr : &tensors_[it->second];
}

const TensorInfo& File::tensor(std::string_view name) const {
  const TensorInfo* t = find_tensor(name);
  if (t == nullptr) fail("{}: required tensor '{}' is missing", label_, name);
  return *t;
}

namespace {
const Value& require(const File& f, std::string_view key) {
  const Value* v = f.find(key);
  if (v == nullptr) fail("{}: required metadata key '{}' is missing", f.label(), key);
  return *v;
}

[[noreturn]] void wrong_type(const File& f, std::string_view key, const Value& v,
                             std::string_view wanted) {
  fail("{}: metadata key '{}' has type {} (value {}), expected {}", f.label(), key,
       value_type_name(v.type), v.describe(), wanted);
}
}  // namespace

uint64_t File::get_u64(std::string_view key) const {
  const Value& v = require(*this, key);
  auto u = v.as_u64();
  if (!u) wrong_type(*this, key, v, "a non-negative integer");
  return *u;
}

double File::get_f64(std::string_view key) const {
  const Value& v = require(*this, key);
  auto d = v.as_f64();
  if (!d) wrong_type(*this, key, v, "a number");
  return *d;
}

const std::string& File::get_string(std::string_view key) const {
  const Value& v = require(*this, key);
  const std::string* s = v.as_string();
  if (s == nullptr) wrong_type(*this, key, v, "a string");
  return *s;
}

const Value::Array& File::get_array(std::string_view key) const {
  const Value& v = require(*this, key);
  const Value::Array* a = v.as_array();
  if (a == nullptr) wrong_type(*this, key, v, "an array");
  return *a;
}

uint64_t File::get_u64(std::string_view key, uint64_t fallback) const {
  return find(key) ? get_u64(key) : fallback;
}

double File::get_f64(std::string_view key, double fallback) const {
  return find(key) ? get_f64(key) : fallback;
}

std::string File::get_string(std::string_view key, std::string fallback) const {
  return find(key) ? get_string(key) : fallback;
}

}  // namespace kvc::gguf
