// `kvcache inspect`: what a GGUF file holds and what its KV cache costs.
#include <cstdio>
#include <map>
#include <optional>

#include <fmt/format.h>

#include "base/byte_size.h"
#include "base/error.h"
#include "cli/commands.h"
#include "kv/memory_plan.h"
#include "model/gguf.h"
#include "model/llama_config.h"
#include "model/model_geometry.h"
#include "model/tokenizer.h"

namespace kvc::cli {

namespace {

std::string shape(const std::vector<uint64_t>& dims) {
  std::string s;
  for (uint64_t d : dims) s += (s.empty() ? "" : " x ") + std::to_string(d);
  return s;
}

void print_tokenizer(const gguf::File& file) {
  if (file.find("tokenizer.ggml.model") == nullptr) {
    std::printf("\ntokenizer: none (no tokenizer.ggml.model)\n");
    return;
  }
  const auto tokenizer = model::Tokenizer::from_gguf(file);
  const model::Vocabulary& v = tokenizer.vocabulary();
  std::printf("\ntokenizer: %s, %d tokens, bos %d, eos %d, add bos %s\n",
              std::string(model::tokenizer_model_name(tokenizer.model())).c_str(), tokenizer.size(),
              tokenizer.bos_id(), tokenizer.eos_id(), tokenizer.add_bos() ? "yes" : "no");
  if (tokenizer.model() == model::TokenizerModel::kBpe) {
    std::printf("  byte-level BPE, pre-tokenizer %s, %zu merges\n",
                std::string(tokenizer.pre()).c_str(), v.merges.size());
  } else {
    std::printf("  SentencePiece\n");
  }
  auto special = [&](const char* name, int32_t id) {
    if (id < 0) {
      std::printf("  %-14s none\n", name);
    } else {
      std::printf("  %-14s %d '%s'\n", name, id, tokenizer.token_text(id).c_str());
    }
  };
  special("bos", tokenizer.bos_id());
  special("eos", tokenizer.eos_id());
  special("eot", tokenizer.eot_id());
  special("eom", tokenizer.eom_id());
  special("unknown", tokenizer.unk_id());
  special("padding", tokenizer.pad_id());
  std::string eog;
  for (int32_t id : tokenizer.eog_ids()) {
    eog += fmt::format("{}{} '{}'", eog.empty() ? "" : ", ", id, tokenizer.token_text(id));
  }
  std::printf("  %-14s %s\n", "end of gen", eog.empty() ? "none" : eog.c_str());
  std::printf("  add bos %s, add eos %s, add space prefix %s\n", tokenizer.add_bos() ? "yes" : "no",
              tokenizer.add_eos() ? "yes" : "no", tokenizer.add_space_prefix() ? "yes" : "no");
  std::map<int, int> types;
  for (auto t : v.types) ++types[static_cast<int>(t)];
  for (const auto& [type, count] : types) {
    std::printf("  %-14s %d\n",
                std::string(model::token_type_name(static_cast<model::TokenType>(type))).c_str(),
                count);
  }
}

void inspect(const std::string& path, bool all_tensors) {
  const auto file = gguf::File::open(path);
  std::printf("file: %s\n", path.c_str());
  std::printf(
      "gguf: version %u, %zu metadata keys, %zu tensors, alignment %lu, data at offset "
      "%lu, %s\n",
      file->version(), file->metadata().size(), file->tensors().size(),
      static_cast<unsigned long>(file->alignment()),
      static_cast<unsigned long>(file->data_offset()), format_bytes(file->file_size()).c_str());

  std::printf("\nmetadata:\n");
  for (const auto& [key, value] : file->metadata()) {
    std::printf("  %-44s %s\n", key.c_str(), value.describe().c_str());
  }

  std::map<std::string, std::pair<int, uint64_t>> by_type;
  uint64_t total = 0;
  for (const auto& t : file->tensors()) {
    auto& e = by_type[std::string(dtype_name(t.dtype))];
    ++e.first;
    e.second += t.bytes;
    total += t.bytes;
  }
  std::printf("\ntensors: %zu, %s\n", file->tensors().size(), format_bytes(total).c_str());
  for (const auto& [type, e] : by_type) {
    std::printf("  %-6s %4d tensors  %s\n", type.c_str(), e.first, format_bytes(e.second).c_str());
  }
  size_t shown = 0;
  for (const auto& t : file->tensors()) {
    if (!all_tensors && shown == 12) {
      std::printf("  ... %zu more (--tensors lists all)\n", file->tensors().size() - shown);
      break;
    }
    std::printf("  %-28s %-6s %-16s %s\n", t.name.c_str(), std::string(dtype_name(t.dtype)).c_str(),
                shape(t.dims).c_str(), format_bytes(t.bytes).c_str());
    ++shown;
  }

  print_tokenizer(*file);

  // A vocabulary-only file (llama.cpp's ggml-vocab-*.gguf) has no model to describe, whatever
  // its architecture.
  if (model::is_vocabulary_only(*file)) {
    std::printf(
        "\nmodel: none (vocabulary only: no tensors; `kvcache serve` serves it in the "
        "tokenizer-only mode)\n");
    return;
  }
  std::optional<model::LlamaConfig> config;
  try {
    config = model::LlamaConfig::from_gguf(*file);
  } catch (const Error& e) {
    std::printf("\nmodel: none (%s)\n", e.what());
    return;
  }
  std::printf("\narchitecture: %s \"%s\"\n", config->architecture.c_str(), config->name.c_str());
  std::printf("  layers %d, embedding %d, feed-forward %d, vocab %d, context %d\n",
              config->n_layers, config->n_embd, config->n_ff, config->n_vocab,
              config->context_length);
  std::printf(
      "  attention: %d heads, %d KV heads (%s), head dim %d, rope dims %d, rope theta "
      "%g, rms eps %g\n",
      config->n_heads, config->n_kv_heads,
      config->n_kv_heads == config->n_heads ? "MHA"
      : config->n_kv_heads == 1             ? "MQA"
                                            : "GQA",
      config->head_dim, config->n_rot, config->rope_theta, config->rms_eps);
  std::printf("  output: %s\n",
              file->find_tensor("output.weight") ? "separate matrix" : "tied to the embedding");

  std::printf("\nKV cache per token (all %d layers, K and V):\n", config->n_layers);
  for (DType t : {DType::F32, DType::F16, DType::Q8_0, DType::Q4_0}) {
    const kv::KvGeometry g{
        config->n_layers, config->n_kv_heads, config->head_dim, kv::block_tokens_for(t, 0), t, t};
    try {
      g.validate();
    } catch (const Error&) {
      std::printf("  %-5s n/a (no 32-value group fits %d KV heads of %d values)\n",
                  std::string(dtype_name(t)).c_str(), config->n_kv_heads, config->head_dim);
      continue;
    }
    // Windowed layers keep at most their window's tokens (what `kvcache plan` costs).
    uint64_t full_context = g.bytes_per_token() * static_cast<uint64_t>(config->context_length);
    if (config->sliding_window > 0) {
      kv::PlanOptions po;
      po.k_dtype = po.v_dtype = t;
      po.block_tokens = g.block_tokens;
      po.contexts = {static_cast<uint64_t>(config->context_length)};
      full_context = kv::plan_memory(model::geometry_from_gguf(*file).attention, po)
                         .requests.front()
                         .exact_bytes;
    }
    std::printf("  %-5s %8zu B/token  %s at the full context of %d tokens%s\n",
                std::string(dtype_name(t)).c_str(), g.bytes_per_token(),
                format_bytes(full_context).c_str(), config->context_length,
                config->sliding_window > 0 ? " (windowed layers: their window)" : "");
  }
}

}  // namespace

void add_inspect_command(CLI::App& app) {
  auto path = std::make_shared<std::string>();
  auto all = std::make_shared<bool>(false);
  CLI::App* cmd = app.add_subcommand("inspect",
                                     "Show a GGUF model's metadata, shapes, tensor "
                                     "types, tokenizer and KV bytes per token");
  cmd->add_option("model", *path, "GGUF model file")->required();
  cmd->add_flag("--tensors", *all, "List every tensor");
  cmd->callback([path, all] { inspect(*path, *all); });
}

}  // namespace kvc::cli
