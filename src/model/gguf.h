// GGUF (v2 and v3) model files: metadata values, tensor infos and memory-mapped tensor data.
//
// Every read is bounds-checked: a corrupt, truncated or unsupported file raises kvc::Error
// naming the byte offset, key or tensor at fault, never reads outside the mapping, and makes
// the reader allocate only in proportion to the file's size (MetadataMemory). Tensors whose
// data overlap are refused.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "base/dtype.h"
#include "base/huge_page_memory.h"

namespace kvc::gguf {

// Limits the reader enforces and the writer respects, so that whatever Writer accepts reads back.
inline constexpr int kMaxArrayDepth = 8;                     // arrays nested inside arrays
inline constexpr uint32_t kMaxDims = 4;                      // tensor dimensions
inline constexpr uint64_t kMaxDim = uint64_t{1} << 40;       // elements along one dimension
inline constexpr uint64_t kMaxElements = uint64_t{1} << 48;  // elements of one tensor
inline constexpr uint64_t kMaxAlignment = uint64_t{1} << 20;
// Memory parsed metadata may take, counted as sizeof(Value) per metadata pair and per array
// element plus the bytes of keys and strings: at most kMaxMetadataMemory in all, and at most
// kMetadataMemorySlack plus kMetadataMemoryPerByte times the bytes of the file read so far (an
// array's elements count when its count is read, against the least bytes they can take), so
// that a file makes the reader allocate in proportion to its size (a one-byte element takes a
// 48-byte Value).
inline constexpr uint64_t kMaxMetadataMemory = uint64_t{1} << 30;
inline constexpr uint64_t kMetadataMemorySlack = uint64_t{16} << 20;
inline constexpr uint64_t kMetadataMemoryPerByte = 16;

enum class ValueType : uint32_t {
  kU8 = 0,
  kI8 = 1,
  kU16 = 2,
  kI16 = 3,
  kU32 = 4,
  kI32 = 5,
  kF32 = 6,
  kBool = 7,
  kString = 8,
  kArray = 9,
  kU64 = 10,
  kI64 = 11,
  kF64 = 12,
};

std::string_view value_type_name(ValueType t);

// One metadata value. Integers keep their sign in the variant; arrays may nest.
struct Value {
  using Array = std::vector<Value>;
  ValueType type = ValueType::kU8;
  ValueType element_type = ValueType::kU8;  // meaningful for arrays only
  std::variant<uint64_t, int64_t, double, bool, std::string, Array> data;

  bool is_integer() const;
  bool is_number() const {
    return is_integer() || type == ValueType::kF32 || type == ValueType::kF64;
  }
  // The value as the requested kind; nullopt when the type does not fit or the value is out of
  // range for it.
  std::optional<uint64_t> as_u64() const;
  std::optional<int64_t> as_i64() const;
  std::optional<double> as_f64() const;
  const std::string* as_string() const { return std::get_if<std::string>(&data); }
  const Array* as_array() const { return std::get_if<Array>(&data); }
  // A short human rendering (arrays are summarised) for `kvcache inspect`.
  std::string describe() const;

  // Same type, element type and value (recursively for arrays).
  bool operator==(const Value&) const = default;
};

// Smallest encoded size of one value of type t: a count the file gives is checked against the
// bytes left with it before anything is allocated.
uint64_t min_encoded_size(ValueType t);

// Counts metadata memory as the limits above define it; the reader and the writer count alike,
// so that whatever the writer writes reads back.
class MetadataMemory {
 public:
  // The most memory metadata may take once file_bytes bytes of the file are read.
  static uint64_t limit(uint64_t file_bytes);
  // Adds bytes, counted when file_bytes bytes of the file are read; false (adding nothing) when
  // the total would exceed limit(file_bytes).
  bool add(uint64_t bytes, uint64_t file_bytes);
  uint64_t total() const { return total_; }

 private:
  uint64_t total_ = 0;
};

struct TensorInfo {
  std::string name;
  std::vector<uint64_t> dims;  // ggml order: dims[0] is the contiguous (row) dimension
  uint32_t ggml_type = 0;
  DType dtype = DType::F32;
  uint64_t offset = 0;  // relative to the start of the tensor data section
  uint64_t bytes = 0;
  const uint8_t* data = nullptr;

  uint64_t elements() const;
};

// How File::open holds a file's bytes.
enum class Residency {
  kMapped,  // mapped from the page cache: opens at once and shares the pages between processes
  kLoaded,  // read into huge-page memory (base/huge_page_memory.h): weights stream faster
};

class File {
 public:
  // Maps or loads (as residency says) and parses path; throws Error on any problem.
  static std::unique_ptr<File> open(const std::string& path,
                                    Residency residency = Residency::kMapped);
  // Parses an in-memory image (the bytes must outlive the File); throws Error on any problem.
  static std::unique_ptr<File> parse(std::span<const uint8_t> bytes, std::string label);
  ~File();
  File(const File&) = delete;
  File& operator=(const File&) = delete;

  uint32_t version() const { return version_; }
  uint64_t alignment() const { return alignment_; }
  uint64_t data_offset() const { return data_offset_; }
  uint64_t file_size() const { return bytes_.size(); }
  const std::string& label() const { return label_; }
  std::span<const uint8_t> bytes() const { return bytes_; }

  const std::vector<std::pair<std::string, Value>>& metadata() const { return metadata_; }
  const std::vector<TensorInfo>& tensors() const { return tensors_; }

  // nullptr when absent.
  const Value* find(std::string_view key) const;
  const TensorInfo* find_tensor(std::string_view name) const;

  // Typed getters: throw Error naming the key when it is missing or has the wrong type.
  uint64_t get_u64(std::string_view key) const;
  double get_f64(std::string_view key) const;
  const std::string& get_string(std::string_view key) const;
  const Value::Array& get_array(std::string_view key) const;
  // Same, with a default for an absent key (a present key of the wrong type still throws).
  uint64_t get_u64(std::string_view key, uint64_t fallback) const;
  double get_f64(std::string_view key, double fallback) const;
  std::string get_string(std::string_view key, std::string fallback) const;

  // The tensor, which must exist; throws Error naming it otherwise.
  const TensorInfo& tensor(std::string_view name) const;

 private:
  File() = default;
  void parse_all();

  std::string label_;
  std::span<const uint8_t> bytes_;
  void* mapping_ = nullptr;
  size_t mapping_size_ = 0;
  HugePageMemory loaded_;
  uint32_t version_ = 0;
  uint64_t alignment_ = 32;
  uint64_t data_offset_ = 0;
  std::vector<std::pair<std::string, Value>> metadata_;
  std::map<std::string, size_t, std::less<>> metadata_index_;
  std::vector<TensorInfo> tensors_;
  std::map<std::string, size_t, std::less<>> tensor_index_;
};

}  // namespace kvc::gguf
