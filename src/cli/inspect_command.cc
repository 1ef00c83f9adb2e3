// `kvcache inspect`: what a GGUF file holds and what its KV cache costs.
#include <cstdio>
#include <map>

#include "base/byte_size.h"
#include "cli/commands.h"
#include "model/gguf.h"
#include "model/llama_config.h"
#include "model/tokenizer.h"

namespace kvc::cli {

namespace {

std::string shape(const std::vector<uint64_t>& dims) {
  std::string s;
  for (uint64_t d : dims) s += (s.empty() ? "" : " x ") + std::to_string(d);
  return s;
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

  const auto config = model::LlamaConfig::from_gguf(*file);
  std::printf("\narchitecture: %s \"%s\"\n", config.architecture.c_str(), config.name.c_str());
  std::printf("  layers %d, embedding %d, feed-forward %d, vocab %d, context %d\n", config.n_layers,
              config.n_embd, config.n_ff, config.n_vocab, config.context_length);
  std::printf(
      "  attention: %d heads, %d KV heads (%s), head dim %d, rope dims %d, rope theta "
      "%g, rms eps %g\n",
      config.n_heads, config.n_kv_heads,
      config.n_kv_heads == config.n_heads ? "MHA"
      : config.n_kv_heads == 1            ? "MQA"
                                          : "GQA",
      config.head_dim, config.n_rot, config.rope_theta, config.rms_eps);
  std::printf("  output: %s\n",
              file->find_tensor("output.weight") ? "separate matrix" : "tied to the embedding");

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

  const auto tokenizer = model::Tokenizer::from_gguf(*file);
  std::map<int, int> types;
  for (auto t : tokenizer.vocabulary().types) ++types[static_cast<int>(t)];
  std::printf("\ntokenizer: %s, %d tokens, bos %d, eos %d, add bos %s\n",
              file->get_string("tokenizer.ggml.model").c_str(), tokenizer.size(),
              tokenizer.bos_id(), tokenizer.eos_id(), tokenizer.add_bos() ? "yes" : "no");
  static const char* type_names[] = {"undefined",    "normal", "unknown", "control",
                                     "user-defined", "unused", "byte"};
  for (const auto& [type, count] : types) {
    std::printf("  %-12s %d\n", type >= 0 && type < 7 ? type_names[type] : "other", count);
  }

  std::printf("\nKV cache per token (all %d layers, K and V):\n", config.n_layers);
  for (DType t : {DType::F32, DType::F16, DType::Q8_0, DType::Q4_0}) {
    kv::KvGeometry g{config.n_layers, config.n_kv_heads, config.head_dim, 16, t};
    const bool stored = config.head_dim % block_elements(t) == 0;
    if (!stored) {
      std::printf("  %-5s n/a (head dim %d is not a multiple of %d)\n",
                  std::string(dtype_name(t)).c_str(), config.head_dim, block_elements(t));
      continue;
    }
    std::printf("  %-5s %8zu B/token  %s at the full context of %d tokens\n",
                std::string(dtype_name(t)).c_str(), g.bytes_per_token(),
                format_bytes(g.bytes_per_token() * config.context_length).c_str(),
                config.context_length);
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
