#include "model/model_geometry.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <climits>
#include <fstream>
#include <set>
#include <sstream>

#include "base/error.h"

namespace kvc::model {

namespace {

using nlohmann::json;

uint64_t weights_at(uint64_t parameters, DType dtype) {
  const auto per_block = static_cast<uint64_t>(block_elements(dtype));
  return (parameters + per_block - 1) / per_block * block_bytes(dtype);
}

// ---- GGUF ----

// A key that holds either one value for every layer or an array of one value per layer.
std::vector<uint64_t> per_layer(const gguf::File& file, const std::string& key, size_t n_layers,
                                std::optional<uint64_t> fallback) {
  const gguf::Value* value = file.find(key);
  if (value == nullptr) {
    if (!fallback) file.get_u64(key);  // throws, naming the missing key
    return std::vector<uint64_t>(n_layers, *fallback);
  }
  if (const auto* items = value->as_array()) {
    if (items->size() != n_layers) {
      fail("{}: metadata key '{}' has {} values, expected one per layer ({})", file.label(), key,
           items->size(), n_layers);
    }
    std::vector<uint64_t> out;
    for (const auto& item : *items) {
      const auto u = item.as_u64();
      if (!u)
        fail("{}: metadata key '{}' holds {}, not a count", file.label(), key, item.describe());
      out.push_back(*u);
    }
    return out;
  }
  return std::vector<uint64_t>(n_layers, file.get_u64(key));
}

int to_int(uint64_t value, const gguf::File& file, const std::string& key) {
  if (value > static_cast<uint64_t>(INT_MAX)) {
    fail("{}: metadata key '{}' = {} is out of range", file.label(), key, value);
  }
  return static_cast<int>(value);
}

// Which layers use the sliding window: an explicit per-layer pattern when the file has one,
// else the interleaving llama.cpp hard-codes for the architecture, else every layer.
std::vector<bool> gguf_window_layers(const gguf::File& file, const std::string& arch,
                                     size_t n_layers) {
  const std::string key = arch + ".attention.sliding_window_pattern";
  uint64_t every = 0;  // every n-th layer (1-based) is full attention; 0: all windowed
  if (const gguf::Value* value = file.find(key)) {
    if (const auto* items = value->as_array()) {
      if (items->size() != n_layers) {
        fail("{}: metadata key '{}' has {} values, expected one per layer ({})", file.label(), key,
             items->size(), n_layers);
      }
      std::vector<bool> out;
      for (const auto& item : *items) {
        const bool* b = std::get_if<bool>(&item.data);
        if (b == nullptr) fail("{}: metadata key '{}' must hold booleans", file.label(), key);
        out.push_back(*b);
      }
      return out;
    }
    every = file.get_u64(key);
  } else if (arch == "gemma2" || arch == "gpt-oss") {
    every = 2;
  } else if (arch == "cohere2") {
    every = 4;
  } else if (arch == "gemma3") {
    every = 6;
  }
  std::vector<bool> out(n_layers, true);
  if (every > 0) {
    for (size_t i = 0; i < n_layers; ++i) out[i] = (i + 1) % every != 0;
  }
  return out;
}

// ---- config.json ----

class ConfigReader {
 public:
  ConfigReader(const json& config, std::string label) : config_(config), label_(std::move(label)) {}

  const json& config() const { return config_; }
  const std::string& label() const { return label_; }

  bool has(const char* key) const { return config_.contains(key) && !config_[key].is_null(); }

  std::optional<int64_t> optional_int(const char* key) const {
    if (!has(key)) return std::nullopt;
    const json& v = config_[key];
    if (v.is_number_integer()) return v.get<int64_t>();
    if (v.is_number_float()) {
      const double d = v.get<double>();
      if (d == static_cast<double>(static_cast<int64_t>(d))) return static_cast<int64_t>(d);
    }
    fail("{}: key '{}' must be an integer, got {}", label_, key, v.dump());
  }

