#include "model/model_geometry.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "base/error.h"
#include "model/gguf.h"
#include "scratch_dir.h"

namespace kvc::model {
namespace {

using nlohmann::json;
using ::testing::HasSubstr;

constexpr uint64_t KiB = 1024;
constexpr uint64_t GiB = 1024 * 1024 * KiB;

uint64_t bytes_per_token(const ModelGeometry& m, DType dtype = DType::F16) {
  kv::PlanOptions o;
  o.k_dtype = o.v_dtype = dtype;
  return kv::plan_memory(m.attention, o).bytes_per_token;
}

std::string write_temp(const std::string& name, const std::string& text) {
  const auto dir = kvc::testing::scratch_dir() / "model_geometry_test";
  std::filesystem::create_directories(dir);
  const auto path = dir / name;
  std::ofstream(path, std::ios::binary) << text;
  return path.string();
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

// The published config.json files, as their model repositories ship them.
const char* kLlama3_8B = R"({
  "architectures": ["LlamaForCausalLM"], "attention_bias": false, "attention_dropout": 0.0,
  "bos_token_id": 128000, "eos_token_id": 128001, "hidden_act": "silu", "hidden_size": 4096,
  "initializer_range": 0.02, "intermediate_size": 14336, "max_position_embeddings": 8192,
  "model_type": "llama", "num_attention_heads": 32, "num_hidden_layers": 32,
  "num_key_value_heads": 8, "pretraining_tp": 1, "rms_norm_eps": 1e-05, "rope_scaling": null,
  "rope_theta": 500000.0, "tie_word_embeddings": false, "torch_dtype": "bfloat16",
  "transformers_version": "4.40.0.dev0", "use_cache": true, "vocab_size": 128256})";

const char* kLlama3_70B = R"({
  "architectures": ["LlamaForCausalLM"], "attention_bias": false, "hidden_act": "silu",
  "hidden_size": 8192, "intermediate_size": 28672, "max_position_embeddings": 8192,
  "model_type": "llama", "num_attention_heads": 64, "num_hidden_layers": 80,
  "num_key_value_heads": 8, "rms_norm_eps": 1e-05, "rope_theta": 500000.0,
  "tie_word_embeddings": false, "torch_dtype": "bfloat16", "vocab_size": 128256})";

const char* kQwen25_7B = R"({
  "architectures": ["Qwen2ForCausalLM"], "attention_dropout": 0.0, "bos_token_id": 151643,
  "eos_token_id": 151643, "hidden_act": "silu", "hidden_size": 3584,
  "initializer_range": 0.02, "intermediate_size": 18944, "max_position_embeddings": 131072,
  "max_window_layers": 28, "model_type": "qwen2", "num_attention_heads": 28,
  "num_hidden_layers": 28, "num_key_value_heads": 4, "rms_norm_eps": 1e-06,
  "rope_theta": 1000000.0, "sliding_window": 131072, "tie_word_embeddings": false,
  "torch_dtype": "bfloat16", "use_cache": true, "use_sliding_window": false,
  "vocab_size": 152064})";

const char* kQwen25_05B = R"({
  "architectures": ["Qwen2ForCausalLM"], "hidden_act": "silu", "hidden_size": 896,
  "intermediate_size": 4864, "max_position_embeddings": 32768, "max_window_layers": 21,
  "model_type": "qwen2", "num_attention_heads": 14, "num_hidden_layers": 24,
  "num_key_value_heads": 2, "rms_norm_eps": 1e-06, "rope_theta": 1000000.0,
  "sliding_window": 32768, "tie_word_embeddings": true, "torch_dtype": "bfloat16",
  "use_sliding_window": false, "vocab_size": 151936})";

const char* kTinyLlama = R"({
  "architectures": ["LlamaForCausalLM"], "hidden_act": "silu", "hidden_size": 2048,
  "intermediate_size": 5632, "max_position_embeddings": 2048, "model_type": "llama",
  "num_attention_heads": 32, "num_hidden_layers": 22, "num_key_value_heads": 4,
  "rms_norm_eps": 1e-05, "rope_scaling": null, "tie_word_embeddings": false,
  "torch_dtype": "bfloat16", "vocab_size": 32000})";

