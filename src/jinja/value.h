// Values of the Jinja interpreter: undefined, none, bool, int, float, string, list (and tuple),
// dict (string keys, insertion-ordered), namespace and callable, with Python's semantics for
// truth, equality, ordering, str() and repr(), and json.dumps as Hugging Face's tojson does it.
//
// Lists and dicts are immutable once built and shared by pointer, as in Hugging Face's
// ImmutableSandboxedEnvironment; a namespace is the one mutable container. Values are not
// thread-safe to share across threads while a namespace in them is being written.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <variant>
#include <vector>

namespace kvc::jinja {

class Value;
class Interpreter;

// Nesting of lists and dicts beyond this is refused when a value is built (destroying and
// printing values recurse).
inline constexpr uint32_t kMaxValueDepth = 200;

struct List {
  std::vector<Value> items;
  bool tuple = false;
  uint32_t depth = 1;
};

struct Dict {
  std::vector<std::pair<std::string, Value>> items;
  std::unordered_map<std::string, size_t> index;
  uint32_t depth = 1;

  const Value* find(std::string_view key) const;
  // Inserts or replaces, keeping the first insertion's position.
  void set(const std::string& key, Value v);
};

// Arguments of a call: positional, then keyword.
struct Args {
  std::vector<Value> positional;
  std::vector<std::pair<std::string, Value>> keyword;
};

struct Callable {
  std::string name;
  std::function<Value(Interpreter&, Args&)> fn;
};

// The undefined value remembers why it is undefined, for error messages.
struct Undefined {
  std::string hint;  // e.g. "'foo' is undefined"
};

class Value {
 public:
  using ListPtr = std::shared_ptr<const List>;
  using DictPtr = std::shared_ptr<const Dict>;
  using NamespacePtr = std::shared_ptr<Dict>;
  using CallablePtr = std::shared_ptr<const Callable>;

  enum class Kind {
    kUndefined,
    kNone,
    kBool,
    kInt,
    kFloat,
    kString,
    kList,
    kDict,
    kNamespace,
    kCallable
  };

  Value() : v_(Undefined{}) {}
  static Value undefined(std::string hint) { return Value(Undefined{std::move(hint)}); }
  static Value none() { return Value(nullptr); }
  Value(bool b) : v_(b) {}  // NOLINT: implicit on purpose
  Value(int64_t i) : v_(i) {}
  Value(int i) : v_(static_cast<int64_t>(i)) {}
  Value(double d) : v_(d) {}
  Value(std::string s) : v_(std::move(s)) {}
  Value(const char* s) : v_(std::string(s)) {}
  Value(std::string_view s) : v_(std::string(s)) {}
  // Throws RenderError when the items nest more than kMaxValueDepth.
  static Value list(std::vector<Value> items, bool tuple = false);
  static Value dict(Dict d);  // recomputes the depth; throws like list()
  static Value ns(NamespacePtr n) { return Value(std::move(n)); }
  static Value callable(std::string name, std::function<Value(Interpreter&, Args&)> fn);
  // From JSON; objects keep their key order (nlohmann::ordered_json keeps it, json sorts it).
  static Value from_json(const nlohmann::json& j);
  static Value from_json(const nlohmann::ordered_json& j);

  Kind kind() const { return static_cast<Kind>(v_.index()); }
  bool is_undefined() const { return kind() == Kind::kUndefined; }
  bool is_none() const { return kind() == Kind::kNone; }
  bool is_bool() const { return kind() == Kind::kBool; }
  bool is_int() const { return kind() == Kind::kInt; }
  bool is_float() const { return kind() == Kind::kFloat; }
  bool is_number() const { return is_int() || is_float() || is_bool(); }
  bool is_string() const { return kind() == Kind::kString; }
  bool is_list() const { return kind() == Kind::kList; }
  bool is_dict() const { return kind() == Kind::kDict; }
  bool is_namespace() const { return kind() == Kind::kNamespace; }
  bool is_callable() const { return kind() == Kind::kCallable; }

  bool as_bool() const { return std::get<bool>(v_); }
  int64_t as_int() const { return std::get<int64_t>(v_); }
  double as_float() const { return std::get<double>(v_); }
  // A number (bool, int or float) as a double.
  double to_double() const;
  const std::string& str() const { return std::get<std::string>(v_); }
  const List& list() const { return *std::get<ListPtr>(v_); }
  const Dict& dict() const { return *std::get<DictPtr>(v_); }
  Dict& ns() const { return *std::get<NamespacePtr>(v_); }
  const Callable& callable() const { return *std::get<CallablePtr>(v_); }
  const std::string& undefined_hint() const { return std::get<Undefined>(v_).hint; }
  uint32_t depth() const;

  // Python's bool().
  bool truthy() const;
  // Python's str() (what {{ }} prints; undefined prints nothing).
  std::string to_str() const;
  // Python's repr() (inside printed lists and dicts).
  std::string repr() const;
  // json.dumps(value, ensure_ascii=False, indent=indent) with Python's separators (", " and
  // ": " without indent, "," and ": " with it); indent < 0: none. Throws RenderError for
  // undefined, namespaces and callables, as json.dumps raises TypeError.
  std::string to_json(int indent = -1) const;
  // "string", "list", ... for messages, as Python names the type.
  std::string type_name() const;

  // Python ==.
  friend bool operator==(const Value& a, const Value& b);

 private:
  explicit Value(Undefined u) : v_(std::move(u)) {}
  explicit Value(std::nullptr_t) : v_(nullptr) {}
  explicit Value(ListPtr l) : v_(std::move(l)) {}
  explicit Value(DictPtr d) : v_(std::move(d)) {}
  explicit Value(NamespacePtr n) : v_(std::move(n)) {}
  explicit Value(CallablePtr c) : v_(std::move(c)) {}

  std::variant<Undefined, std::nullptr_t, bool, int64_t, double, std::string, ListPtr, DictPtr,
               NamespacePtr, CallablePtr>
      v_;
};

// Python's repr() of a float ("1.0", "1e+16", "inf").
std::string python_float_repr(double d);
// Python's repr() of a string ('a', "it's").
std::string python_string_repr(std::string_view s);
// A JSON string literal as json.dumps writes it with ensure_ascii=False.
void append_json_string(std::string& out, std::string_view s);

// Python ordering for <, <=, >, >=: numbers with numbers, strings with strings, lists
// lexicographically; throws RenderError otherwise. Returns <0, 0 or >0.
int compare(const Value& a, const Value& b);

// UTF-8 code points of s, as Python's len() counts them (bytes that are not continuation bytes).
size_t utf8_length(std::string_view s);
// Byte offset of each code point, plus s.size() at the end.
std::vector<size_t> utf8_offsets(std::string_view s);

}  // namespace kvc::jinja
