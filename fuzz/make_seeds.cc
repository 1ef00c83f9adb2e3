// Writes a seed corpus for gguf_fuzz: small valid GGUF files covering every value type, every
// dtype, nested arrays, custom alignment and version 2. Usage: gguf_fuzz_seeds <dir>.
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "base/error.h"
#include "model/gguf_writer.h"

namespace {

using kvc::DType;
using kvc::gguf::make_array;
using kvc::gguf::make_bool;
using kvc::gguf::make_float;
using kvc::gguf::make_int;
using kvc::gguf::make_string;
using kvc::gguf::make_uint;
using kvc::gguf::ValueType;
using kvc::gguf::Writer;

void fill(uint8_t* dst, size_t n) {
  for (size_t i = 0; i < n; ++i) dst[i] = static_cast<uint8_t>(i * 37 + 11);
}

Writer llama_like() {
  Writer w;
  w.set_string("general.architecture", "llama");
  w.set_string("general.name", "seed");
  w.set_u32("llama.block_count", 2);
  w.set_f32("llama.attention.layer_norm_rms_epsilon", 1e-5f);
  w.set_string_array("tokenizer.ggml.tokens", {"<unk>", "<s>", "</s>", "a", "b"});
  w.set_f32_array("tokenizer.ggml.scores", {0, 0, 0, -1.5f, -2.5f});
  w.set_i32_array("tokenizer.ggml.token_type", {2, 3, 3, 1, 1});
  w.set_bool("tokenizer.ggml.add_bos_token", true);
  w.add_tensor("token_embd.weight", {8, 5}, DType::F32, fill);
  w.add_tensor("blk.0.attn_q.weight", {32, 2}, DType::Q8_0, fill);
  w.add_tensor("blk.0.ffn_up.weight", {32, 1, 2}, DType::Q4_0, fill);
  w.add_tensor("output_norm.weight", {8}, DType::F16, fill);
  w.add_tensor("output.weight", {2, 2, 1, 2}, DType::BF16, fill);
  return w;
}

Writer every_type() {
  Writer w;
  w.set("u8", make_uint(ValueType::kU8, 200));
  w.set("i8", make_int(ValueType::kI8, -5));
  w.set("u16", make_uint(ValueType::kU16, 60000));
  w.set("i16", make_int(ValueType::kI16, -300));
  w.set_u32("u32", 70000);
  w.set_i32("i32", -70000);
  w.set_u64("u64", uint64_t{1} << 40);
  w.set("i64", make_int(ValueType::kI64, -(int64_t{1} << 40)));
  w.set_f32("f32", 0.25f);
  w.set("f64", make_float(ValueType::kF64, -2.5));
  w.set_bool("bool", false);
  w.set_string("empty", "");
  w.set("empty_array", make_array(ValueType::kU16, {}));
  w.set("nested", make_array(ValueType::kArray,
                             {make_array(ValueType::kBool, {make_bool(true)}),
                              make_array(ValueType::kString, {make_string("x")}),
                              make_array(ValueType::kArray, {make_array(ValueType::kI8, {})})}));
  w.set_alignment(64);
  w.add_tensor("t", {4}, DType::F32, fill);
  return w;
}

void write_seed(const std::filesystem::path& dir, const std::string& name,
                std::vector<uint8_t> bytes) {
  const auto path = dir / name;
  std::FILE* f = std::fopen(path.c_str(), "wb");
  if (f == nullptr || std::fwrite(bytes.data(), 1, bytes.size(), f) != bytes.size() ||
      std::fclose(f) != 0) {
    kvc::fail("cannot write '{}'", path.string());
  }
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s <corpus dir>\n", argv[0]);
    return 2;
  }
  try {
    const std::filesystem::path dir = argv[1];
    std::filesystem::create_directories(dir);
    write_seed(dir, "empty.gguf", Writer().to_bytes());
    write_seed(dir, "llama_like.gguf", llama_like().to_bytes());
    write_seed(dir, "every_type.gguf", every_type().to_bytes());
    auto v2 = llama_like().to_bytes();
    v2[4] = 2;  // versions 2 and 3 share one layout
    write_seed(dir, "llama_like_v2.gguf", std::move(v2));
  } catch (const kvc::Error& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 1;
  }
  return 0;
}