  int64_t required_int(const char* key) const {
    if (!config_.contains(key)) fail("{}: required key '{}' is missing", label_, key);
    if (config_[key].is_null()) fail("{}: required key '{}' is null", label_, key);
    return *optional_int(key);
  }

  int positive(const char* key) const { return check_positive(key, required_int(key)); }

  std::optional<int> optional_positive(const char* key) const {
    const auto v = optional_int(key);
    if (!v) return std::nullopt;
    return check_positive(key, *v);
  }

  std::optional<bool> optional_bool(const char* key) const {
    if (!has(key)) return std::nullopt;
    if (!config_[key].is_boolean()) {
      fail("{}: key '{}' must be true or false, got {}", label_, key, config_[key].dump());
    }
    return config_[key].get<bool>();
  }

  std::string optional_string(const char* key) const {
    if (!has(key)) return {};
    if (!config_[key].is_string()) {
      fail("{}: key '{}' must be a string, got {}", label_, key, config_[key].dump());
    }
    return config_[key].get<std::string>();
  }

 private:
  int check_positive(const char* key, int64_t v) const {
    if (v <= 0 || v > INT_MAX)
      fail("{}: key '{}' must be a positive integer, got {}", label_, key, v);
    return static_cast<int>(v);
  }

  const json& config_;
  std::string label_;
};

// Multimodal configs keep the language model's shapes in text_config.
ConfigReader text_reader(const json& config, const std::string& label) {
  if (!config.is_object()) fail("{}: expected a JSON object, got {}", label, config.type_name());
  if (!config.contains("num_hidden_layers") && config.contains("text_config") &&
      config["text_config"].is_object()) {
    return ConfigReader(config["text_config"], label + " (text_config)");
  }
  return ConfigReader(config, label);
}

int config_head_dim(const ConfigReader& in, int hidden, int heads) {
  if (const auto dim = in.optional_positive("head_dim")) return *dim;
  if (hidden % heads != 0) {
    fail("{}: hidden_size {} is not a multiple of num_attention_heads {} and 'head_dim' is missing",
         in.label(), hidden, heads);
  }
  return hidden / heads;
}

// The window of each layer (0 = full attention), following the conventions of the Hugging Face
// model families: layer_types, Qwen2's max_window_layers, Gemma's interleaving patterns.
std::vector<uint64_t> config_windows(const ConfigReader& in, int n_layers) {
  std::optional<int64_t> window = in.optional_int("sliding_window");
  if (window && *window <= 0) {
    fail("{}: key 'sliding_window' must be a positive integer, got {}", in.label(), *window);
  }
  const auto use = in.optional_bool("use_sliding_window");
  if (use && !*use) window.reset();

  std::vector<uint64_t> out(static_cast<size_t>(n_layers), 0);
  if (in.has("layer_types")) {
    const json& types = in.config()["layer_types"];
    if (!types.is_array() || types.size() != out.size()) {
      fail("{}: key 'layer_types' must be an array of one entry per layer ({})", in.label(),
           n_layers);
    }
    for (size_t i = 0; i < out.size(); ++i) {
      const std::string type = types[i].is_string() ? types[i].get<std::string>() : types[i].dump();
      if (type == "full_attention") continue;
      if (type != "sliding_attention") {
        fail(
            "{}: layer_types[{}] is '{}'; kvcache plans full_attention and sliding_attention "
            "layers only",
            in.label(), i, type);
      }
      if (!window) {
        fail("{}: layer_types[{}] is sliding_attention but key 'sliding_window' is missing",
             in.label(), i);
      }
      out[i] = static_cast<uint64_t>(*window);
    }
    return out;
  }
  if (!window) return out;

  const auto w = static_cast<uint64_t>(*window);
  const auto max_window_layers = in.optional_int("max_window_layers");
  const auto pattern = in.optional_positive("sliding_window_pattern");
  for (int i = 0; i < n_layers; ++i) {
    bool sliding = true;
    if (use && max_window_layers) {
      sliding = i >= *max_window_layers;  // Qwen2: the first max_window_layers are full
    } else if (pattern) {
      sliding = (i + 1) % *pattern != 0;  // Gemma 3: every pattern-th layer is full
    } else if (in.optional_string("model_type") == "gemma2") {
      sliding = i % 2 == 0;
    }
    out[static_cast<size_t>(i)] = sliding ? w : 0;
  }
  return out;
}

std::optional<DType> config_weights_dtype(const ConfigReader& in) {
  std::string name = in.optional_string("torch_dtype");
  if (name.empty()) name = in.optional_string("dtype");
  if (name == "bfloat16") return DType::BF16;
  if (name == "float16") return DType::F16;
  if (name == "float32") return DType::F32;
  return std::nullopt;
}

// ---- presets ----

struct Preset {
  const char* name;
  uint64_t parameters;  // published count (DeepSeek-V3: the main model, without its MTP module)
  const char* config;   // the published config.json, shape keys only
};

constexpr Preset kPresets[] = {
    {"llama3-8b", 8030261248ull, R"({
      "model_type": "llama", "num_hidden_layers": 32, "num_attention_heads": 32,
      "num_key_value_heads": 8, "hidden_size": 4096, "intermediate_size": 14336,
      "vocab_size": 128256, "tie_word_embeddings": false, "torch_dtype": "bfloat16",
      "max_position_embeddings": 8192})"},
    {"llama3-70b", 70553706496ull, R"({
      "model_type": "llama", "num_hidden_layers": 80, "num_attention_heads": 64,
      "num_key_value_heads": 8, "hidden_size": 8192, "intermediate_size": 28672,
      "vocab_size": 128256, "tie_word_embeddings": false, "torch_dtype": "bfloat16",
      "max_position_embeddings": 8192})"},
    {"qwen2.5-7b", 7615616512ull, R"({
      "model_type": "qwen2", "num_hidden_layers": 28, "num_attention_heads": 28,
      "num_key_value_heads": 4, "hidden_size": 3584, "intermediate_size": 18944,
      "vocab_size": 152064, "tie_word_embeddings": false, "torch_dtype": "bfloat16",
      "sliding_window": 131072, "use_sliding_window": false, "max_window_layers": 28,
      "max_position_embeddings": 32768})"},
    {"qwen2.5-0.5b", 494032768ull, R"({
      "model_type": "qwen2", "num_hidden_layers": 24, "num_attention_heads": 14,
      "num_key_value_heads": 2, "hidden_size": 896, "intermediate_size": 4864,
      "vocab_size": 151936, "tie_word_embeddings": true, "torch_dtype": "bfloat16",
      "sliding_window": 32768, "use_sliding_window": false, "max_window_layers": 21,
      "max_position_embeddings": 32768})"},
    {"tinyllama-1.1b", 1100048384ull, R"({
      "model_type": "llama", "num_hidden_layers": 22, "num_attention_heads": 32,
      "num_key_value_heads": 4, "hidden_size": 2048, "intermediate_size": 5632,
      "vocab_size": 32000, "tie_word_embeddings": false, "torch_dtype": "bfloat16",
      "max_position_embeddings": 2048})"},
    {"deepseek-v3", 671026419200ull, R"({
      "model_type": "deepseek_v3", "num_hidden_layers": 61, "num_attention_heads": 128,
      "num_key_value_heads": 128, "hidden_size": 7168, "intermediate_size": 18432,
      "moe_intermediate_size": 2048, "n_routed_experts": 256, "n_shared_experts": 1,
      "first_k_dense_replace": 3, "topk_method": "noaux_tc", "q_lora_rank": 1536,
      "kv_lora_rank": 512, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64,
      "v_head_dim": 128, "vocab_size": 129280, "tie_word_embeddings": false,
      "torch_dtype": "bfloat16", "max_position_embeddings": 163840})"},
};

}  // namespace

