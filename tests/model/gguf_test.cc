#include "model/gguf.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>
#include <random>
#include <stdexcept>

#include "base/error.h"
#include "model/gguf_writer.h"
#include "scratch_dir.h"

namespace kvc::gguf {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
using VT = ValueType;

constexpr uint32_t kMagic = 0x46554747;

// Deterministic, seed-dependent tensor bytes.
void fill_pattern(uint8_t seed, uint8_t* dst, size_t n) {
  for (size_t i = 0; i < n; ++i) dst[i] = static_cast<uint8_t>(i * 131 + seed * 7 + (i >> 8));
}

Writer::Fill pattern(uint8_t seed) {
  return [seed](uint8_t* dst, size_t n) { fill_pattern(seed, dst, n); };
}

std::vector<uint8_t> expected_pattern(uint8_t seed, size_t n) {
  std::vector<uint8_t> v(n);
  fill_pattern(seed, v.data(), n);
  return v;
}

std::vector<uint8_t> read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

// A path in the process's scratch directory, removed (with its .tmp) when the test ends.
class TempPath {
 public:
  explicit TempPath(const std::string& name)
      : path_((kvc::testing::scratch_dir() / ("gguf_test_" + name)).string()) {}
  ~TempPath() {
    std::filesystem::remove(path_);
    std::filesystem::remove(path_ + ".tmp");
  }
  const std::string& str() const { return path_; }

 private:
  std::string path_;
};

// Raw little-endian GGUF bytes, for files the Writer refuses to produce.
struct Bytes {
  std::vector<uint8_t> b;

  template <typename T>
  Bytes& put(T v) {
    const auto* p = reinterpret_cast<const uint8_t*>(&v);
    b.insert(b.end(), p, p + sizeof(T));
    return *this;
  }
  Bytes& u8(uint8_t v) { return put(v); }
  Bytes& u32(uint32_t v) { return put(v); }
  Bytes& u64(uint64_t v) { return put(v); }
  Bytes& str(std::string_view s) {
    u64(s.size());
    b.insert(b.end(), s.begin(), s.end());
    return *this;
  }
  Bytes& header(uint64_t n_tensors, uint64_t n_kv, uint32_t version = 3) {
    return u32(kMagic).u32(version).u64(n_tensors).u64(n_kv);
  }
  // A key and its type tag; the payload follows.
  Bytes& key(std::string_view k, VT t) { return str(k).u32(static_cast<uint32_t>(t)); }
  Bytes& tensor(std::string_view name, const std::vector<uint64_t>& dims, uint32_t type,
                uint64_t offset) {
    str(name).u32(static_cast<uint32_t>(dims.size()));
    for (uint64_t d : dims) u64(d);
    return u32(type).u64(offset);
  }
  Bytes& pad(size_t align = 32) {
    b.resize((b.size() + align - 1) / align * align, 0);
    return *this;
  }
  Bytes& zeros(size_t n) {
    b.resize(b.size() + n, 0);
    return *this;
  }
};

// The message parse() throws for bytes; fails the test when it parses.
std::string parse_error(const std::vector<uint8_t>& bytes) {
  try {
    File::parse(bytes, "bad.gguf");
  } catch (const Error& e) {
    return e.what();
  }
  ADD_FAILURE() << "parsed without error";
  return "";
}

template <typename F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  ADD_FAILURE() << "no error thrown";
  return "";
}

