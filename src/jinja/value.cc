#include "jinja/value.h"

#include <fmt/format.h>

#include <charconv>
#include <cmath>

#include "jinja/error.h"

namespace kvc::jinja {

const Value* Dict::find(std::string_view key) const {
  const auto it = index.find(std::string(key));
  return it == index.end() ? nullptr : &items[it->second].second;
}

void Dict::set(const std::string& key, Value v) {
  const auto it = index.find(key);
  if (it != index.end()) {
    items[it->second].second = std::move(v);
    return;
  }
  index.emplace(key, items.size());
  items.emplace_back(key, std::move(v));
}

uint32_t Value::depth() const {
  switch (kind()) {
    case Kind::kList:
      return list().depth;
    case Kind::kDict:
      return dict().depth;
    default:
      return 0;
  }
}

Value Value::list(std::vector<Value> items, bool tuple) {
  auto l = std::make_shared<List>();
  uint32_t d = 0;
  for (const Value& v : items) d = std::max(d, v.depth());
  if (d + 1 > kMaxValueDepth) {
    throw LimitError(fmt::format("lists and dicts nest more than {} deep", kMaxValueDepth));
  }
  l->items = std::move(items);
  l->tuple = tuple;
  l->depth = d + 1;
  return Value(ListPtr(std::move(l)));
}

Value Value::dict(Dict d) {
  uint32_t depth = 0;
  for (const auto& [k, v] : d.items) depth = std::max(depth, v.depth());
  if (depth + 1 > kMaxValueDepth) {
    throw LimitError(fmt::format("lists and dicts nest more than {} deep", kMaxValueDepth));
  }
  d.depth = depth + 1;
  return Value(DictPtr(std::make_shared<Dict>(std::move(d))));
}

Value Value::callable(std::string name, std::function<Value(Interpreter&, Args&)> fn) {
  return Value(CallablePtr(std::make_shared<Callable>(Callable{std::move(name), std::move(fn)})));
}

namespace {

template <typename Json>
Value from_json_impl(const Json& j, uint32_t depth) {
  if (depth > kMaxValueDepth) {
    throw LimitError(fmt::format("JSON input nests more than {} deep", kMaxValueDepth));
  }
  switch (j.type()) {
    case nlohmann::json::value_t::null:
    case nlohmann::json::value_t::discarded:
      return Value::none();
    case nlohmann::json::value_t::boolean:
      return Value(j.template get<bool>());
    case nlohmann::json::value_t::number_integer:
      return Value(j.template get<int64_t>());
    case nlohmann::json::value_t::number_unsigned: {
      const uint64_t u = j.template get<uint64_t>();
      if (u > static_cast<uint64_t>(INT64_MAX)) return Value(static_cast<double>(u));
      return Value(static_cast<int64_t>(u));
    }
    case nlohmann::json::value_t::number_float:
      return Value(j.template get<double>());
    case nlohmann::json::value_t::string:
      return Value(j.template get<std::string>());
    case nlohmann::json::value_t::array: {
      std::vector<Value> items;
      items.reserve(j.size());
      for (const auto& e : j) items.push_back(from_json_impl(e, depth + 1));
      return Value::list(std::move(items));
    }
    case nlohmann::json::value_t::object: {
      Dict d;
      for (auto it = j.begin(); it != j.end(); ++it) {
        d.set(it.key(), from_json_impl(it.value(), depth + 1));
      }
      return Value::dict(std::move(d));
    }
    case nlohmann::json::value_t::binary:
      break;
  }
  throw RenderError("binary JSON values cannot be template values");
}

}  // namespace

Value Value::from_json(const nlohmann::json& j) {
  return from_json_impl(j, 0);
}
Value Value::from_json(const nlohmann::ordered_json& j) {
  return from_json_impl(j, 0);
}

double Value::to_double() const {
  switch (kind()) {
    case Kind::kBool:
      return as_bool() ? 1 : 0;
    case Kind::kInt:
      return static_cast<double>(as_int());
    case Kind::kFloat:
      return as_float();
    default:
      throw RenderError(fmt::format("expected a number, got {}", type_name()));
  }
}

bool Value::truthy() const {
  switch (kind()) {
    case Kind::kUndefined:
    case Kind::kNone:
      return false;
    case Kind::kBool:
      return as_bool();
    case Kind::kInt:
      return as_int() != 0;
    case Kind::kFloat:
      return as_float() != 0;
    case Kind::kString:
      return !str().empty();
    case Kind::kList:
      return !list().items.empty();
    case Kind::kDict:
      return !dict().items.empty();
    case Kind::kNamespace:
    case Kind::kCallable:
      return true;
  }
  return false;
}

std::string python_float_repr(double d) {
  if (std::isnan(d)) return "nan";
  if (std::isinf(d)) return d < 0 ? "-inf" : "inf";
  char buf[64];
  const auto r = std::to_chars(buf, buf + sizeof buf, d, std::chars_format::scientific);
  std::string s(buf, r.ptr);  // e.g. "-1.2345e+02", shortest round-trip digits
  std::string sign;
  if (s[0] == '-') {
    sign = "-";
    s.erase(0, 1);
  }
  const size_t e = s.find('e');
  std::string digits = s.substr(0, e);
  const int exp = std::stoi(s.substr(e + 1));
  digits.erase(std::remove(digits.begin(), digits.end(), '.'), digits.end());
  while (digits.size() > 1 && digits.back() == '0') digits.pop_back();
  if (exp < -4 || exp >= 16) {
    std::string out = sign + digits.substr(0, 1);
    if (digits.size() > 1) out += "." + digits.substr(1);
    return out + fmt::format("e{}{:02d}", exp < 0 ? '-' : '+', std::abs(exp));
  }
  std::string out;
  if (exp < 0) {
    out = "0." + std::string(static_cast<size_t>(-exp - 1), '0') + digits;
  } else {
    const size_t int_digits = static_cast<size_t>(exp) + 1;
    if (digits.size() <= int_digits) {
      out = digits + std::string(int_digits - digits.size(), '0') + ".0";
    } else {
      out = digits.substr(0, int_digits) + "." + digits.substr(int_digits);
    }
  }
  return sign + out;
}

std::string python_string_repr(std::string_view s) {
  const bool has_single = s.find('\'') != std::string_view::npos;
  const bool has_double = s.find('"') != std::string_view::npos;
  const char quote = has_single && !has_double ? '"' : '\'';
  std::string out(1, quote);
  for (const char ch : s) {
    const auto c = static_cast<unsigned char>(ch);
    if (ch == quote || ch == '\\') {
      out += '\\';
      out += ch;
    } else if (ch == '\n') {
      out += "\\n";
    } else if (ch == '\r') {
      out += "\\r";
    } else if (ch == '\t') {
      out += "\\t";
    } else if (c < 0x20 || c == 0x7f) {
      out += fmt::format("\\x{:02x}", c);
    } else {
      out += ch;
    }
  }
  out += quote;
  return out;
}

void append_json_string(std::string& out, std::string_view s) {
  out += '"';
  for (const char ch : s) {
    const auto c = static_cast<unsigned char>(ch);
    switch (ch) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\r':
        out += "\\r";
        break;
      case '\t':
        out += "\\t";
        break;
      case '\b':
        out += "\\b";
        break;
      case '\f':
        out += "\\f";
        break;
      default:
        if (c < 0x20) {
          out += fmt::format("\\u{:04x}", c);
        } else {
          out += ch;
        }
    }
  }
  out += '"';
}