std::string attention_kind(const ModelGeometry& model) {
  std::set<std::string> kinds;
  for (const auto& layer : model.attention.layers) {
    if (layer.latent_dim > 0) {
      kinds.insert("MLA");
    } else if (layer.kv_heads == 1) {
      kinds.insert("MQA");
    } else if (layer.kv_heads > 0 && layer.kv_heads == model.n_heads) {
      kinds.insert("MHA");
    } else if (layer.kv_heads > 0) {
      kinds.insert("GQA");
    }
  }
  return kinds.size() == 1 ? *kinds.begin() : "mixed";
}

std::string describe_attention(const ModelGeometry& model) {
  const auto& layers = model.attention.layers;
  std::string out = fmt::format("{} layers, {} heads, ", layers.size(), model.n_heads);
  const auto cached = std::find_if(layers.begin(), layers.end(), [](const auto& l) {
    return l.kv_heads > 0 || l.latent_dim > 0;
  });
  const bool uniform =
      cached != layers.end() && std::all_of(layers.begin(), layers.end(), [&](const auto& l) {
        return l.kv_heads == cached->kv_heads && l.k_head_dim == cached->k_head_dim &&
               l.v_head_dim == cached->v_head_dim && l.latent_dim == cached->latent_dim;
      });
  if (!uniform) {
    out += "KV heads and head sizes vary by layer";
  } else if (cached->latent_dim > 0) {
    out += fmt::format("latent of {} per token per layer", cached->latent_dim);
  } else if (cached->k_head_dim == cached->v_head_dim) {
    out += fmt::format("{} KV heads x {}", cached->kv_heads, cached->k_head_dim);
  } else {
    out += fmt::format("{} KV heads x {} (K) / {} (V)", cached->kv_heads, cached->k_head_dim,
                       cached->v_head_dim);
  }
  out += fmt::format(" ({})", attention_kind(model));
  size_t windowed = 0;
  uint64_t widest = 0;
  for (const auto& l : layers) {
    windowed += l.window > 0;
    widest = std::max(widest, l.window);
  }
  if (windowed > 0) {
    out += fmt::format(", {} of {} layers windowed to {} tokens", windowed, layers.size(), widest);
  }
  return out;
}

