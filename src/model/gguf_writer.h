// Writes GGUF v3 files: metadata, tensor infos, alignment padding and tensor data.
//
// The writer validates everything it is given against the limits of gguf.h, so whatever it
// writes, File::parse reads back unchanged: file_size(), write() and to_bytes() throw Error
// naming the key when metadata would take more memory to read than MetadataMemory allows. Tensor
// data is produced on demand by a callback and streamed to disk one tensor at a time; at most the
// largest tensor is held in memory.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "base/dtype.h"
#include "model/gguf.h"

namespace kvc::gguf {

// Builders for metadata values; Writer::set checks that the value fits its type.
Value make_uint(ValueType type, uint64_t v);  // type is kU8, kU16, kU32 or kU64
Value make_int(ValueType type, int64_t v);    // type is kI8, kI16, kI32 or kI64
Value make_float(ValueType type, double v);   // type is kF32 or kF64
Value make_bool(bool v);
Value make_string(std::string v);
Value make_array(ValueType element_type, Value::Array items);

class Writer {
 public:
  // Writes exactly `bytes` bytes of tensor data into dst (dst starts zeroed).
  using Fill = std::function<void(uint8_t* dst, size_t bytes)>;

  // Sets key to value, replacing an existing key in place; throws Error naming the key when the
  // key is empty or the value is malformed (wrong variant, out of range, nested too deep).
  // Setting "general.alignment" (a power-of-two u32) also sets the data alignment.
  void set(std::string key, Value value);
  // Typed shorthands for set().
  void set_u32(std::string key, uint32_t v);
  void set_i32(std::string key, int32_t v);
  void set_u64(std::string key, uint64_t v);
  void set_f32(std::string key, float v);
  void set_bool(std::string key, bool v);
  void set_string(std::string key, std::string v);
  void set_string_array(std::string key, std::vector<std::string> v);
  void set_f32_array(std::string key, std::vector<float> v);
  void set_i32_array(std::string key, std::vector<int32_t> v);
  // nullptr when the key is not set.
  const Value* find(const std::string& key) const;
  const std::vector<std::pair<std::string, Value>>& metadata() const { return metadata_; }

  // Appends a tensor whose bytes fill() produces at write time: row_bytes(dtype, dims[0]) times
  // the other dims. dims are in ggml order (dims[0] contiguous). Throws Error naming the tensor
  // on a duplicate or empty name, a name over 63 bytes (llama.cpp's limit), 0 or more than 4
  // dims, a zero or oversized dimension, or a row that is not a whole number of blocks.
  void add_tensor(std::string name, std::vector<uint64_t> dims, DType dtype, Fill fill);
  size_t tensor_count() const { return tensors_.size(); }

  // Data alignment (default 32); a must be a power of two up to 1 MiB. Records
  // general.alignment when a != 32 and removes it when a == 32.
  void set_alignment(uint64_t a);
  uint64_t alignment() const { return alignment_; }

  // Size in bytes of the file write() produces.
  uint64_t file_size() const;

  // Writes the file to path + ".tmp" and renames it over path (no fsync), so path never holds a
  // partial file. progress(done_bytes, total_bytes) is called after the header and as tensor data
  // is written (at least once per tensor; the last call has done == total). Throws Error naming
  // the path on I/O failure; an exception from a fill callback propagates. Either way the
  // temporary file is removed.
  void write(const std::string& path,
             const std::function<void(uint64_t, uint64_t)>& progress = {}) const;
  // The same file image in memory (for tests and small files).
  std::vector<uint8_t> to_bytes() const;

 private:
  struct Tensor {
    std::string name;
    std::vector<uint64_t> dims;
    DType dtype;
    uint64_t bytes;
    Fill fill;
  };
  // Each tensor's offset in the data section and, last, the data section's padded size.
  std::vector<uint64_t> data_layout() const;
  // Header, metadata, tensor infos and the padding up to the data section.
  std::vector<uint8_t> encode_header(const std::vector<uint64_t>& layout) const;

  std::vector<std::pair<std::string, Value>> metadata_;
  std::vector<Tensor> tensors_;
  uint64_t alignment_ = 32;
};

}  // namespace kvc::gguf