namespace {

std::string int_str(int64_t i) {
  return std::to_string(i);
}

void repr_into(const Value& v, std::string& out) {
  switch (v.kind()) {
    case Value::Kind::kString:
      out += python_string_repr(v.str());
      return;
    case Value::Kind::kList: {
      const List& l = v.list();
      out += l.tuple ? '(' : '[';
      for (size_t i = 0; i < l.items.size(); ++i) {
        if (i) out += ", ";
        repr_into(l.items[i], out);
      }
      if (l.tuple && l.items.size() == 1) out += ',';
      out += l.tuple ? ')' : ']';
      return;
    }
    case Value::Kind::kDict: {
      out += '{';
      bool first = true;
      for (const auto& [k, val] : v.dict().items) {
        if (!first) out += ", ";
        first = false;
        out += python_string_repr(k);
        out += ": ";
        repr_into(val, out);
      }
      out += '}';
      return;
    }
    case Value::Kind::kUndefined:
      out += "Undefined";
      return;
    case Value::Kind::kNamespace:
      out += "<Namespace>";  // never recurses: a namespace may hold itself
      return;
    default:
      out += v.to_str();
  }
}

void json_into(const Value& v, std::string& out, int indent, int level) {
  const auto newline = [&](int lvl) {
    out += '\n';
    out.append(static_cast<size_t>(indent) * static_cast<size_t>(lvl), ' ');
  };
  switch (v.kind()) {
    case Value::Kind::kNone:
      out += "null";
      return;
    case Value::Kind::kBool:
      out += v.as_bool() ? "true" : "false";
      return;
    case Value::Kind::kInt:
      out += int_str(v.as_int());
      return;
    case Value::Kind::kFloat: {
      const double d = v.as_float();
      if (std::isnan(d)) {
        out += "NaN";
      } else if (std::isinf(d)) {
        out += d < 0 ? "-Infinity" : "Infinity";
      } else {
        out += python_float_repr(d);
      }
      return;
    }
    case Value::Kind::kString:
      append_json_string(out, v.str());
      return;
    case Value::Kind::kList: {
      const auto& items = v.list().items;
      if (items.empty()) {
        out += "[]";
        return;
      }
      out += '[';
      for (size_t i = 0; i < items.size(); ++i) {
        if (i) out += indent >= 0 ? "," : ", ";
        if (indent >= 0) newline(level + 1);
        json_into(items[i], out, indent, level + 1);
      }
      if (indent >= 0) newline(level);
      out += ']';
      return;
    }
    case Value::Kind::kDict: {
      const auto& items = v.dict().items;
      if (items.empty()) {
        out += "{}";
        return;
      }
      out += '{';
      bool first = true;
      for (const auto& [k, val] : items) {
        if (!first) out += indent >= 0 ? "," : ", ";
        first = false;
        if (indent >= 0) newline(level + 1);
        append_json_string(out, k);
        out += ": ";
        json_into(val, out, indent, level + 1);
      }
      if (indent >= 0) newline(level);
      out += '}';
      return;
    }
    case Value::Kind::kUndefined:
      throw RenderError("tojson: Object of type Undefined is not JSON serializable (" +
                        v.undefined_hint() + ")");
    case Value::Kind::kNamespace:
    case Value::Kind::kCallable:
      throw RenderError("tojson: Object of type " + v.type_name() + " is not JSON serializable");
  }
}

}  // namespace