ModelGeometry geometry_from_gguf(const gguf::File& file) {
  const std::string arch = file.get_string("general.architecture");
  const std::string p = arch + ".";
  ModelGeometry m;
  m.source = "gguf";
  m.architecture = arch;
  m.name = file.get_string("general.name", file.label());
  const auto n_layers =
      static_cast<size_t>(to_int(file.get_u64(p + "block_count"), file, p + "block_count"));
  if (n_layers == 0) fail("{}: metadata key '{}block_count' is 0", file.label(), p);
  const auto heads = per_layer(file, p + "attention.head_count", n_layers, std::nullopt);
  const auto kv_heads = per_layer(file, p + "attention.head_count_kv", n_layers, std::nullopt);
  const uint64_t embedding = file.get_u64(p + "embedding_length");
  m.n_heads = to_int(heads.front(), file, p + "attention.head_count");

  if (file.find(p + "attention.kv_lora_rank") != nullptr) {
    // MLA caches the compressed latent and the shared rope key once per token, not K and V.
    const uint64_t latent =
        file.get_u64(p + "attention.kv_lora_rank") + file.get_u64(p + "rope.dimension_count");
    m.attention = kv::AttentionGeometry::mla(static_cast<int>(n_layers),
                                             to_int(latent, file, p + "attention.kv_lora_rank"));
  } else {
    const std::vector<bool> windowed = gguf_window_layers(file, arch, n_layers);
    const uint64_t window = file.get_u64(p + "attention.sliding_window", 0);
    for (size_t i = 0; i < n_layers; ++i) {
      kv::AttentionLayer layer;
      if (heads[i] > 0 && kv_heads[i] > 0) {
        const uint64_t fallback = embedding / heads[i];
        layer.kv_heads = to_int(kv_heads[i], file, p + "attention.head_count_kv");
        layer.k_head_dim = to_int(file.get_u64(p + "attention.key_length", fallback), file,
                                  p + "attention.key_length");
        layer.v_head_dim = to_int(file.get_u64(p + "attention.value_length", fallback), file,
                                  p + "attention.value_length");
        layer.window = windowed[i] ? window : 0;
      }
      m.attention.layers.push_back(layer);
    }
  }
  for (const auto& t : file.tensors()) {
    m.weights_bytes += t.bytes;
    m.parameters += t.elements();
  }
  return m;
}