// A file with every value type, every dtype, 1 to 4 dims and a custom alignment.
Writer full_writer() {
  Writer w;
  w.set("t.u8", make_uint(VT::kU8, 255));
  w.set("t.i8", make_int(VT::kI8, -128));
  w.set("t.u16", make_uint(VT::kU16, 65535));
  w.set("t.i16", make_int(VT::kI16, -32768));
  w.set_u32("t.u32", 4000000000u);
  w.set_i32("t.i32", std::numeric_limits<int32_t>::min());
  w.set_u64("t.u64", std::numeric_limits<uint64_t>::max());
  w.set("t.i64", make_int(VT::kI64, std::numeric_limits<int64_t>::min()));
  w.set_f32("t.f32", -1.5f);
  w.set("t.f64", make_float(VT::kF64, 3.141592653589793));
  w.set_bool("t.bool", true);
  w.set_bool("t.bool_false", false);
  w.set_string("t.string", "héllo, wörld");
  w.set_string("t.empty_string", "");
  w.set("t.a_u8", make_array(VT::kU8, {make_uint(VT::kU8, 0), make_uint(VT::kU8, 255)}));
  w.set("t.a_i8", make_array(VT::kI8, {make_int(VT::kI8, -1), make_int(VT::kI8, 127)}));
  w.set("t.a_u16", make_array(VT::kU16, {make_uint(VT::kU16, 7)}));
  w.set("t.a_i16", make_array(VT::kI16, {make_int(VT::kI16, -7), make_int(VT::kI16, 8)}));
  w.set("t.a_u32", make_array(VT::kU32, {make_uint(VT::kU32, 1), make_uint(VT::kU32, 2)}));
  w.set_i32_array("t.a_i32", {-3, 0, 3});
  w.set("t.a_u64", make_array(VT::kU64, {make_uint(VT::kU64, uint64_t{1} << 63)}));
  w.set("t.a_i64", make_array(VT::kI64, {make_int(VT::kI64, -(int64_t{1} << 62))}));
  w.set_f32_array("t.a_f32", {0.5f, -0.25f, 1e-30f});
  w.set("t.a_f64", make_array(VT::kF64, {make_float(VT::kF64, 1e300)}));
  w.set("t.a_bool", make_array(VT::kBool, {make_bool(true), make_bool(false)}));
  w.set_string_array("t.a_string", {"a", "", "ccc"});
  w.set("t.a_empty", make_array(VT::kU32, {}));
  w.set("t.a_nested",
        make_array(VT::kArray, {make_array(VT::kI32, {make_int(VT::kI32, 1)}),
                                make_array(VT::kString, {make_string("x"), make_string("")}),
                                make_array(VT::kF32, {})}));
  // Arrays nested as deep as the reader allows.
  Value deep = make_array(VT::kU8, {make_uint(VT::kU8, 9)});
  for (int i = 1; i < kMaxArrayDepth; ++i) deep = make_array(VT::kArray, {deep});
  w.set("t.a_deep", deep);
  w.set_alignment(64);
  w.add_tensor("f32.1d", {7}, DType::F32, pattern(1));
  w.add_tensor("f16.2d", {3, 5}, DType::F16, pattern(2));
  w.add_tensor("bf16.3d", {2, 3, 4}, DType::BF16, pattern(3));
  w.add_tensor("q8_0.2d", {64, 3}, DType::Q8_0, pattern(4));
  w.add_tensor("q4_0.4d", {32, 1, 2, 3}, DType::Q4_0, pattern(5));
  w.add_tensor("f32.4d", {1, 1, 1, 1}, DType::F32, pattern(6));
  return w;
}

// Checks that f holds exactly what w describes, tensor data at aligned offsets.
void expect_matches(const Writer& w, const File& f, const uint8_t* base) {
  EXPECT_EQ(f.alignment(), w.alignment());
  EXPECT_EQ(f.file_size(), w.file_size());
  EXPECT_EQ(f.data_offset() % f.alignment(), 0u);
  EXPECT_EQ(f.metadata(), w.metadata());
  const std::vector<std::pair<std::string, std::vector<uint64_t>>> shapes = {
      {"f32.1d", {7}},      {"f16.2d", {3, 5}},         {"bf16.3d", {2, 3, 4}},
      {"q8_0.2d", {64, 3}}, {"q4_0.4d", {32, 1, 2, 3}}, {"f32.4d", {1, 1, 1, 1}}};
  const DType dtypes[] = {DType::F32,  DType::F16,  DType::BF16,
                          DType::Q8_0, DType::Q4_0, DType::F32};
  ASSERT_EQ(f.tensors().size(), shapes.size());
  for (size_t i = 0; i < shapes.size(); ++i) {
    SCOPED_TRACE(shapes[i].first);
    const TensorInfo& t = f.tensors()[i];
    EXPECT_EQ(&t, &f.tensor(shapes[i].first));
    EXPECT_EQ(t.dims, shapes[i].second);
    EXPECT_EQ(t.dtype, dtypes[i]);
    EXPECT_EQ(t.ggml_type, ggml_type_id(dtypes[i]));
    EXPECT_EQ(t.bytes, row_bytes(t.dtype, t.dims[0]) * (t.elements() / t.dims[0]));
    EXPECT_EQ(t.offset % f.alignment(), 0u);
    EXPECT_EQ(static_cast<uint64_t>(t.data - base), f.data_offset() + t.offset);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(t.data) % f.alignment(),
              reinterpret_cast<uintptr_t>(base) % f.alignment());
    const auto want = expected_pattern(static_cast<uint8_t>(i + 1), t.bytes);
    EXPECT_EQ(std::memcmp(t.data, want.data(), t.bytes), 0);
  }
  // The last tensor ends on an alignment boundary at the end of the file, as llama.cpp writes it.
  const TensorInfo& last = f.tensors().back();
  EXPECT_EQ(f.file_size(), f.data_offset() + (last.offset + last.bytes + f.alignment() - 1) /
                                                 f.alignment() * f.alignment());
}