std::string Value::to_str() const {
  switch (kind()) {
    case Kind::kUndefined:
      return {};
    case Kind::kNone:
      return "None";
    case Kind::kBool:
      return as_bool() ? "True" : "False";
    case Kind::kInt:
      return int_str(as_int());
    case Kind::kFloat:
      return python_float_repr(as_float());
    case Kind::kString:
      return str();
    case Kind::kList:
    case Kind::kDict:
      return repr();
    case Kind::kNamespace: {
      std::string out = "<Namespace {";
      bool first = true;
      for (const auto& [k, v] : ns().items) {
        if (!first) out += ", ";
        first = false;
        out += python_string_repr(k) + ": " + v.repr();
      }
      return out + "}>";
    }
    case Kind::kCallable:
      return "<function " + callable().name + ">";
  }
  return {};
}

std::string Value::repr() const {
  std::string out;
  repr_into(*this, out);
  return out;
}

std::string Value::to_json(int indent) const {
  std::string out;
  json_into(*this, out, indent, 0);
  return out;
}

std::string Value::type_name() const {
  switch (kind()) {
    case Kind::kUndefined:
      return "undefined";
    case Kind::kNone:
      return "none";
    case Kind::kBool:
      return "bool";
    case Kind::kInt:
      return "int";
    case Kind::kFloat:
      return "float";
    case Kind::kString:
      return "string";
    case Kind::kList:
      return list().tuple ? "tuple" : "list";
    case Kind::kDict:
      return "dict";
    case Kind::kNamespace:
      return "namespace";
    case Kind::kCallable:
      return "function";
  }
  return "?";
}