const char* kDeepSeekV3 = R"({
  "architectures": ["DeepseekV3ForCausalLM"], "first_k_dense_replace": 3,
  "hidden_act": "silu", "hidden_size": 7168, "intermediate_size": 18432,
  "kv_lora_rank": 512, "max_position_embeddings": 163840, "model_type": "deepseek_v3",
  "moe_intermediate_size": 2048, "moe_layer_freq": 1, "n_group": 8, "n_routed_experts": 256,
  "n_shared_experts": 1, "norm_topk_prob": true, "num_attention_heads": 128,
  "num_experts_per_tok": 8, "num_hidden_layers": 61, "num_key_value_heads": 128,
  "num_nextn_predict_layers": 1, "q_lora_rank": 1536, "qk_nope_head_dim": 128,
  "qk_rope_head_dim": 64, "rms_norm_eps": 1e-06, "routed_scaling_factor": 2.5,
  "scoring_func": "sigmoid", "tie_word_embeddings": false, "topk_group": 4,
  "topk_method": "noaux_tc", "torch_dtype": "bfloat16", "v_head_dim": 128,
  "vocab_size": 129280})";

struct Published {
  const char* preset;
  const char* config;
  uint64_t bytes_per_token;  // f16/bf16
};

const Published kPublished[] = {
    {"llama3-8b", kLlama3_8B, 128 * KiB},     {"llama3-70b", kLlama3_70B, 320 * KiB},
    {"qwen2.5-7b", kQwen25_7B, 56 * KiB},     {"qwen2.5-0.5b", kQwen25_05B, 12 * KiB},
    {"tinyllama-1.1b", kTinyLlama, 22 * KiB}, {"deepseek-v3", kDeepSeekV3, 70272},
};

TEST(ModelGeometry, PublishedConfigsAndPresetsAgree) {
  for (const Published& p : kPublished) {
    SCOPED_TRACE(p.preset);
    const ModelGeometry config = geometry_from_config_file(
        write_temp(std::string(p.preset) + ".json", p.config), std::nullopt);
    const ModelGeometry preset = geometry_from_preset(p.preset, std::nullopt);
    EXPECT_EQ(bytes_per_token(config), p.bytes_per_token);
    EXPECT_EQ(bytes_per_token(config, DType::BF16), p.bytes_per_token);
    EXPECT_EQ(bytes_per_token(preset), p.bytes_per_token);
    // The shapes imply exactly the published parameter count.
    EXPECT_EQ(config.parameters, preset.parameters);
    EXPECT_EQ(config.weights_dtype, DType::BF16);
    EXPECT_EQ(config.weights_bytes, 2 * config.parameters);
    EXPECT_EQ(preset.source, "preset");
  }
}

TEST(ModelGeometry, PresetFacts) {
  const ModelGeometry llama = geometry_from_preset("llama3-8b", std::nullopt);
  EXPECT_EQ(llama.parameters, 8030261248u);
  EXPECT_EQ(attention_kind(llama), "GQA");
  EXPECT_EQ(describe_attention(llama), "32 layers, 32 heads, 8 KV heads x 128 (GQA)");
  kv::PlanOptions o;
  o.contexts = {131072};
  const kv::MemoryPlan p = kv::plan_memory(llama.attention, o);
  EXPECT_TRUE(p.pool_layout);
  EXPECT_EQ(p.requests[0].allocated_bytes, 16 * GiB);

  const ModelGeometry ds = geometry_from_preset("deepseek-v3", DType::Q8_0);
  EXPECT_EQ(attention_kind(ds), "MLA");
  EXPECT_NEAR(static_cast<double>(ds.parameters), 671e9, 0.1e9);
  EXPECT_EQ(ds.weights_bytes, (ds.parameters + 31) / 32 * 34);
  EXPECT_EQ(ds.attention.layers.size(), 61u);

  EXPECT_EQ(preset_names().size(), 6u);
  const std::string e = error_of([] { geometry_from_preset("llama2-7b", std::nullopt); });
  EXPECT_THAT(e, HasSubstr("unknown preset 'llama2-7b'"));
  for (const auto& name : preset_names()) EXPECT_THAT(e, HasSubstr(name));
}