TEST(GgufRoundTrip, EveryValueTypeAndDtypeInMemory) {
  const Writer w = full_writer();
  const std::vector<uint8_t> bytes = w.to_bytes();
  const auto f = File::parse(bytes, "mem");
  EXPECT_EQ(f->version(), 3u);
  EXPECT_EQ(f->alignment(), 64u);
  EXPECT_EQ(f->get_u64("general.alignment"), 64u);
  expect_matches(w, *f, bytes.data());
  // Spot checks independent of Writer::metadata().
  EXPECT_EQ(f->get_string("t.empty_string"), "");
  EXPECT_EQ(f->get_f64("t.f32"), -1.5);
  EXPECT_EQ(f->find("t.i64")->as_i64(), std::numeric_limits<int64_t>::min());
  EXPECT_EQ(f->get_array("t.a_empty").size(), 0u);
  EXPECT_EQ(f->find("t.a_empty")->element_type, VT::kU32);
  const auto& nested = f->get_array("t.a_nested");
  ASSERT_EQ(nested.size(), 3u);
  EXPECT_EQ(nested[1].element_type, VT::kString);
  EXPECT_EQ(*nested[1].as_array()->at(0).as_string(), "x");
}

TEST(GgufRoundTrip, WriteToDiskMatchesToBytesAndMapsAligned) {
  const Writer w = full_writer();
  TempPath path("full.gguf");
  std::vector<std::pair<uint64_t, uint64_t>> calls;
  w.write(path.str(), [&](uint64_t done, uint64_t total) { calls.emplace_back(done, total); });
  EXPECT_FALSE(std::filesystem::exists(path.str() + ".tmp"));
  EXPECT_EQ(read_file(path.str()), w.to_bytes());

  ASSERT_GE(calls.size(), w.tensor_count());
  uint64_t last = 0;
  for (const auto& [done, total] : calls) {
    EXPECT_EQ(total, w.file_size());
    EXPECT_GE(done, last);
    last = done;
  }
  EXPECT_EQ(calls.back().first, w.file_size());

  const auto f = File::open(path.str());
  EXPECT_EQ(f->label(), path.str());
  expect_matches(w, *f, f->bytes().data());
  for (const TensorInfo& t : f->tensors()) {
    EXPECT_EQ(reinterpret_cast<uintptr_t>(t.data) % f->alignment(), 0u) << t.name;
  }
}

// A loaded file holds the same bytes and tensors as the mapping, its data on a huge-page
// boundary (so every tensor keeps the file's alignment).
TEST(GgufRoundTrip, LoadedFileReadsAsTheMappedOne) {
  const Writer w = full_writer();
  TempPath path("loaded.gguf");
  w.write(path.str(), nullptr);
  const auto mapped = File::open(path.str(), Residency::kMapped);
  const auto loaded = File::open(path.str(), Residency::kLoaded);
  ASSERT_EQ(loaded->bytes().size(), mapped->bytes().size());
  EXPECT_EQ(std::memcmp(loaded->bytes().data(), mapped->bytes().data(), mapped->bytes().size()), 0);
  EXPECT_NE(loaded->bytes().data(), mapped->bytes().data());
  EXPECT_EQ(reinterpret_cast<uintptr_t>(loaded->bytes().data()) % HugePageMemory::kHugePageBytes,
            0u);
  expect_matches(w, *loaded, loaded->bytes().data());
  EXPECT_EQ(loaded->metadata(), mapped->metadata());
}

TEST(GgufRoundTrip, VersionTwoReadsTheSame) {
  const Writer w = full_writer();
  std::vector<uint8_t> bytes = w.to_bytes();
  bytes[4] = 2;
  const auto f = File::parse(bytes, "v2");
  EXPECT_EQ(f->version(), 2u);
  expect_matches(w, *f, bytes.data());
}

TEST(GgufRoundTrip, EmptyFileHasOnlyAHeader) {
  const Writer w;
  const auto bytes = w.to_bytes();
  EXPECT_EQ(bytes.size(), 32u);  // 24-byte header padded to the default alignment
  const auto f = File::parse(bytes, "empty");
  EXPECT_EQ(f->metadata().size(), 0u);
  EXPECT_EQ(f->tensors().size(), 0u);
  EXPECT_EQ(f->alignment(), 32u);
}

TEST(GgufRoundTrip, LargeTensorIsStreamedInChunks) {
  Writer w;
  const size_t big = (size_t{64} << 20) + 4096;  // just over one write chunk
  w.add_tensor("big", {big / 4}, DType::F32,
               [](uint8_t* dst, size_t n) { std::memset(dst, 7, n); });
  w.add_tensor("small", {32}, DType::Q8_0, pattern(9));
  TempPath path("big.gguf");
  std::vector<uint64_t> done;
  w.write(path.str(), [&](uint64_t d, uint64_t) { done.push_back(d); });
  EXPECT_GE(done.size(), 4u);  // header, two chunks of "big", "small"
  EXPECT_EQ(done.back(), w.file_size());
  const auto f = File::open(path.str());
  const TensorInfo& t = f->tensor("big");
  EXPECT_EQ(t.bytes, big);
  EXPECT_EQ(t.data[0], 7);
  EXPECT_EQ(t.data[big - 1], 7);
  const TensorInfo& s = f->tensor("small");
  EXPECT_EQ(std::memcmp(s.data, expected_pattern(9, 34).data(), 34), 0);
}