bool operator==(const Value& a, const Value& b) {
  using K = Value::Kind;
  if (a.is_number() && b.is_number()) {
    if (a.is_float() || b.is_float()) return a.to_double() == b.to_double();
    const int64_t x = a.is_bool() ? a.as_bool() : a.as_int();
    const int64_t y = b.is_bool() ? b.as_bool() : b.as_int();
    return x == y;
  }
  if (a.kind() != b.kind()) return false;
  switch (a.kind()) {
    case K::kUndefined:
    case K::kNone:
      return true;
    case K::kString:
      return a.str() == b.str();
    case K::kList: {
      const auto& x = a.list().items;
      const auto& y = b.list().items;
      if (x.size() != y.size()) return false;
      for (size_t i = 0; i < x.size(); ++i) {
        if (!(x[i] == y[i])) return false;
      }
      return true;
    }
    case K::kDict: {
      const auto& x = a.dict();
      const auto& y = b.dict();
      if (x.items.size() != y.items.size()) return false;
      for (const auto& [k, v] : x.items) {
        const Value* o = y.find(k);
        if (!o || !(v == *o)) return false;
      }
      return true;
    }
    case K::kNamespace:
      return &a.ns() == &b.ns();
    case K::kCallable:
      return &a.callable() == &b.callable();
    default:
      return false;
  }
}

int compare(const Value& a, const Value& b) {
  if (a.is_number() && b.is_number()) {
    if (a.is_int() && b.is_int()) return a.as_int() < b.as_int() ? -1 : a.as_int() > b.as_int();
    const double x = a.to_double(), y = b.to_double();
    return x < y ? -1 : (x > y ? 1 : 0);
  }
  if (a.is_string() && b.is_string()) {
    const int c = a.str().compare(b.str());
    return c < 0 ? -1 : (c > 0 ? 1 : 0);
  }
  if (a.is_list() && b.is_list()) {
    const auto& x = a.list().items;
    const auto& y = b.list().items;
    for (size_t i = 0; i < x.size() && i < y.size(); ++i) {
      if (!(x[i] == y[i])) return compare(x[i], y[i]);
    }
    return x.size() < y.size() ? -1 : (x.size() > y.size() ? 1 : 0);
  }
  if (a.is_undefined() || b.is_undefined()) {
    throw RenderError((a.is_undefined() ? a : b).undefined_hint());
  }
  throw RenderError(fmt::format("'<' not supported between instances of '{}' and '{}'",
                                a.type_name(), b.type_name()));
}

size_t utf8_length(std::string_view s) {
  size_t n = 0;
  for (size_t i = 0; i < s.size(); ++i) {
    n += i == 0 || (static_cast<unsigned char>(s[i]) & 0xC0) != 0x80;
  }
  return n;
}

std::vector<size_t> utf8_offsets(std::string_view s) {
  std::vector<size_t> out;
  out.reserve(s.size() + 1);
  for (size_t i = 0; i < s.size(); ++i) {
    if (i == 0 || (static_cast<unsigned char>(s[i]) & 0xC0) != 0x80) out.push_back(i);
  }
  out.push_back(s.size());
  return out;
}

}  // namespace kvc::jinja
