// A model's attention geometry and weight size, read from a GGUF file's metadata, a Hugging
// Face config.json, or a named preset, for `kvcache plan`.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "base/dtype.h"
#include "kv/memory_plan.h"
#include "model/gguf.h"

namespace kvc::model {

struct ModelGeometry {
  std::string name;          // preset name, general.name, or the config's path
  std::string source;        // "preset", "gguf" or "config.json"
  std::string architecture;  // GGUF general.architecture or config model_type; may be empty
  int n_heads = 0;           // query heads (of the first layer when they vary)
  kv::AttentionGeometry attention;
  uint64_t parameters = 0;
  uint64_t weights_bytes = 0;
  std::optional<DType> weights_dtype;  // nullopt: as stored in the GGUF file, mixed types
};

// "MHA", "GQA", "MQA", "MLA", or "mixed" when layers differ in kind.
std::string attention_kind(const ModelGeometry& model);
// One line such as "32 layers, 32 heads, 8 KV heads x 128 (GQA)", with windows and latents.
std::string describe_attention(const ModelGeometry& model);

// From GGUF metadata ({arch}.block_count, attention.head_count(_kv), key/value_length,
// sliding_window, deepseek2's kv_lora_rank); the weights are the sum of the tensors' bytes.
// Throws Error naming the missing or malformed key.
ModelGeometry geometry_from_gguf(const gguf::File& file);
ModelGeometry geometry_from_gguf_file(const std::string& path);

// From a Hugging Face config.json (a text_config inside a multimodal config is used when the
// top level has no num_hidden_layers). Weights are estimated from the shapes at weights_dtype,
// or the config's torch_dtype, or bf16. Throws Error naming the missing or malformed key.
ModelGeometry geometry_from_config(const nlohmann::json& config, const std::string& label,
                                   std::optional<DType> weights_dtype);
ModelGeometry geometry_from_config_file(const std::string& path,
                                        std::optional<DType> weights_dtype);

// Parameters a config.json's shapes imply (dense, MoE and MLA layers, embeddings, norms).
uint64_t estimate_parameters(const nlohmann::json& config, const std::string& label);

// A named model (published config and parameter count); throws Error listing the valid names.
ModelGeometry geometry_from_preset(std::string_view name, std::optional<DType> weights_dtype);
std::vector<std::string> preset_names();

}  // namespace kvc::model