TEST(ModelGeometry, ConfigKinds) {
  json mha = json::parse(kLlama3_8B);
  mha.erase("num_key_value_heads");  // older configs: as many KV heads as query heads
  EXPECT_EQ(attention_kind(geometry_from_config(mha, "mha", std::nullopt)), "MHA");
  EXPECT_EQ(bytes_per_token(geometry_from_config(mha, "mha", std::nullopt)), 512 * KiB);

  json mqa = json::parse(kLlama3_8B);
  mqa["num_key_value_heads"] = 1;
  EXPECT_EQ(attention_kind(geometry_from_config(mqa, "mqa", std::nullopt)), "MQA");
  EXPECT_EQ(bytes_per_token(geometry_from_config(mqa, "mqa", std::nullopt)), 16 * KiB);

  json explicit_dim = json::parse(kLlama3_8B);
  explicit_dim["head_dim"] = 256;  // Gemma-style: head_dim is not hidden / heads
  EXPECT_EQ(bytes_per_token(geometry_from_config(explicit_dim, "hd", std::nullopt)), 256 * KiB);

  // Multimodal configs nest the language model.
  const json nested = {{"model_type", "llava"}, {"text_config", json::parse(kTinyLlama)}};
  EXPECT_EQ(bytes_per_token(geometry_from_config(nested, "llava", std::nullopt)), 22 * KiB);

  EXPECT_EQ(geometry_from_config(json::parse(kTinyLlama), "t", DType::F32).weights_bytes,
            4 * 1100048384ull);
}

TEST(ModelGeometry, ConfigSlidingWindows) {
  // Mistral-7B-v0.1: every layer windowed to 4096.
  json mistral = json::parse(kLlama3_8B);
  mistral["model_type"] = "mistral";
  mistral["sliding_window"] = 4096;
  auto m = geometry_from_config(mistral, "mistral", std::nullopt);
  for (const auto& l : m.attention.layers) EXPECT_EQ(l.window, 4096u);
  EXPECT_THAT(describe_attention(m), HasSubstr("32 of 32 layers windowed to 4096 tokens"));

  // Qwen2 with use_sliding_window: layers from max_window_layers on are windowed.
  json qwen = json::parse(kQwen25_7B);
  qwen["use_sliding_window"] = true;
  qwen["sliding_window"] = 4096;
  qwen["max_window_layers"] = 20;
  m = geometry_from_config(qwen, "qwen", std::nullopt);
  EXPECT_EQ(m.attention.layers[19].window, 0u);
  EXPECT_EQ(m.attention.layers[20].window, 4096u);
  // ... and not at all when use_sliding_window is false, as Qwen2.5 ships.
  EXPECT_FALSE(
      geometry_from_config(json::parse(kQwen25_7B), "q", std::nullopt).attention.has_window());

  // Gemma 2 alternates, starting with a windowed layer.
  json gemma2 = json::parse(kTinyLlama);
  gemma2["model_type"] = "gemma2";
  gemma2["sliding_window"] = 4096;
  m = geometry_from_config(gemma2, "gemma2", std::nullopt);
  EXPECT_EQ(m.attention.layers[0].window, 4096u);
  EXPECT_EQ(m.attention.layers[1].window, 0u);

  // Gemma 3: every sixth layer is full.
  json gemma3 = json::parse(kTinyLlama);
  gemma3["sliding_window"] = 1024;
  gemma3["sliding_window_pattern"] = 6;
  m = geometry_from_config(gemma3, "gemma3", std::nullopt);
  EXPECT_EQ(m.attention.layers[4].window, 1024u);
  EXPECT_EQ(m.attention.layers[5].window, 0u);

  // layer_types says it per layer.
  json typed = json::parse(kTinyLlama);
  typed["num_hidden_layers"] = 3;
  typed["sliding_window"] = 512;
  typed["layer_types"] = {"sliding_attention", "full_attention", "sliding_attention"};
  m = geometry_from_config(typed, "typed", std::nullopt);
  EXPECT_EQ(m.attention.layers[0].window, 512u);
  EXPECT_EQ(m.attention.layers[1].window, 0u);
  typed["layer_types"] = {"sliding_attention", "full_attention"};
  EXPECT_THAT(error_of([&] { geometry_from_config(typed, "typed", std::nullopt); }),
              HasSubstr("layer_types"));
}

