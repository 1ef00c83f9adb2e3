// libFuzzer target: any bytes as a Jinja template, parsed and, when it parses, rendered with a
// small conversation under tight limits. Errors must be kvc::Error (syntax, render, raise,
// unsupported, limit); anything else, a crash, a leak or a hang is a bug.
#include <cstddef>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string_view>

#include "jinja/template.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const nlohmann::ordered_json context = nlohmann::ordered_json::parse(R"({
    "messages": [
      {"role": "system", "content": "Be brief."},
      {"role": "user", "content": "Hi \u00e9"},
      {"role": "assistant", "content": null,
       "tool_calls": [{"id": "abc123def", "function": {"name": "f", "arguments": {"x": 1}}}]},
      {"role": "tool", "content": "42", "tool_call_id": "abc123def"},
      {"role": "user", "content": [{"type": "text", "text": "more"}]}
    ],
    "add_generation_prompt": true, "bos_token": "<s>", "eos_token": "</s>",
    "tools": [{"type": "function", "function": {"name": "f", "parameters": {}}}],
    "documents": null
  })");
  kvc::jinja::RenderOptions options;
  options.limits.max_steps = 20000;
  options.limits.max_bytes = 1 << 20;
  options.limits.max_output_bytes = 1 << 16;
  options.limits.max_call_depth = 16;
  options.now = [] { return std::time_t{0}; };
  try {
    const auto t =
        kvc::jinja::Template::parse(std::string_view(reinterpret_cast<const char*>(data), size));
    t.render_json(context, options);
  } catch (const kvc::Error&) {
  }
  return 0;
}