ModelGeometry geometry_from_gguf_file(const std::string& path) {
  return geometry_from_gguf(*gguf::File::open(path));
}

ModelGeometry geometry_from_config(const json& config, const std::string& label,
                                   std::optional<DType> weights_dtype) {
  const ConfigReader in = text_reader(config, label);
  ModelGeometry m;
  m.source = "config.json";
  m.name = label;
  m.architecture = in.optional_string("model_type");
  const int n_layers = in.positive("num_hidden_layers");
  m.n_heads = in.positive("num_attention_heads");
  const int hidden = in.positive("hidden_size");
  if (in.has("kv_lora_rank")) {
    m.attention = kv::AttentionGeometry::mla(
        n_layers, in.positive("kv_lora_rank") + in.positive("qk_rope_head_dim"));
  } else {
    const int kv_heads = in.optional_positive("num_key_value_heads").value_or(m.n_heads);
    m.attention =
        kv::AttentionGeometry::uniform(n_layers, kv_heads, config_head_dim(in, hidden, m.n_heads));
    const auto windows = config_windows(in, n_layers);
    for (size_t i = 0; i < windows.size(); ++i) m.attention.layers[i].window = windows[i];
  }
  m.parameters = estimate_parameters(config, label);
  m.weights_dtype = weights_dtype ? weights_dtype : config_weights_dtype(in);
  if (!m.weights_dtype) m.weights_dtype = DType::BF16;
  m.weights_bytes = weights_at(m.parameters, *m.weights_dtype);
  return m;
}

ModelGeometry geometry_from_config_file(const std::string& path,
                                        std::optional<DType> weights_dtype) {
  std::ifstream file(path);
  if (!file) fail("cannot open config '{}'", path);
  std::stringstream text;
  text << file.rdbuf();
  json config;
  try {
    config = json::parse(text.str());
  } catch (const json::parse_error& e) {
    fail("{}: not valid JSON: {}", path, e.what());
  }
  return geometry_from_config(config, path, weights_dtype);
}