TEST(GgufWriter, SetReplacesInPlaceAndKeepsOrder) {
  Writer w;
  w.set_u32("a", 1);
  w.set_string("b", "x");
  w.set_i32("a", -2);
  ASSERT_EQ(w.metadata().size(), 2u);
  EXPECT_EQ(w.metadata()[0].first, "a");
  EXPECT_EQ(w.metadata()[0].second, make_int(VT::kI32, -2));
  EXPECT_EQ(w.metadata()[1].first, "b");
  EXPECT_EQ(w.find("c"), nullptr);
}

TEST(GgufWriter, AlignmentKeyFollowsSetAlignment) {
  Writer w;
  w.set_alignment(128);
  EXPECT_EQ(w.alignment(), 128u);
  ASSERT_NE(w.find("general.alignment"), nullptr);
  EXPECT_EQ(*w.find("general.alignment"), make_uint(VT::kU32, 128));
  w.set_alignment(32);
  EXPECT_EQ(w.find("general.alignment"), nullptr);
  w.set_u32("general.alignment", 256);
  EXPECT_EQ(w.alignment(), 256u);
  EXPECT_EQ(File::parse(w.to_bytes(), "a")->alignment(), 256u);
  for (uint64_t bad : {uint64_t{0}, uint64_t{3}, uint64_t{1} << 21}) {
    EXPECT_THAT(error_of([&] { w.set_alignment(bad); }), HasSubstr(std::to_string(bad)));
  }
  EXPECT_THAT(error_of([&] { w.set_string("general.alignment", "32"); }),
              HasSubstr("'general.alignment'"));
  EXPECT_THAT(error_of([&] { w.set_u64("general.alignment", 64); }),
              HasSubstr("'general.alignment'"));
  EXPECT_EQ(w.alignment(), 256u);
}

TEST(GgufWriter, RejectsMalformedValues) {
  Writer w;
  EXPECT_THAT(error_of([&] { w.set("k", make_uint(VT::kU8, 256)); }),
              AllOf(HasSubstr("'k'"), HasSubstr("256")));
  EXPECT_THAT(error_of([&] { w.set("k", make_int(VT::kI16, 40000)); }), HasSubstr("'k'"));
  EXPECT_THAT(error_of([&] { w.set("k", make_int(VT::kU32, 1)); }), HasSubstr("'k'"));
  EXPECT_THAT(error_of([&] { w.set("k", make_float(VT::kF32, 1e300)); }), HasSubstr("'k'"));
  EXPECT_THAT(error_of([&] {
                w.set("k", make_string("s"));
                w.set("k", Value{VT::kBool, VT::kU8, uint64_t{0}});
              }),
              HasSubstr("'k'"));
  EXPECT_THAT(error_of([&] { w.set("k", make_array(VT::kU8, {make_int(VT::kI8, 1)})); }),
              AllOf(HasSubstr("'k'"), HasSubstr("i8")));
  EXPECT_THAT(error_of([&] { w.set("k", make_array(static_cast<VT>(13), {})); }),
              HasSubstr("unknown element type 13"));
  EXPECT_THAT(error_of([&] {
                w.set("k", Value{static_cast<VT>(99), VT::kU8, uint64_t{0}});
              }),
              HasSubstr("unknown value type 99"));
  Value deep = make_array(VT::kU8, {});
  for (int i = 0; i < kMaxArrayDepth; ++i) deep = make_array(VT::kArray, {deep});
  EXPECT_THAT(error_of([&] { w.set("deep", deep); }),
              AllOf(HasSubstr("'deep'"), HasSubstr("nests deeper")));
  EXPECT_THAT(error_of([&] { w.set_u32("", 1); }), HasSubstr("empty"));
  // Failed sets leave nothing behind except the one valid string.
  ASSERT_EQ(w.metadata().size(), 1u);
  EXPECT_EQ(w.metadata()[0].second, make_string("s"));
}

TEST(GgufWriter, RejectsMalformedTensors) {
  Writer w;
  w.add_tensor("t", {32}, DType::F32, pattern(0));
  const auto add = [&](std::string name, std::vector<uint64_t> dims, DType dtype) {
    return error_of([&] { w.add_tensor(name, dims, dtype, pattern(0)); });
  };
  EXPECT_THAT(add("t", {32}, DType::F32), HasSubstr("duplicate tensor 't'"));
  EXPECT_THAT(add("u", {}, DType::F32), AllOf(HasSubstr("'u'"), HasSubstr("0 dimensions")));
  EXPECT_THAT(add("u", {1, 1, 1, 1, 1}, DType::F32), HasSubstr("5 dimensions"));
  EXPECT_THAT(add("u", {4, 0}, DType::F32), AllOf(HasSubstr("'u'"), HasSubstr("dimension 1")));
  EXPECT_THAT(add("u", {uint64_t{1} << 30, uint64_t{1} << 30}, DType::F32),
              HasSubstr("invalid dimension 1"));
  EXPECT_THAT(add("u", {33}, DType::Q8_0), AllOf(HasSubstr("'u'"), HasSubstr("multiple of 32")));
  EXPECT_THAT(add("", {1}, DType::F32), HasSubstr("name"));
  EXPECT_THAT(add(std::string(64, 'n'), {1}, DType::F32), HasSubstr("63"));
  EXPECT_THAT(error_of([&] { w.add_tensor("v", {1}, DType::F32, nullptr); }), HasSubstr("'v'"));
  EXPECT_EQ(w.tensor_count(), 1u);
}

