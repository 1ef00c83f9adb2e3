// Executes a parsed template. One Interpreter renders once, on one thread; it is not
// thread-safe and is not reused.
//
// Resource use is bounded (Limits): a step count (every statement, expression and loop
// iteration), the bytes of every string and list the template makes, the output size, the
// machine stack the recursive walk uses, and the depth of macro calls. Exceeding one throws
// LimitError, so a hostile template cannot hang or exhaust memory.
#pragma once

#include <ctime>
#include <functional>
#include <memory>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "jinja/ast.h"
#include "jinja/value.h"

namespace kvc::jinja {

struct Limits {
  size_t max_steps = 5'000'000;
  size_t max_bytes = 64u << 20;         // strings and list items made while rendering
  size_t max_output_bytes = 16u << 20;  // the rendered text
  size_t max_stack_bytes = 1u << 20;    // machine stack of the recursive walk
  int max_call_depth = 64;              // macro calls inside macro calls
};

class Interpreter {
 public:
  // now: the clock strftime_now reads (default: the system clock).
  Interpreter(const Limits& limits, std::function<std::time_t()> now = {});
  ~Interpreter();
  Interpreter(const Interpreter&) = delete;
  Interpreter& operator=(const Interpreter&) = delete;

  // Runs body with vars as the template's context. Throws the errors in error.h.
  std::string render(const Body& body, const std::vector<std::pair<std::string, Value>>& vars);

  // Counts one step; throws LimitError past max_steps.
  void step();
  // Counts bytes made; throws LimitError past max_bytes.
  void charge(size_t bytes);
  // Calls a callable value; throws RenderError for anything else.
  Value call(const Value& callee, Args& args, const std::string& what);
  std::time_t now() const;
  // Records a namespace made while rendering; their contents are cleared at the end so that
  // namespaces that hold each other are freed.
  Value make_namespace(Dict d);

 private:
  struct Scope {
    std::unordered_map<std::string, Value> vars;
    std::shared_ptr<Scope> parent;
  };
  enum class Flow { kNormal, kBreak, kContinue };
  class ScopeGuard;

  Flow exec(const Body& body, std::string& out);
  Flow exec_stmt(const Stmt& s, std::string& out);
  Flow exec_for(const Stmt& s, std::string& out);
  Value eval(const Expr& e);
  Value eval_binary(const Expr& e);
  Value eval_slice(const Expr& e);
  Args eval_args(const Expr& e, size_t first);
  Value apply_filters(const std::vector<ExprPtr>& filters, Value v);
  Value lookup(const std::string& name) const;
  void assign(const std::vector<std::string>& targets, const Value& v);
  Value make_macro(const Stmt& s);
  Value call_macro(const Stmt& s, const std::weak_ptr<Scope>& closure, Args& args);
  void append(std::string& out, std::string_view text);
  void check_stack();

  Limits limits_;
  std::function<std::time_t()> now_;
  std::unordered_map<std::string, Value> globals_;
  std::shared_ptr<Scope> root_;
  std::shared_ptr<Scope> scope_;
  std::vector<std::shared_ptr<Dict>> namespaces_;
  size_t steps_ = 0;
  size_t bytes_ = 0;
  int call_depth_ = 0;
  const char* stack_base_ = nullptr;
};

}  // namespace kvc::jinja
