#include "jinja/interpreter.h"

#include <fmt/format.h>

#include <cmath>
#include <limits>

#include "jinja/builtins.h"
#include "jinja/error.h"

namespace kvc::jinja {

class Interpreter::ScopeGuard {
 public:
  ScopeGuard(Interpreter& in, std::shared_ptr<Scope> scope) : in_(in), saved_(in.scope_) {
    in_.scope_ = std::move(scope);
  }
  ~ScopeGuard() { in_.scope_ = saved_; }
  ScopeGuard(const ScopeGuard&) = delete;
  ScopeGuard& operator=(const ScopeGuard&) = delete;

 private:
  Interpreter& in_;
  std::shared_ptr<Scope> saved_;
};

Interpreter::Interpreter(const Limits& limits, std::function<std::time_t()> now)
    : limits_(limits), now_(std::move(now)) {
  add_globals(globals_);
}

Interpreter::~Interpreter() {
  // Namespaces may hold each other (or themselves): empty them while all are still alive.
  for (auto& n : namespaces_) {
    n->items.clear();
    n->index.clear();
  }
}

std::time_t Interpreter::now() const {
  return now_ ? now_() : std::time(nullptr);
}

void Interpreter::step() {
  if (++steps_ > limits_.max_steps) {
    throw LimitError(fmt::format("the template ran more than {} steps", limits_.max_steps));
  }
}

void Interpreter::charge(size_t bytes) {
  bytes_ += bytes;
  if (bytes_ > limits_.max_bytes) {
    throw LimitError(
        fmt::format("the template made more than {} bytes of values", limits_.max_bytes));
  }
}

void Interpreter::check_stack() {
  const char* here = static_cast<const char*>(__builtin_frame_address(0));
  if (stack_base_ != nullptr && stack_base_ > here &&
      static_cast<size_t>(stack_base_ - here) > limits_.max_stack_bytes) {
    throw LimitError("the template nests too deeply");
  }
}

Value Interpreter::make_namespace(Dict d) {
  auto n = std::make_shared<Dict>(std::move(d));
  namespaces_.push_back(n);
  charge(64);
  return Value::ns(std::move(n));
}

void Interpreter::append(std::string& out, std::string_view text) {
  if (out.size() + text.size() > limits_.max_output_bytes) {
    throw LimitError(
        fmt::format("the template's output exceeds {} bytes", limits_.max_output_bytes));
  }
  charge(text.size());
  out += text;
}

std::string Interpreter::render(const Body& body,
                                const std::vector<std::pair<std::string, Value>>& vars) {
  stack_base_ = static_cast<const char*>(__builtin_frame_address(0));
  root_ = std::make_shared<Scope>();
  for (const auto& [k, v] : vars) root_->vars[k] = v;
  scope_ = root_;
  std::string out;
  exec(body, out);
  return out;
}

Value Interpreter::lookup(const std::string& name) const {
  for (const Scope* s = scope_.get(); s != nullptr; s = s->parent.get()) {
    const auto it = s->vars.find(name);
    if (it != s->vars.end()) return it->second;
  }
  const auto it = globals_.find(name);
  if (it != globals_.end()) return it->second;
  return Value::undefined("'" + name + "' is undefined");
}

void Interpreter::assign(const std::vector<std::string>& targets, const Value& v) {
  if (targets.size() == 1) {
    scope_->vars[targets[0]] = v;
    return;
  }
  const std::vector<Value> items = iterate(v);
  if (items.size() != targets.size()) {
    throw RenderError(
        fmt::format("cannot unpack {} values into {} names", items.size(), targets.size()));
  }
  for (size_t i = 0; i < targets.size(); ++i) scope_->vars[targets[i]] = items[i];
}

Interpreter::Flow Interpreter::exec(const Body& body, std::string& out) {
  for (const auto& s : body) {
    const Flow f = exec_stmt(*s, out);
    if (f != Flow::kNormal) return f;
  }
  return Flow::kNormal;
}

Value Interpreter::apply_filters(const std::vector<ExprPtr>& filters, Value v) {
  for (const auto& f : filters) {
    Args args = eval_args(*f, 1);
    v = apply_filter(*this, f->name, v, args);
  }
  return v;
}

Interpreter::Flow Interpreter::exec_stmt(const Stmt& s, std::string& out) {
  step();
  check_stack();
  switch (s.kind) {
    case Stmt::Kind::kText:
      append(out, s.text);
      return Flow::kNormal;
    case Stmt::Kind::kOutput:
      append(out, eval(*s.expr).to_str());
      return Flow::kNormal;
    case Stmt::Kind::kIf:
      for (const auto& [cond, body] : s.branches) {
        if (eval(*cond).truthy()) return exec(body, out);
      }
      return exec(s.else_body, out);
    case Stmt::Kind::kFor:
      return exec_for(s, out);
    case Stmt::Kind::kSet: {
      const Value v = eval(*s.expr);
      if (!s.attr.empty()) {
        const Value target = lookup(s.targets[0]);
        if (!target.is_namespace()) {
          throw RenderError(
              fmt::format("cannot assign attribute '{}' on {} '{}' (only on a "
                          "namespace)",
                          s.attr, target.type_name(), s.targets[0]));
        }
        target.ns().set(s.attr, v);
      } else {
        assign(s.targets, v);
      }
      return Flow::kNormal;
    }
    case Stmt::Kind::kSetBlock: {
      std::string text;
      exec(s.body, text);
      scope_->vars[s.targets[0]] = apply_filters(s.filters, Value(std::move(text)));
      return Flow::kNormal;
    }
    case Stmt::Kind::kMacro:
      scope_->vars[s.name] = make_macro(s);
      return Flow::kNormal;
    case Stmt::Kind::kCallBlock: {
      const Expr& call_expr = *s.expr;
      const Value callee = eval(*call_expr.args[0]);
      Args args = eval_args(call_expr, 1);
      const std::weak_ptr<Scope> closure = scope_;
      const Stmt* stmt = &s;
      args.keyword.emplace_back(
          "caller", Value::callable("caller", [this, stmt, closure](Interpreter&, Args& a) {
            return call_macro(*stmt, closure, a);
          }));
      append(out, call(callee, args, "the {% call %} target").to_str());
      return Flow::kNormal;
    }
    case Stmt::Kind::kFilterBlock: {
      std::string text;
      exec(s.body, text);
      append(out, apply_filters(s.filters, Value(std::move(text))).to_str());
      return Flow::kNormal;
    }
    case Stmt::Kind::kBreak:
      return Flow::kBreak;
    case Stmt::Kind::kContinue:
      return Flow::kContinue;
    case Stmt::Kind::kDo:
      eval(*s.expr);
      return Flow::kNormal;
    case Stmt::Kind::kScope: {
      auto scope = std::make_shared<Scope>();
      scope->parent = scope_;
      for (size_t i = 0; i < s.targets.size(); ++i) scope->vars[s.targets[i]] = eval(*s.values[i]);
      ScopeGuard guard(*this, scope);
      return exec(s.body, out);
    }
    case Stmt::Kind::kBody:
      return exec(s.body, out);
    case Stmt::Kind::kUnsupported:
      throw UnsupportedError(s.text);
  }
  return Flow::kNormal;
}

Interpreter::Flow Interpreter::exec_for(const Stmt& s, std::string& out) {
  if (s.recursive) throw UnsupportedError("recursive for loops");
  const Value iterable = eval(*s.expr);
  std::vector<Value> items = iterate(iterable);
  charge(items.size() * sizeof(Value));
  auto scope = std::make_shared<Scope>();
  scope->parent = scope_;
  ScopeGuard guard(*this, scope);
  if (s.cond) {
    std::vector<Value> kept;
    for (auto& item : items) {
      step();
      assign(s.targets, item);
      if (eval(*s.cond).truthy()) kept.push_back(std::move(item));
    }
    items = std::move(kept);
  }
  const int64_t n = static_cast<int64_t>(items.size());
  for (int64_t i = 0; i < n; ++i) {
    step();
    const Value& item = items[static_cast<size_t>(i)];
    assign(s.targets, item);
    Dict loop;
    loop.set("index", Value(i + 1));
    loop.set("index0", Value(i));
    loop.set("revindex", Value(n - i));
    loop.set("revindex0", Value(n - i - 1));
    loop.set("first", Value(i == 0));
    loop.set("last", Value(i == n - 1));
    loop.set("length", Value(n));
    loop.set("depth", Value(1));
    loop.set("depth0", Value(0));
    if (i > 0) loop.set("previtem", items[static_cast<size_t>(i - 1)]);
    if (i + 1 < n) loop.set("nextitem", items[static_cast<size_t>(i + 1)]);
    loop.set("cycle", Value::callable("loop.cycle", [i](Interpreter&, Args& a) {
               if (a.positional.empty())
                 throw RenderError("loop.cycle needs at least one argument");
               return a.positional[static_cast<size_t>(i) % a.positional.size()];
             }));
    scope_->vars["loop"] = Value::dict(std::move(loop));
    charge(256);
    const Flow f = exec(s.body, out);
    if (f == Flow::kBreak) break;
  }
  if (n == 0) {
    ScopeGuard outer(*this, scope->parent);
    return exec(s.else_body, out);
  }
  return Flow::kNormal;
}

Value Interpreter::make_macro(const Stmt& s) {
  const std::weak_ptr<Scope> closure = scope_;
  const Stmt* stmt = &s;
  return Value::callable(s.name, [this, stmt, closure](Interpreter&, Args& a) {
    return call_macro(*stmt, closure, a);
  });
}

Value Interpreter::call_macro(const Stmt& s, const std::weak_ptr<Scope>& closure, Args& args) {
  if (call_depth_ >= limits_.max_call_depth) {
    throw LimitError(fmt::format("macro calls nest more than {} deep", limits_.max_call_depth));
  }
  auto scope = std::make_shared<Scope>();
  std::shared_ptr<Scope> parent = closure.lock();
  scope->parent = parent ? parent : root_;
  ScopeGuard guard(*this, scope);
  const std::string what = s.kind == Stmt::Kind::kMacro ? "macro '" + s.name + "'" : "caller";
  if (args.positional.size() > s.params.size()) {
    std::vector<Value> extra(args.positional.begin() + static_cast<ptrdiff_t>(s.params.size()),
                             args.positional.end());
    scope->vars["varargs"] = Value::list(std::move(extra));
  } else {
    scope->vars["varargs"] = Value::list({});
  }
  Dict extra_kwargs;
  std::vector<bool> given(s.params.size(), false);
  for (size_t i = 0; i < s.params.size() && i < args.positional.size(); ++i) {
    scope->vars[s.params[i].name] = args.positional[i];
    given[i] = true;
  }
  for (auto& [k, v] : args.keyword) {
    bool matched = false;
    for (size_t i = 0; i < s.params.size(); ++i) {
      if (s.params[i].name == k) {
        if (given[i]) throw RenderError(fmt::format("{} got multiple values for '{}'", what, k));
        scope->vars[k] = v;
        given[i] = true;
        matched = true;
      }
    }
    if (!matched) {
      if (k == "caller") {
        scope->vars["caller"] = v;
      } else {
        extra_kwargs.set(k, v);
      }
    }
  }
  scope->vars["kwargs"] = Value::dict(std::move(extra_kwargs));
  for (size_t i = 0; i < s.params.size(); ++i) {
    if (given[i]) continue;
    scope->vars[s.params[i].name] =
        s.params[i].default_value
            ? eval(*s.params[i].default_value)
            : Value::undefined(fmt::format("parameter '{}' was not provided", s.params[i].name));
  }
  ++call_depth_;
  std::string out;
  try {
    exec(s.body, out);
  } catch (...) {
    --call_depth_;
    throw;
  }
  --call_depth_;
  return Value(std::move(out));
}

Value Interpreter::call(const Value& callee, Args& args, const std::string& what) {
  if (callee.is_callable()) return callee.callable().fn(*this, args);
  if (callee.is_undefined()) throw RenderError(callee.undefined_hint());
  throw RenderError(fmt::format("{} is not callable ('{}' object)", what, callee.type_name()));
}

Args Interpreter::eval_args(const Expr& e, size_t first) {
  Args a;
  for (size_t i = first; i < e.args.size(); ++i) a.positional.push_back(eval(*e.args[i]));
  for (const auto& [k, v] : e.kwargs) a.keyword.emplace_back(k, eval(*v));
  return a;
}

namespace {

const Value& need_defined(const Value& v) {
  if (v.is_undefined()) throw RenderError(v.undefined_hint());
  return v;
}

int64_t add_checked(int64_t a, int64_t b) {
  int64_t r = 0;
  if (__builtin_add_overflow(a, b, &r)) throw RenderError("integer overflow");
  return r;
}
int64_t sub_checked(int64_t a, int64_t b) {
  int64_t r = 0;
  if (__builtin_sub_overflow(a, b, &r)) throw RenderError("integer overflow");
  return r;
}
int64_t mul_checked(int64_t a, int64_t b) {
  int64_t r = 0;
  if (__builtin_mul_overflow(a, b, &r)) throw RenderError("integer overflow");
  return r;
}

int64_t floor_div(int64_t a, int64_t b) {
  if (a == std::numeric_limits<int64_t>::min() && b == -1) throw RenderError("integer overflow");
  int64_t q = a / b;
  if ((a % b != 0) && ((a < 0) != (b < 0))) --q;
  return q;
}

int64_t as_integer(const Value& v) {
  return v.is_bool() ? static_cast<int64_t>(v.as_bool()) : v.as_int();
}

std::optional<int64_t> slice_bound(const Value& v) {
  if (v.is_none() || v.is_undefined()) return std::nullopt;
  if (v.is_int() || v.is_bool()) return as_integer(v);
  throw RenderError("slice indices must be integers or None");
}

}  // namespace

Value Interpreter::eval_slice(const Expr& e) {
  const Value obj = eval(*e.args[0]);
  std::optional<int64_t> start, stop, stride;
  if (e.args[1]) start = slice_bound(eval(*e.args[1]));
  if (e.args[2]) stop = slice_bound(eval(*e.args[2]));
  if (e.args[3]) stride = slice_bound(eval(*e.args[3]));
  const int64_t step_by = stride.value_or(1);
  if (step_by == 0) throw RenderError("slice step cannot be zero");
  need_defined(obj);
  std::vector<size_t> offsets;
  int64_t len = 0;
  if (obj.is_string()) {
    offsets = utf8_offsets(obj.str());
    len = static_cast<int64_t>(offsets.size()) - 1;
  } else if (obj.is_list()) {
    len = static_cast<int64_t>(obj.list().items.size());
  } else {
    return Value::undefined(fmt::format("'{}' object cannot be sliced", obj.type_name()));
  }
  const auto adjust = [&](std::optional<int64_t> b, bool is_start) {
    const int64_t lower = step_by > 0 ? 0 : -1;
    const int64_t upper = step_by > 0 ? len : len - 1;
    if (!b) return is_start == (step_by > 0) ? lower : upper;
    int64_t x = *b;
    if (x < 0) {
      x += len;
      if (x < lower) x = lower;
    } else if (x > upper) {
      x = upper;
    }
    return x;
  };
  const int64_t from = adjust(start, true);
  const int64_t to = adjust(stop, false);
  std::vector<int64_t> picks;
  for (int64_t i = from; step_by > 0 ? i < to : i > to; i += step_by) {
    picks.push_back(i);
    step();
  }
  if (obj.is_string()) {
    std::string out;
    const std::string& s = obj.str();
    for (const int64_t i : picks) {
      const auto k = static_cast<size_t>(i);
      out.append(s, offsets[k], offsets[k + 1] - offsets[k]);
    }
    charge(out.size());
    return Value(std::move(out));
  }
  std::vector<Value> out;
  out.reserve(picks.size());
  for (const int64_t i : picks) out.push_back(obj.list().items[static_cast<size_t>(i)]);
  charge(out.size() * sizeof(Value));
  return Value::list(std::move(out), obj.list().tuple);
}

Value Interpreter::eval_binary(const Expr& e) {
  const std::string& op = e.name;
  const Value a = eval(*e.args[0]);
  const Value b = eval(*e.args[1]);
  if (op == "~") {
    std::string s = a.to_str();
    std::string t = b.to_str();
    charge(s.size() + t.size());
    s += t;
    return Value(std::move(s));
  }
  need_defined(a);
  need_defined(b);
  const bool ints = (a.is_int() || a.is_bool()) && (b.is_int() || b.is_bool());
  const bool nums = a.is_number() && b.is_number();
  const auto type_error = [&]() -> Value {
    throw RenderError(fmt::format("unsupported operand type(s) for {}: '{}' and '{}'", op,
                                  a.type_name(), b.type_name()));
  };
  if (op == "+") {
    if (ints) return Value(add_checked(as_integer(a), as_integer(b)));
    if (nums) return Value(a.to_double() + b.to_double());
    if (a.is_string() && b.is_string()) {
      charge(a.str().size() + b.str().size());
      return Value(a.str() + b.str());
    }
    if (a.is_list() && b.is_list()) {
      std::vector<Value> items = a.list().items;
      items.insert(items.end(), b.list().items.begin(), b.list().items.end());
      charge(items.size() * sizeof(Value));
      return Value::list(std::move(items), a.list().tuple);
    }
    return type_error();
  }
  if (op == "-") {
    if (ints) return Value(sub_checked(as_integer(a), as_integer(b)));
    if (nums) return Value(a.to_double() - b.to_double());
    return type_error();
  }
  if (op == "*") {
    if (ints) return Value(mul_checked(as_integer(a), as_integer(b)));
    if (nums) return Value(a.to_double() * b.to_double());
    const Value* seq = (a.is_string() || a.is_list()) ? &a : &b;
    const Value* count = seq == &a ? &b : &a;
    if ((seq->is_string() || seq->is_list()) && (count->is_int() || count->is_bool())) {
      const int64_t n = std::max<int64_t>(0, as_integer(*count));
      const size_t unit =
          seq->is_string() ? seq->str().size() : seq->list().items.size() * sizeof(Value);
      if (unit != 0 && static_cast<size_t>(n) > limits_.max_bytes / unit)
        charge(limits_.max_bytes + 1);
      charge(unit * static_cast<size_t>(n));
      if (seq->is_string()) {
        std::string out;
        for (int64_t i = 0; i < n; ++i) out += seq->str();
        return Value(std::move(out));
      }
      std::vector<Value> items;
      for (int64_t i = 0; i < n; ++i) {
        items.insert(items.end(), seq->list().items.begin(), seq->list().items.end());
      }
      return Value::list(std::move(items), seq->list().tuple);
    }
    return type_error();
  }
  if (op == "/") {
    if (!nums) return type_error();
    if (b.to_double() == 0) throw RenderError("division by zero");
    return Value(a.to_double() / b.to_double());
  }
  if (op == "//") {
    if (!nums) return type_error();
    if (b.to_double() == 0) throw RenderError("integer division or modulo by zero");
    if (ints) return Value(floor_div(as_integer(a), as_integer(b)));
    return Value(std::floor(a.to_double() / b.to_double()));
  }
  if (op == "%") {
    if (a.is_string()) {
      std::string s = percent_format(*this, a.str(), b);
      charge(s.size());
      return Value(std::move(s));
    }
    if (!nums) return type_error();
    if (b.to_double() == 0) throw RenderError("integer division or modulo by zero");
    if (ints) {
      const int64_t x = as_integer(a), y = as_integer(b);
      if (y == -1) return Value(0);
      int64_t r = x % y;
      if (r != 0 && ((r < 0) != (y < 0))) r += y;
      return Value(r);
    }
    const double x = a.to_double(), y = b.to_double();
    double r = std::fmod(x, y);
    if (r != 0 && ((r < 0) != (y < 0))) r += y;
    return Value(r);
  }
  if (op == "**") {
    if (!nums) return type_error();
    if (ints && as_integer(b) >= 0) {
      int64_t base = as_integer(a), exp = as_integer(b), r = 1;
      while (exp > 0) {
        if (exp & 1) r = mul_checked(r, base);
        exp >>= 1;
        if (exp > 0) base = mul_checked(base, base);
      }
      return Value(r);
    }
    return Value(std::pow(a.to_double(), b.to_double()));
  }
  throw RenderError("unknown operator " + op);
}

namespace {

bool compare_op(const std::string& op, const Value& a, const Value& b) {
  if (op == "==") return a == b;
  if (op == "!=") return !(a == b);
  if (op == "in") return contains(b, a);
  if (op == "notin") return !contains(b, a);
  const int c = compare(a, b);
  if (op == "<") return c < 0;
  if (op == "<=") return c <= 0;
  if (op == ">") return c > 0;
  return c >= 0;
}

}  // namespace

Value Interpreter::eval(const Expr& e) {
  step();
  check_stack();
  switch (e.kind) {
    case Expr::Kind::kLiteral:
      return e.literal;
    case Expr::Kind::kName:
      return lookup(e.name);
    case Expr::Kind::kAttr:
      return get_attr(*this, eval(*e.args[0]), e.name);
    case Expr::Kind::kItem: {
      const Value obj = eval(*e.args[0]);
      return get_item(*this, obj, eval(*e.args[1]));
    }
    case Expr::Kind::kSlice:
      return eval_slice(e);
    case Expr::Kind::kCall: {
      const Value callee = eval(*e.args[0]);
      Args args = eval_args(e, 1);
      std::string what = "the called value";
      if (e.args[0]->kind == Expr::Kind::kName || e.args[0]->kind == Expr::Kind::kAttr) {
        what = "'" + e.args[0]->name + "'";
      }
      return call(callee, args, what);
    }
    case Expr::Kind::kFilter: {
      const Value v = eval(*e.args[0]);
      Args args = eval_args(e, 1);
      return apply_filter(*this, e.name, v, args);
    }
    case Expr::Kind::kTest: {
      const Value v = eval(*e.args[0]);
      Args args = eval_args(e, 1);
      return Value(apply_test(*this, e.name, v, args) != e.negated);
    }
    case Expr::Kind::kUnary: {
      const Value v = need_defined(eval(*e.args[0]));
      if (!v.is_number()) {
        throw RenderError(
            fmt::format("bad operand type for unary {}: '{}'", e.name, v.type_name()));
      }
      if (e.name == "+") return v.is_bool() ? Value(as_integer(v)) : v;
      if (v.is_float()) return Value(-v.as_float());
      const int64_t x = as_integer(v);
      if (x == std::numeric_limits<int64_t>::min()) throw RenderError("integer overflow");
      return Value(-x);
    }
    case Expr::Kind::kBinary:
      return eval_binary(e);
    case Expr::Kind::kAnd: {
      Value a = eval(*e.args[0]);
      if (!a.truthy()) return a;
      return eval(*e.args[1]);
    }
    case Expr::Kind::kOr: {
      Value a = eval(*e.args[0]);
      if (a.truthy()) return a;
      return eval(*e.args[1]);
    }
    case Expr::Kind::kNot:
      return Value(!eval(*e.args[0]).truthy());
    case Expr::Kind::kCompare: {
      Value left = eval(*e.args[0]);
      for (size_t i = 0; i < e.ops.size(); ++i) {
        Value right = eval(*e.args[i + 1]);
        if (!compare_op(e.ops[i], left, right)) return Value(false);
        left = std::move(right);
      }
      return Value(true);
    }
    case Expr::Kind::kCond:
      if (eval(*e.args[1]).truthy()) return eval(*e.args[0]);
      if (e.args[2]) return eval(*e.args[2]);
      return Value::undefined(fmt::format(
          "the inline if-expression on line {} evaluated to false and no else section was "
          "defined",
          e.line));
    case Expr::Kind::kList:
    case Expr::Kind::kTuple: {
      std::vector<Value> items;
      items.reserve(e.args.size());
      for (const auto& a : e.args) items.push_back(eval(*a));
      charge(items.size() * sizeof(Value));
      return Value::list(std::move(items), e.kind == Expr::Kind::kTuple);
    }
    case Expr::Kind::kDict: {
      Dict d;
      for (size_t i = 0; i + 1 < e.args.size(); i += 2) {
        const Value k = eval(*e.args[i]);
        if (!k.is_string()) throw UnsupportedError("dict keys that are not strings");
        d.set(k.str(), eval(*e.args[i + 1]));
      }
      charge(d.items.size() * (sizeof(Value) + 32));
      return Value::dict(std::move(d));
    }
  }
  return {};
}

}  // namespace kvc::jinja