TEST(GgufWriter, FailedWriteNamesThePathAndLeavesNoFile) {
  Writer w;
  w.add_tensor("t", {32}, DType::F32, pattern(0));
  const std::string missing = (kvc::testing::scratch_dir() / "no/such/dir/x.gguf").string();
  EXPECT_THAT(error_of([&] { w.write(missing); }), HasSubstr(missing));

  // A fill that throws leaves the previous file untouched and removes the temporary.
  TempPath path("keep.gguf");
  Writer ok;
  ok.set_string("v", "old");
  ok.write(path.str());
  const auto before = read_file(path.str());
  Writer failing;
  failing.add_tensor("t", {8}, DType::F32,
                     [](uint8_t*, size_t) { throw std::runtime_error("fill failed"); });
  EXPECT_THROW(failing.write(path.str()), std::runtime_error);
  EXPECT_EQ(read_file(path.str()), before);
  EXPECT_FALSE(std::filesystem::exists(path.str() + ".tmp"));
}

// A small valid file whose last tensor ends exactly at the end of the file, so that every
// proper prefix of it is truncated somewhere that matters.
std::vector<uint8_t> small_file() {
  Writer w;
  w.set_string("general.architecture", "llama");
  w.set_u32("llama.block_count", 2);
  w.set_f32_array("scores", {0.5f, 1.5f});
  w.set("nested", make_array(VT::kArray, {make_array(VT::kBool, {make_bool(true)})}));
  w.set_bool("flag", false);
  w.add_tensor("a", {4, 2}, DType::F16, pattern(1));
  w.add_tensor("b", {32}, DType::Q4_0, pattern(2));
  w.add_tensor("c", {8}, DType::F32, pattern(3));
  return w.to_bytes();
}

TEST(GgufBadFile, TruncationAtEveryByteThrows) {
  const auto bytes = small_file();
  const auto f = File::parse(bytes, "whole");
  const TensorInfo& last = f->tensors().back();
  ASSERT_EQ(bytes.size(), f->data_offset() + last.offset + last.bytes);
  for (size_t n = 0; n < bytes.size(); ++n) {
    // An exact-size copy, so that the sanitizers see any read past the end.
    const std::vector<uint8_t> prefix(bytes.begin(), bytes.begin() + n);
    EXPECT_THAT(parse_error(prefix), HasSubstr("bad.gguf")) << "prefix of " << n << " bytes";
  }
}

TEST(GgufBadFile, EmptyBadMagicAndVersions) {
  EXPECT_THAT(parse_error({}), HasSubstr("not a GGUF file"));
  EXPECT_THAT(parse_error(Bytes().u32(0x46554746).u32(3).u64(0).u64(0).b),
              AllOf(HasSubstr("bad magic"), HasSubstr("offset 0")));
  for (uint32_t v : {1u, 4u}) {
    EXPECT_THAT(parse_error(Bytes().header(0, 0, v).b),
                AllOf(HasSubstr("version " + std::to_string(v)), HasSubstr("offset 4")));
  }
}

TEST(GgufBadFile, HugeCounts) {
  EXPECT_THAT(parse_error(Bytes().header(0, uint64_t{1} << 60).b),
              AllOf(HasSubstr("metadata count"), HasSubstr("offset 16")));
  EXPECT_THAT(parse_error(Bytes().header(uint64_t{1} << 60, 0).b),
              AllOf(HasSubstr("tensor count"), HasSubstr("offset 8")));
  // A key whose length field claims more than the file holds.
  EXPECT_THAT(parse_error(Bytes().header(0, 1).u64(uint64_t{1} << 62).zeros(16).b),
              AllOf(HasSubstr("offset 24"), HasSubstr("length 4611686018427387904")));
  // A string value likewise.
  EXPECT_THAT(parse_error(Bytes().header(0, 1).key("s", VT::kString).u64(~uint64_t{0}).b),
              AllOf(HasSubstr("'s'"), HasSubstr("offset 37")));
  EXPECT_THAT(
      parse_error(
          Bytes().header(0, 1).key("arr", VT::kArray).u32(0).u64(uint64_t{1} << 40).zeros(8).b),
      AllOf(HasSubstr("'arr'"), HasSubstr("1099511627776 elements")));
}