TEST(ModelGeometry, ConfigErrorsNameTheKey) {
  for (const char* key : {"num_hidden_layers", "num_attention_heads", "hidden_size", "vocab_size",
                          "intermediate_size"}) {
    json config = json::parse(kLlama3_8B);
    config.erase(key);
    const std::string path = write_temp("missing.json", config.dump());
    EXPECT_THAT(error_of([&] { geometry_from_config_file(path, std::nullopt); }),
                HasSubstr(fmt::format("required key '{}' is missing", key)));
  }
  json mla = json::parse(kDeepSeekV3);
  mla.erase("qk_rope_head_dim");
  EXPECT_THAT(error_of([&] { geometry_from_config(mla, "ds", std::nullopt); }),
              HasSubstr("'qk_rope_head_dim'"));
  json negative = json::parse(kLlama3_8B);
  negative["num_key_value_heads"] = -8;
  EXPECT_THAT(error_of([&] { geometry_from_config(negative, "neg", std::nullopt); }),
              HasSubstr("'num_key_value_heads' must be a positive integer, got -8"));
  json text = json::parse(kLlama3_8B);
  text["hidden_size"] = "4096";
  EXPECT_THAT(error_of([&] { geometry_from_config(text, "txt", std::nullopt); }),
              HasSubstr("'hidden_size' must be an integer"));
  json odd = json::parse(kLlama3_8B);
  odd["hidden_size"] = 4095;
  EXPECT_THAT(error_of([&] { geometry_from_config(odd, "odd", std::nullopt); }),
              HasSubstr("'head_dim' is missing"));
  EXPECT_THAT(error_of([] { geometry_from_config_file("/nonexistent/config.json", {}); }),
              HasSubstr("cannot open"));
  const std::string broken = write_temp("broken.json", "{\"num_hidden_layers\": ");
  EXPECT_THAT(error_of([&] { geometry_from_config_file(broken, {}); }),
              HasSubstr("not valid JSON"));
}

// A minimal GGUF v3 writer for metadata and tensor infos.
class GgufBuilder {
 public:
  void u32(const std::string& key, uint32_t v) {
    header(key, 4);
    put(v);
    ++kv_;
  }
  void str(const std::string& key, const std::string& v) {
    header(key, 8);
    string(v);
    ++kv_;
  }
  void u32_array(const std::string& key, const std::vector<uint32_t>& values) {
    header(key, 9);
    put(uint32_t{4});
    put(uint64_t{values.size()});
    for (uint32_t v : values) put(v);
    ++kv_;
  }
  void tensor(const std::string& name, std::vector<uint64_t> dims, uint32_t ggml_type,
              uint64_t bytes) {
    tensors_.push_back({name, std::move(dims), ggml_type, data_size_});
    data_size_ += (bytes + 31) / 32 * 32;
  }

  std::vector<uint8_t> build() const {
    GgufBuilder out;
    out.put(uint32_t{0x46554747});
    out.put(uint32_t{3});
    out.put(uint64_t{tensors_.size()});
    out.put(uint64_t{kv_});
    out.bytes_.insert(out.bytes_.end(), bytes_.begin(), bytes_.end());
    for (const auto& t : tensors_) {
      out.string(t.name);
      out.put(static_cast<uint32_t>(t.dims.size()));
      for (uint64_t d : t.dims) out.put(d);
      out.put(t.type);
      out.put(t.offset);
    }
    out.bytes_.resize((out.bytes_.size() + 31) / 32 * 32 + data_size_, 0);
    return out.bytes_;
  }

 private:
  struct Tensor {
    std::string name;
    std::vector<uint64_t> dims;
    uint32_t type;
    uint64_t offset;
  };
  template <typename T>
  void put(T v) {
    const auto* p = reinterpret_cast<const uint8_t*>(&v);
    bytes_.insert(bytes_.end(), p, p + sizeof(T));
  }
  void string(const std::string& s) {
    put(uint64_t{s.size()});
    bytes_.insert(bytes_.end(), s.begin(), s.end());
  }
  void header(const std::string& key, uint32_t type) {
    string(key);
    put(type);
  }

  std::vector<uint8_t> bytes_;
  uint64_t kv_ = 0;
  std::vector<Tensor> tensors_;
  uint64_t data_size_ = 0;
};

