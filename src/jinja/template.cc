#include "jinja/template.h"

#include "jinja/parser.h"

namespace kvc::jinja {

struct Template::Program {
  Body body;
};

Template Template::parse(std::string_view source, const LexOptions& options) {
  auto p = std::make_shared<Program>();
  p->body = jinja::parse(lex(source, options));
  return Template(std::move(p));
}

std::string Template::render(const std::vector<std::pair<std::string, Value>>& context,
                             const RenderOptions& options) const {
  Interpreter in(options.limits, options.now);
  return in.render(program_->body, context);
}

std::string Template::render_json(const nlohmann::ordered_json& context,
                                  const RenderOptions& options) const {
  if (!context.is_object()) throw RenderError("the template context must be a JSON object");
  std::vector<std::pair<std::string, Value>> vars;
  for (auto it = context.begin(); it != context.end(); ++it) {
    vars.emplace_back(it.key(), Value::from_json(it.value()));
  }
  return render(vars, options);
}

}  // namespace kvc::jinja