TEST(GgufBadFile, BadValues) {
  EXPECT_THAT(parse_error(Bytes().header(0, 1).str("k").u32(13).u32(0).b),
              AllOf(HasSubstr("'k'"), HasSubstr("unknown value type 13"), HasSubstr("offset 33")));
  EXPECT_THAT(parse_error(Bytes().header(0, 1).key("k", VT::kArray).u32(99).u64(0).b),
              AllOf(HasSubstr("'k'"), HasSubstr("unknown array element type 99")));
  EXPECT_THAT(parse_error(Bytes().header(0, 1).key("k", VT::kBool).u8(2).b),
              AllOf(HasSubstr("'k'"), HasSubstr("bool at offset 37 has value 2")));
  EXPECT_THAT(parse_error(Bytes().header(0, 1).key("k", VT::kArray).u32(7).u64(1).u8(5).b),
              AllOf(HasSubstr("'k'"), HasSubstr("value 5")));
  Bytes deep;
  deep.header(0, 1).key("deep", VT::kArray);
  for (int i = 0; i < kMaxArrayDepth; ++i) deep.u32(static_cast<uint32_t>(VT::kArray)).u64(1);
  deep.u32(0).u64(0);
  EXPECT_THAT(parse_error(deep.b), AllOf(HasSubstr("'deep'"), HasSubstr("nested deeper than 8")));
  EXPECT_THAT(parse_error(Bytes().header(0, 2).key("k", VT::kU8).u8(1).key("k", VT::kU8).u8(2).b),
              AllOf(HasSubstr("duplicate metadata key 'k'"), HasSubstr("offset 38")));
  EXPECT_THAT(parse_error(Bytes().header(0, 1).str("").u32(0).u8(0).b), HasSubstr("empty key"));
}

TEST(GgufBadFile, BadTensorInfos) {
  const auto one = [](const std::vector<uint64_t>& dims, uint32_t type, uint64_t offset) {
    return parse_error(Bytes().header(1, 0).tensor("w", dims, type, offset).pad().zeros(64).b);
  };
  EXPECT_THAT(one({}, 0, 0), AllOf(HasSubstr("'w'"), HasSubstr("0 dimensions")));
  EXPECT_THAT(one({1, 1, 1, 1, 1}, 0, 0), AllOf(HasSubstr("'w'"), HasSubstr("5 dimensions")));
  EXPECT_THAT(one({4, 0}, 0, 0), AllOf(HasSubstr("'w'"), HasSubstr("invalid dimension 1 = 0")));
  EXPECT_THAT(one({uint64_t{1} << 40, uint64_t{1} << 40}, 0, 0),
              AllOf(HasSubstr("'w'"), HasSubstr("invalid dimension 1")));
  EXPECT_THAT(one({~uint64_t{0}}, 0, 0), AllOf(HasSubstr("'w'"), HasSubstr("invalid dimension 0")));
  EXPECT_THAT(one({256}, 23, 0), AllOf(HasSubstr("'w'"), HasSubstr("IQ4_XS")));
  EXPECT_THAT(one({128}, 12, 0), AllOf(HasSubstr("'w'"), HasSubstr("not a multiple of 256")));
  EXPECT_THAT(one({32}, 1000, 0), AllOf(HasSubstr("'w'"), HasSubstr("1000")));
  EXPECT_THAT(one({33}, 8, 0), AllOf(HasSubstr("'w'"), HasSubstr("not a multiple of 32")));
  EXPECT_THAT(one({16}, 2, 0), AllOf(HasSubstr("'w'"), HasSubstr("q4_0")));
  EXPECT_THAT(one({4}, 0, 3), AllOf(HasSubstr("'w'"), HasSubstr("offset 3 is not aligned")));
  EXPECT_THAT(one({17}, 0, 0), AllOf(HasSubstr("'w'"), HasSubstr("beyond the end")));
  EXPECT_THAT(one({4}, 0, 64), AllOf(HasSubstr("'w'"), HasSubstr("beyond the end")));
  EXPECT_THAT(one({4}, 0, uint64_t{1} << 63), HasSubstr("beyond the end"));
  EXPECT_THAT(
      parse_error(
          Bytes().header(2, 0).tensor("w", {4}, 0, 0).tensor("w", {4}, 0, 32).pad().zeros(64).b),
      HasSubstr("duplicate tensor 'w'"));
}

// Each tensor lies inside the file, but two share bytes: refused, naming both. Disjoint data in
// any order is fine.
TEST(GgufBadFile, OverlappingTensorData) {
  const auto two = [](uint64_t a_offset, uint64_t b_offset) {
    return Bytes()
        .header(2, 0)
        .tensor("a", {16}, 0, a_offset)
        .tensor("b", {16}, 0, b_offset)
        .pad()
        .zeros(128)
        .b;
  };
  // Each is 64 bytes of f32.
  EXPECT_THAT(parse_error(two(0, 32)),
              AllOf(HasSubstr("tensor 'b'"), HasSubstr("overlaps tensor 'a'")));
  EXPECT_THAT(parse_error(two(32, 0)),
              AllOf(HasSubstr("tensor 'a'"), HasSubstr("overlaps tensor 'b'")));
  EXPECT_THAT(parse_error(two(64, 64)),
              AllOf(HasSubstr("'a'"), HasSubstr("'b'"), HasSubstr("overlaps")));
  const auto bytes = two(64, 0);
  const auto f = File::parse(bytes, "out-of-order.gguf");
  EXPECT_EQ(f->tensor("b").data + 64, f->tensor("a").data);
}