uint64_t estimate_parameters(const json& config, const std::string& label) {
  const ConfigReader in = text_reader(config, label);
  const uint64_t layers = static_cast<uint64_t>(in.positive("num_hidden_layers"));
  const uint64_t heads = static_cast<uint64_t>(in.positive("num_attention_heads"));
  const uint64_t hidden = static_cast<uint64_t>(in.positive("hidden_size"));
  const uint64_t vocab = static_cast<uint64_t>(in.positive("vocab_size"));
  const uint64_t intermediate = static_cast<uint64_t>(in.positive("intermediate_size"));
  const std::string type = in.optional_string("model_type");

  uint64_t attention = 0;
  if (in.has("kv_lora_rank")) {
    const uint64_t kv_rank = static_cast<uint64_t>(in.positive("kv_lora_rank"));
    const uint64_t rope = static_cast<uint64_t>(in.positive("qk_rope_head_dim"));
    const uint64_t nope = static_cast<uint64_t>(in.positive("qk_nope_head_dim"));
    const uint64_t v_dim = static_cast<uint64_t>(in.positive("v_head_dim"));
    const uint64_t q_head = nope + rope;
    if (const auto q_rank = in.optional_positive("q_lora_rank")) {
      const auto r = static_cast<uint64_t>(*q_rank);
      attention += hidden * r + r + r * heads * q_head;  // q_a, its norm, q_b
    } else {
      attention += hidden * heads * q_head;
    }
    attention += hidden * (kv_rank + rope) + kv_rank;  // kv_a with the rope key, its norm
    attention += kv_rank * heads * (nope + v_dim);     // kv_b
    attention += heads * v_dim * hidden;               // o
  } else {
    const uint64_t kv_heads =
        static_cast<uint64_t>(in.optional_positive("num_key_value_heads").value_or(heads));
    const uint64_t head_dim = static_cast<uint64_t>(
        config_head_dim(in, static_cast<int>(hidden), static_cast<int>(heads)));
    attention = 2 * hidden * heads * head_dim + 2 * hidden * kv_heads * head_dim;
    // Qwen2 always has q/k/v biases; other families say so with attention_bias.
    if (type == "qwen2" || in.optional_bool("attention_bias").value_or(false)) {
      attention += (heads + 2 * kv_heads) * head_dim;
    }
  }

  const uint64_t dense_mlp = 3 * hidden * intermediate;
  uint64_t mlp = layers * dense_mlp;
  if (const auto routed = in.optional_positive("n_routed_experts")) {
    // DeepSeek MoE: the first first_k_dense_replace layers are dense.
    const uint64_t experts = static_cast<uint64_t>(*routed);
    const uint64_t expert =
        3 * hidden * static_cast<uint64_t>(in.positive("moe_intermediate_size"));
    const uint64_t shared = static_cast<uint64_t>(in.optional_int("n_shared_experts").value_or(0));
    const uint64_t dense = static_cast<uint64_t>(std::clamp<int64_t>(
        in.optional_int("first_k_dense_replace").value_or(0), 0, static_cast<int64_t>(layers)));
    uint64_t moe_layer = (experts + shared) * expert + hidden * experts;  // experts and router
    if (in.optional_string("topk_method") == "noaux_tc") moe_layer += experts;  // router bias
    mlp = dense * dense_mlp + (layers - dense) * moe_layer;
  } else if (const auto local = in.optional_positive("num_local_experts")) {
    // Mixtral: every layer's experts are intermediate_size wide.
    mlp = layers * static_cast<uint64_t>(*local) * (dense_mlp + hidden);
  } else if (const auto experts = in.optional_positive("num_experts");
             experts && in.has("moe_intermediate_size")) {
    // Qwen MoE: routed experts plus an optional gated shared expert.
    const uint64_t n = static_cast<uint64_t>(*experts);
    uint64_t layer =
        n * 3 * hidden * static_cast<uint64_t>(in.positive("moe_intermediate_size")) + hidden * n;
    if (const auto shared = in.optional_positive("shared_expert_intermediate_size")) {
      layer += 3 * hidden * static_cast<uint64_t>(*shared) + hidden;
    }
    mlp = layers * layer;
  }

  const bool tied = in.optional_bool("tie_word_embeddings").value_or(false);
  const uint64_t embeddings = vocab * hidden * (tied ? 1 : 2);
  const uint64_t norms = layers * 2 * hidden + hidden;
  return embeddings + layers * attention + mlp + norms;
}

ModelGeometry geometry_from_preset(std::string_view name, std::optional<DType> weights_dtype) {
  for (const Preset& preset : kPresets) {
    if (name != preset.name) continue;
    ModelGeometry m =
        geometry_from_config(json::parse(preset.config), std::string(preset.name), weights_dtype);
    m.source = "preset";
    m.parameters = preset.parameters;
    m.weights_bytes = weights_at(m.parameters, *m.weights_dtype);
    return m;
  }
  fail("unknown preset '{}'; valid presets: {}", name, fmt::join(preset_names(), ", "));
}

std::vector<std::string> preset_names() {
  std::vector<std::string> names;
  for (const Preset& preset : kPresets) names.emplace_back(preset.name);
  return names;
}

}  // namespace kvc::model