TEST(ModelGeometry, GgufLlama) {
  GgufBuilder b;
  b.str("general.architecture", "llama");
  b.str("general.name", "tiny llama");
  b.u32("llama.block_count", 4);
  b.u32("llama.embedding_length", 64);
  b.u32("llama.attention.head_count", 8);
  b.u32("llama.attention.head_count_kv", 2);
  b.tensor("token_embd.weight", {64, 100}, 1, 64 * 100 * 2);        // f16
  b.tensor("output_norm.weight", {64}, 0, 64 * 4);                  // f32
  b.tensor("blk.0.attn_q.weight", {64, 64}, 8, 64 * 64 / 32 * 34);  // q8_0
  const auto bytes = b.build();
  const auto file = gguf::File::parse(bytes, "tiny.gguf");
  const ModelGeometry m = geometry_from_gguf(*file);
  EXPECT_EQ(m.name, "tiny llama");
  EXPECT_EQ(m.source, "gguf");
  EXPECT_EQ(attention_kind(m), "GQA");
  const auto pool = m.attention.pool_geometry(DType::F16, DType::F16, 16);
  ASSERT_TRUE(pool.has_value());
  EXPECT_EQ(pool->n_layers, 4);
  EXPECT_EQ(pool->n_kv_heads, 2);
  EXPECT_EQ(pool->head_dim, 8);
  EXPECT_EQ(m.weights_bytes, 64u * 100 * 2 + 64 * 4 + 64 * 64 / 32 * 34);
  EXPECT_EQ(m.parameters, 64u * 100 + 64 + 64 * 64);
  EXPECT_FALSE(m.weights_dtype.has_value());
}

TEST(ModelGeometry, GgufKeyLengthsWindowsAndPerLayerHeads) {
  GgufBuilder b;
  b.str("general.architecture", "gemma2");
  b.u32("gemma2.block_count", 4);
  b.u32("gemma2.embedding_length", 2304);
  b.u32("gemma2.attention.head_count", 8);
  b.u32_array("gemma2.attention.head_count_kv", {4, 4, 2, 0});
  b.u32("gemma2.attention.key_length", 256);
  b.u32("gemma2.attention.value_length", 128);
  b.u32("gemma2.attention.sliding_window", 4096);
  const auto bytes = b.build();
  const ModelGeometry m = geometry_from_gguf(*gguf::File::parse(bytes, "g.gguf"));
  const auto& l = m.attention.layers;
  ASSERT_EQ(l.size(), 4u);
  EXPECT_EQ(l[0].kv_heads, 4);
  EXPECT_EQ(l[0].k_head_dim, 256);
  EXPECT_EQ(l[0].v_head_dim, 128);
  EXPECT_EQ(l[0].window, 4096u);
  EXPECT_EQ(l[1].window, 0u);
  EXPECT_EQ(l[2].kv_heads, 2);
  EXPECT_EQ(l[3].kv_heads, 0);  // a layer without attention keeps no cache
  EXPECT_EQ(bytes_per_token(m), (4u + 4 + 2) * (256 + 128) * 2);
  EXPECT_EQ(attention_kind(m), "GQA");
  EXPECT_THAT(describe_attention(m), HasSubstr("vary by layer"));
  EXPECT_THAT(describe_attention(m), HasSubstr("2 of 4 layers windowed to 4096 tokens"));
}

TEST(ModelGeometry, GgufDeepseek2IsMla) {
  GgufBuilder b;
  b.str("general.architecture", "deepseek2");
  b.u32("deepseek2.block_count", 61);
  b.u32("deepseek2.embedding_length", 7168);
  b.u32("deepseek2.attention.head_count", 128);
  b.u32("deepseek2.attention.head_count_kv", 128);
  b.u32("deepseek2.attention.kv_lora_rank", 512);
  b.u32("deepseek2.rope.dimension_count", 64);
  const auto bytes = b.build();
  const ModelGeometry m = geometry_from_gguf(*gguf::File::parse(bytes, "ds.gguf"));
  EXPECT_EQ(attention_kind(m), "MLA");
  EXPECT_EQ(bytes_per_token(m), 70272u);
}

TEST(ModelGeometry, GgufMissingKeyIsNamed) {
  GgufBuilder b;
  b.str("general.architecture", "llama");
  b.u32("llama.embedding_length", 64);
  b.u32("llama.attention.head_count", 8);
  const auto bytes = b.build();
  const auto file = gguf::File::parse(bytes, "bad.gguf");
  EXPECT_THAT(error_of([&] { geometry_from_gguf(*file); }), HasSubstr("'llama.block_count'"));

  GgufBuilder c;
  c.str("general.architecture", "llama");
  c.u32("llama.block_count", 3);
  c.u32("llama.embedding_length", 64);
  c.u32("llama.attention.head_count", 8);
  c.u32_array("llama.attention.head_count_kv", {2, 2});
  const auto short_bytes = c.build();
  const auto short_file = gguf::File::parse(short_bytes, "short.gguf");
  EXPECT_THAT(error_of([&] { geometry_from_gguf(*short_file); }),
              HasSubstr("has 2 values, expected one per layer (3)"));
}

}  // namespace
}  // namespace kvc::model