// A one-byte array element takes a 48-byte Value: what a file can make the reader allocate is
// bounded by its size (MetadataMemory), and the writer refuses what the reader would.
TEST(GgufBadFile, MetadataMemoryIsBoundedByTheFileSize) {
  EXPECT_EQ(MetadataMemory::limit(0), kMetadataMemorySlack);
  EXPECT_EQ(MetadataMemory::limit(1 << 20), kMetadataMemorySlack + (uint64_t{16} << 20));
  EXPECT_EQ(MetadataMemory::limit(uint64_t{1} << 40), kMaxMetadataMemory);
  MetadataMemory memory;
  EXPECT_TRUE(memory.add(kMetadataMemorySlack, 0));
  EXPECT_FALSE(memory.add(1, 0));
  EXPECT_TRUE(memory.add(16, 1));
  EXPECT_FALSE(memory.add(~uint64_t{0}, ~uint64_t{0}));
  EXPECT_EQ(memory.total(), kMetadataMemorySlack + 16);

  const auto u8_array = [](uint64_t n) {
    return Bytes().header(0, 1).key("big", VT::kArray).u32(0).u64(n).zeros(n).b;
  };
  // 8 MiB of u8 would be 384 MiB of Values (the reported case held 20 MB: 968 MB).
  EXPECT_THAT(parse_error(u8_array(uint64_t{8} << 20)),
              AllOf(HasSubstr("key 'big'"), HasSubstr("bytes of memory"), HasSubstr("offset 39")));
  // Past the slack by a little (600,000 Values of 48 bytes against 16 MiB + 16 per byte).
  EXPECT_THAT(parse_error(u8_array(600000)), HasSubstr("key 'big'"));
  const auto fits = u8_array(500000);
  EXPECT_EQ(File::parse(fits, "fits.gguf")->get_array("big").size(), 500000u);

  const auto writer_of = [](size_t n) {
    Writer w;
    w.set("big", make_array(VT::kU8, Value::Array(n, make_uint(VT::kU8, 7))));
    return w;
  };
  EXPECT_THAT(error_of([&] { writer_of(600000).to_bytes(); }),
              AllOf(HasSubstr("key 'big'"), HasSubstr("bytes of memory")));
  const auto written = writer_of(500000).to_bytes();
  EXPECT_EQ(File::parse(written, "written.gguf")->get_array("big").size(), 500000u);
}

TEST(GgufBadFile, BadAlignment) {
  const auto with = [](Bytes value) {
    Bytes b;
    b.header(0, 1).str("general.alignment");
    b.b.insert(b.b.end(), value.b.begin(), value.b.end());
    return parse_error(b.b);
  };
  const uint32_t u32 = static_cast<uint32_t>(VT::kU32);
  EXPECT_THAT(with(Bytes().u32(u32).u32(0)), HasSubstr("'general.alignment'"));
  EXPECT_THAT(with(Bytes().u32(u32).u32(3)),
              AllOf(HasSubstr("'general.alignment'"), HasSubstr("3")));
  EXPECT_THAT(with(Bytes().u32(static_cast<uint32_t>(VT::kString)).str("32")),
              HasSubstr("'general.alignment'"));
  EXPECT_THAT(with(Bytes().u32(static_cast<uint32_t>(VT::kI32)).u32(0xffffffe0)),
              HasSubstr("'general.alignment'"));
}

TEST(GgufBadFile, GettersNameTheKey) {
  Writer w;
  w.set_string("name", "tiny");
  w.set_u32("n", 5);
  w.set_i32("neg", -1);
  w.set_f32("f", 0.5f);
  w.set_i32_array("arr", {1, 2});
  w.add_tensor("t", {32}, DType::F32, pattern(0));
  const auto bytes = w.to_bytes();
  const auto f = File::parse(bytes, "g.gguf");
  EXPECT_EQ(f->get_u64("n"), 5u);
  EXPECT_EQ(f->get_f64("f"), 0.5);
  EXPECT_EQ(f->get_f64("n"), 5.0);
  EXPECT_EQ(f->get_string("name"), "tiny");
  EXPECT_EQ(f->get_array("arr").size(), 2u);
  EXPECT_EQ(f->get_u64("absent", 7), 7u);
  EXPECT_EQ(f->get_f64("absent", 2.5), 2.5);
  EXPECT_EQ(f->get_string("absent", "d"), "d");
  EXPECT_EQ(f->find_tensor("absent"), nullptr);

  EXPECT_THAT(error_of([&] { f->get_u64("name"); }),
              AllOf(HasSubstr("g.gguf"), HasSubstr("'name'"), HasSubstr("string")));
  EXPECT_THAT(error_of([&] { f->get_u64("neg"); }), HasSubstr("'neg'"));
  EXPECT_THAT(error_of([&] { f->get_u64("name", 1); }), HasSubstr("'name'"));
  EXPECT_THAT(error_of([&] { f->get_f64("arr"); }), HasSubstr("'arr'"));
  EXPECT_THAT(error_of([&] { f->get_string("n"); }), HasSubstr("'n'"));
  EXPECT_THAT(error_of([&] { f->get_array("n"); }), HasSubstr("'n'"));
  EXPECT_THAT(error_of([&] { f->get_u64("absent"); }),
              AllOf(HasSubstr("'absent'"), HasSubstr("missing")));
  EXPECT_THAT(error_of([&] { f->get_string("absent"); }), HasSubstr("'absent'"));
  EXPECT_THAT(error_of([&] { f->tensor("absent"); }),
              AllOf(HasSubstr("tensor 'absent'"), HasSubstr("missing")));
}

TEST(GgufBadFile, OpenNamesThePath) {
  const std::string missing = (kvc::testing::scratch_dir() / "no_such_model.gguf").string();
  TempPath empty("empty.gguf");
  std::ofstream(empty.str()).close();
  for (const Residency r : {Residency::kMapped, Residency::kLoaded}) {
    EXPECT_THAT(error_of([&] { File::open(missing, r); }), HasSubstr(missing));
    EXPECT_THAT(error_of([&] { File::open(empty.str(), r); }),
                AllOf(HasSubstr(empty.str()), HasSubstr("not a GGUF file")));
    EXPECT_THAT(error_of([&] { File::open(kvc::testing::scratch_dir().string(), r); }),
                HasSubstr("not a regular file"));
  }
}

// Random byte flips: the parser either throws kvc::Error or returns a File whose tensors all lie
// inside the buffer. Any other exception fails the test; a crash or overread fails it under ASan.
TEST(GgufBadFile, RandomCorruption) {
  const std::vector<uint8_t> originals[] = {small_file(), full_writer().to_bytes()};
  std::mt19937_64 rng(20240601);
  int parsed = 0;
  for (int iter = 0; iter < 4000; ++iter) {
    std::vector<uint8_t> bytes = originals[iter % 2];
    const int flips = 1 + static_cast<int>(rng() % 4);
    for (int i = 0; i < flips; ++i) {
      // Bias towards the header, where the structure is.
      const size_t limit = rng() % 2 ? std::min<size_t>(bytes.size(), 96) : bytes.size();
      bytes[rng() % limit] ^= static_cast<uint8_t>(1 + rng() % 255);
    }
    if (rng() % 8 == 0) bytes.resize(rng() % bytes.size());
    std::unique_ptr<File> f;
    try {
      f = File::parse(bytes, "fuzz");
    } catch (const Error&) {
      continue;
    }
    ++parsed;
    const uint8_t* begin = bytes.data();
    const uint8_t* end = begin + bytes.size();
    for (const TensorInfo& t : f->tensors()) {
      ASSERT_GE(t.data, begin) << "iteration " << iter << " tensor " << t.name;
      ASSERT_LE(t.bytes, static_cast<uint64_t>(end - t.data))
          << "iteration " << iter << " tensor " << t.name;
    }
  }
  // Flips inside tensor data keep the file valid, so some iterations must parse.
  EXPECT_GT(parsed, 0);
}

const char* test_model() {
  const char* path = std::getenv("KVCACHE_TEST_MODEL");
  return path != nullptr && std::filesystem::is_regular_file(path) ? path : nullptr;
}

TEST(GgufModel, Stories260KParses) {
  const char* path = test_model();
  if (path == nullptr) GTEST_SKIP() << "set KVCACHE_TEST_MODEL to stories260K.gguf to run this";
  const auto f = File::open(path);
  EXPECT_EQ(f->version(), 3u);
  EXPECT_EQ(f->tensors().size(), 48u);
  EXPECT_EQ(f->metadata().size(), 19u);
  EXPECT_EQ(f->data_offset(), 14176u);
  EXPECT_EQ(f->alignment(), 32u);
  EXPECT_EQ(f->get_u64("llama.block_count"), 5u);
  EXPECT_EQ(f->get_string("general.architecture"), "llama");
}

// Copying the model through Writer reproduces the llama.cpp-written file byte for byte.
TEST(GgufModel, Stories260KRewritesIdentically) {
  const char* path = test_model();
  if (path == nullptr) GTEST_SKIP() << "set KVCACHE_TEST_MODEL to stories260K.gguf to run this";
  const auto f = File::open(path);
  Writer w;
  for (const auto& [key, value] : f->metadata()) w.set(key, value);
  for (const TensorInfo& t : f->tensors()) {
    w.add_tensor(t.name, t.dims, t.dtype, [&t](uint8_t* dst, size_t n) {
      ASSERT_EQ(n, t.bytes);
      std::memcpy(dst, t.data, n);
    });
  }
  const auto bytes = w.to_bytes();
  ASSERT_EQ(bytes.size(), f->file_size());
  EXPECT_TRUE(std::equal(bytes.begin(), bytes.end(), f->bytes().begin()));
}

}  // namespace
}  // namespace kvc::gguf
