#include "jinja/builtins.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <ctime>
#include <initializer_list>

#include "base/strings.h"
#include "jinja/error.h"
#include "jinja/interpreter.h"

namespace kvc::jinja {

namespace {

// Binds a call's arguments to named parameters, as Python does; throws on surplus or unknown.
class Params {
 public:
  Params(std::string what, const Args& a, std::initializer_list<const char*> names)
      : what_(std::move(what)), names_(names), values_(names.size()) {
    if (a.positional.size() > names_.size()) {
      throw RenderError(fmt::format("{} takes at most {} arguments ({} given)", what_,
                                    names_.size(), a.positional.size()));
    }
    for (size_t i = 0; i < a.positional.size(); ++i) values_[i] = a.positional[i];
    for (const auto& kv : a.keyword) {
      const std::string& k = kv.first;
      const auto it =
          std::find_if(names_.begin(), names_.end(), [&k](const char* n) { return k == n; });
      if (it == names_.end()) {
        throw RenderError(fmt::format("{} got an unexpected keyword argument '{}'", what_, k));
      }
      values_[static_cast<size_t>(it - names_.begin())] = kv.second;
    }
  }
  // The argument, or nullptr when it was not given.
  const Value* get(size_t i) const { return values_[i] ? &*values_[i] : nullptr; }
  Value get_or(size_t i, Value def) const { return values_[i] ? *values_[i] : std::move(def); }
  const Value& need(size_t i) const {
    if (!values_[i]) throw RenderError(fmt::format("{} needs argument '{}'", what_, names_[i]));
    return *values_[i];
  }
  int64_t integer(size_t i, int64_t def) const {
    const Value* v = get(i);
    if (!v || v->is_none()) return def;
    if (v->is_int()) return v->as_int();
    if (v->is_bool()) return v->as_bool();
    throw RenderError(fmt::format("{}: '{}' must be an integer", what_, names_[i]));
  }
  std::string string(size_t i, std::string def) const {
    const Value* v = get(i);
    if (!v || v->is_none()) return def;
    if (!v->is_string()) {
      throw RenderError(fmt::format("{}: '{}' must be a string", what_, names_[i]));
    }
    return v->str();
  }
  bool flag(size_t i, bool def) const {
    const Value* v = get(i);
    return v ? v->truthy() : def;
  }

 private:
  std::string what_;
  std::vector<const char*> names_;
  std::vector<std::optional<Value>> values_;
};

const std::string& need_string(const Value& v, const std::string& what) {
  if (v.is_undefined()) throw RenderError(v.undefined_hint());
  if (!v.is_string())
    throw RenderError(fmt::format("{} needs a string, got {}", what, v.type_name()));
  return v.str();
}

// The code point at s[i], and its length in bytes (1 for invalid bytes).
uint32_t decode_at(std::string_view s, size_t i, size_t& len) {
  const auto c = static_cast<unsigned char>(s[i]);
  size_t n = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 1;
  if (i + n > s.size()) n = 1;
  uint32_t cp = n == 1 ? c : (n == 2 ? c & 0x1F : n == 3 ? c & 0x0F : c & 0x07);
  for (size_t k = 1; k < n; ++k) {
    const auto d = static_cast<unsigned char>(s[i + k]);
    if ((d & 0xC0) != 0x80) {
      len = 1;
      return c;
    }
    cp = (cp << 6) | (d & 0x3F);
  }
  len = n;
  return cp;
}

// Python's str.isspace() for one code point.
bool is_py_space(uint32_t c) {
  return (c >= 0x09 && c <= 0x0D) || (c >= 0x1C && c <= 0x20) || c == 0x85 || c == 0xA0 ||
         c == 0x1680 || (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F ||
         c == 0x205F || c == 0x3000;
}

std::vector<std::string_view> code_points(std::string_view s) {
  std::vector<std::string_view> out;
  for (size_t i = 0; i < s.size();) {
    size_t n = 1;
    decode_at(s, i, n);
    out.push_back(s.substr(i, n));
    i += n;
  }
  return out;
}

// str.strip/lstrip/rstrip: chars null strips whitespace.
std::string strip(std::string_view s, const Value* chars, bool left, bool right) {
  const std::vector<std::string_view> cps = code_points(s);
  std::vector<std::string_view> set;
  const bool custom = chars && !chars->is_none();
  if (custom) set = code_points(need_string(*chars, "strip"));
  const auto strip_it = [&](std::string_view cp) {
    if (custom) return std::find(set.begin(), set.end(), cp) != set.end();
    size_t n = 1;
    return is_py_space(decode_at(cp, 0, n));
  };
  size_t b = 0, e = cps.size();
  if (left) {
    while (b < e && strip_it(cps[b])) ++b;
  }
  if (right) {
    while (e > b && strip_it(cps[e - 1])) --e;
  }
  std::string out;
  for (size_t i = b; i < e; ++i) out += cps[i];
  return out;
}

std::string ascii_upper(std::string s) {
  for (char& c : s) {
    if (c >= 'a' && c <= 'z') c = static_cast<char>(c - 32);
  }
  return s;
}
std::string ascii_lower(std::string s) {
  for (char& c : s) {
    if (c >= 'A' && c <= 'Z') c = static_cast<char>(c + 32);
  }
  return s;
}
bool is_alpha(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
         (static_cast<unsigned char>(c) & 0x80) != 0;
}
std::string capitalize(const std::string& s) {
  std::string out = ascii_lower(s);
  if (!out.empty() && out[0] >= 'a' && out[0] <= 'z') out[0] = static_cast<char>(out[0] - 32);
  return out;
}
// Python's str.title(): a cased letter after an uncased character starts a word.
std::string title(const std::string& s) {
  std::string out = s;
  bool prev_cased = false;
  for (char& c : out) {
    const bool letter = is_alpha(c) && (static_cast<unsigned char>(c) & 0x80) == 0;
    if (letter) {
      c = prev_cased ? static_cast<char>(std::tolower(static_cast<unsigned char>(c)))
                     : static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
    }
    prev_cased = letter;
  }
  return out;
}

std::string replace(Interpreter& in, const std::string& s, const std::string& from,
                    const std::string& to, int64_t count) {
  std::string out;
  if (from.empty()) {
    const auto cps = code_points(s);
    int64_t done = 0;
    for (const auto cp : cps) {
      if (count < 0 || done < count) {
        out += to;
        ++done;
      }
      out += cp;
      in.charge(to.size() + cp.size());
    }
    if (count < 0 || done < count) out += to;
    return out;
  }
  size_t pos = 0;
  int64_t done = 0;
  for (;;) {
    const size_t at = (count >= 0 && done >= count) ? std::string::npos : s.find(from, pos);
    if (at == std::string::npos) {
      out.append(s, pos);
      break;
    }
    out.append(s, pos, at - pos);
    out += to;
    in.charge(at - pos + to.size());
    pos = at + from.size();
    ++done;
  }
  in.charge(out.size());
  return out;
}

std::vector<Value> split(const std::string& s, const Value* sep, int64_t maxsplit,
                         bool from_right) {
  std::vector<std::string> parts;
  if (!sep || sep->is_none()) {
    // Runs of whitespace separate; leading and trailing whitespace is dropped.
    const auto cps = code_points(s);
    std::vector<std::pair<size_t, size_t>> words;  // [begin, end) in cps
    size_t i = 0;
    while (i < cps.size()) {
      size_t n = 1;
      while (i < cps.size() && is_py_space(decode_at(cps[i], 0, n))) ++i;
      if (i == cps.size()) break;
      const size_t b = i;
      while (i < cps.size() && !is_py_space(decode_at(cps[i], 0, n))) ++i;
      words.emplace_back(b, i);
    }
    const auto join_range = [&](size_t b, size_t e) {
      std::string w;
      for (size_t k = b; k < e; ++k) w += cps[k];
      return w;
    };
    if (maxsplit < 0 || static_cast<size_t>(maxsplit) + 1 >= words.size()) {
      for (const auto& [b, e] : words) parts.push_back(join_range(b, e));
    } else if (!from_right) {
      for (int64_t k = 0; k < maxsplit; ++k)
        parts.push_back(join_range(words[k].first, words[k].second));
      // The rest, from the next word to the end with trailing whitespace stripped.
      parts.push_back(join_range(words[maxsplit].first, words.back().second));
    } else {
      const size_t keep = words.size() - static_cast<size_t>(maxsplit);
      parts.push_back(join_range(words[0].first, words[keep - 1].second));
      for (size_t k = keep; k < words.size(); ++k)
        parts.push_back(join_range(words[k].first, words[k].second));
    }
  } else {
    const std::string& d = need_string(*sep, "split");
    if (d.empty()) throw RenderError("split: empty separator");
    if (!from_right) {
      size_t pos = 0;
      int64_t done = 0;
      for (;;) {
        const size_t at = (maxsplit >= 0 && done >= maxsplit) ? std::string::npos : s.find(d, pos);
        if (at == std::string::npos) {
          parts.push_back(s.substr(pos));
          break;
        }
        parts.push_back(s.substr(pos, at - pos));
        pos = at + d.size();
        ++done;
      }
    } else {
      size_t end = s.size();
      int64_t done = 0;
      std::vector<std::string> rev;
      for (;;) {
        size_t at = std::string::npos;
        if ((maxsplit < 0 || done < maxsplit) && end >= d.size()) at = s.rfind(d, end - d.size());
        if (at == std::string::npos) {
          rev.push_back(s.substr(0, end));
          break;
        }
        rev.push_back(s.substr(at + d.size(), end - at - d.size()));
        end = at;
        ++done;
      }
      parts.assign(rev.rbegin(), rev.rend());
    }
  }
  std::vector<Value> out;
  out.reserve(parts.size());
  for (auto& p : parts) out.emplace_back(std::move(p));
  return out;
}

// '{}'.format(...): automatic and numbered fields and names, no format specs.
std::string str_format(const std::string& f, const Args& a) {
  std::string out;
  size_t auto_index = 0;
  for (size_t i = 0; i < f.size(); ++i) {
    const char c = f[i];
    if (c == '{' && i + 1 < f.size() && f[i + 1] == '{') {
      out += '{';
      ++i;
    } else if (c == '}' && i + 1 < f.size() && f[i + 1] == '}') {
      out += '}';
      ++i;
    } else if (c == '{') {
      const size_t close = f.find('}', i);
      if (close == std::string::npos) throw RenderError("format: unmatched '{'");
      const std::string field = f.substr(i + 1, close - i - 1);
      if (field.find_first_of(":!.[") != std::string::npos) {
        throw UnsupportedError("str.format field specifications ('" + field + "')");
      }
      const Value* v = nullptr;
      if (field.empty()) {
        if (auto_index >= a.positional.size()) throw RenderError("format: not enough arguments");
        v = &a.positional[auto_index++];
      } else if (std::all_of(field.begin(), field.end(),
                             [](char d) { return d >= '0' && d <= '9'; })) {
        const size_t k = std::stoul(field);
        if (k >= a.positional.size()) throw RenderError("format: not enough arguments");
        v = &a.positional[k];
      } else {
        for (const auto& [name, val] : a.keyword) {
          if (name == field) v = &val;
        }
        if (!v) throw RenderError("format: no argument named '" + field + "'");
      }
      out += v->to_str();
      i = close;
    } else if (c == '}') {
      throw RenderError("format: single '}'");
    } else {
      out += c;
    }
  }
  return out;
}

Value method(std::string name, std::function<Value(Interpreter&, Args&)> fn) {
  return Value::callable(std::move(name), std::move(fn));
}

Value unsafe(const std::string& type, const std::string& name) {
  return method(type + "." + name, [type, name](Interpreter&, Args&) -> Value {
    throw RenderError(
        fmt::format("access to attribute '{}' of '{}' object is unsafe (templates cannot "
                    "change lists and dicts)",
                    name, type));
  });
}

Value string_method(const Value& self, const std::string& name) {
  const std::string s = self.str();
  const std::string full = "str." + name;
  using F = std::function<Value(Interpreter&, Args&)>;
  F f;
  if (name == "strip" || name == "lstrip" || name == "rstrip") {
    f = [s, name, full](Interpreter& in, Args& a) {
      Params p(full, a, {"chars"});
      std::string r = strip(s, p.get(0), name != "rstrip", name != "lstrip");
      in.charge(r.size());
      return Value(std::move(r));
    };
  } else if (name == "split" || name == "rsplit") {
    f = [s, name, full](Interpreter& in, Args& a) {
      Params p(full, a, {"sep", "maxsplit"});
      in.charge(s.size() * 2 + 64);
      return Value::list(split(s, p.get(0), p.integer(1, -1), name == "rsplit"));
    };
  } else if (name == "splitlines") {
    f = [s, full](Interpreter& in, Args& a) {
      Params p(full, a, {"keepends"});
      const bool keep = p.flag(0, false);
      std::vector<Value> out;
      size_t pos = 0;
      while (pos < s.size()) {
        size_t e = s.find_first_of("\r\n", pos);
        if (e == std::string::npos) {
          out.emplace_back(s.substr(pos));
          break;
        }
        size_t next = e + 1;
        if (s[e] == '\r' && next < s.size() && s[next] == '\n') ++next;
        out.emplace_back(s.substr(pos, (keep ? next : e) - pos));
        pos = next;
      }
      in.charge(s.size() + out.size() * sizeof(Value));
      return Value::list(std::move(out));
    };
  } else if (name == "startswith" || name == "endswith") {
    f = [s, name, full](Interpreter&, Args& a) {
      Params p(full, a, {"prefix"});
      const Value& pre = p.need(0);
      std::vector<std::string> options;
      if (pre.is_list()) {
        for (const auto& v : pre.list().items) options.push_back(need_string(v, full));
      } else {
        options.push_back(need_string(pre, full));
      }
      for (const auto& o : options) {
        if (name == "startswith" ? s.starts_with(o) : s.ends_with(o)) return Value(true);
      }
      return Value(false);
    };
  } else if (name == "upper" || name == "lower" || name == "title" || name == "capitalize" ||
             name == "swapcase") {
    f = [s, name](Interpreter& in, Args&) {
      in.charge(s.size());
      if (name == "upper") return Value(ascii_upper(s));
      if (name == "lower") return Value(ascii_lower(s));
      if (name == "title") return Value(title(s));
      if (name == "capitalize") return Value(capitalize(s));
      std::string out = s;
      for (char& c : out) {
        if (c >= 'a' && c <= 'z') {
          c = static_cast<char>(c - 32);
        } else if (c >= 'A' && c <= 'Z') {
          c = static_cast<char>(c + 32);
        }
      }
      return Value(std::move(out));
    };
  } else if (name == "replace") {
    f = [s, full](Interpreter& in, Args& a) {
      Params p(full, a, {"old", "new", "count"});
      return Value(replace(in, s, need_string(p.need(0), full), need_string(p.need(1), full),
                           p.integer(2, -1)));
    };
  } else if (name == "find" || name == "rfind" || name == "index" || name == "rindex" ||
             name == "count") {
    f = [s, name, full](Interpreter&, Args& a) {
      Params p(full, a, {"sub"});
      const std::string& sub = need_string(p.need(0), full);
      if (name == "count") {
        if (sub.empty()) return Value(static_cast<int64_t>(utf8_length(s) + 1));
        int64_t n = 0;
        for (size_t at = s.find(sub); at != std::string::npos; at = s.find(sub, at + sub.size()))
          ++n;
        return Value(n);
      }
      const size_t at = (name == "find" || name == "index") ? s.find(sub) : s.rfind(sub);
      if (at == std::string::npos) {
        if (name == "index" || name == "rindex") throw RenderError("substring not found");
        return Value(-1);
      }
      return Value(static_cast<int64_t>(utf8_length(s.substr(0, at))));
    };
  } else if (name == "join") {
    f = [s, full](Interpreter& in, Args& a) {
      Params p(full, a, {"iterable"});
      std::string out;
      bool first = true;
      for (const Value& v : iterate(p.need(0))) {
        if (!first) out += s;
        first = false;
        out += need_string(v, full);
        in.charge(s.size() + out.size() / 8);
      }
      in.charge(out.size());
      return Value(std::move(out));
    };
  } else if (name == "format") {
    f = [s](Interpreter& in, Args& a) {
      std::string r = str_format(s, a);
      in.charge(r.size());
      return Value(std::move(r));
    };
  } else if (name == "removeprefix" || name == "removesuffix") {
    f = [s, name, full](Interpreter&, Args& a) {
      Params p(full, a, {"affix"});
      const std::string& x = need_string(p.need(0), full);
      if (name == "removeprefix" && s.starts_with(x)) return Value(s.substr(x.size()));
      if (name == "removesuffix" && s.ends_with(x)) return Value(s.substr(0, s.size() - x.size()));
      return Value(s);
    };
  } else if (name == "isdigit" || name == "isnumeric" || name == "isdecimal" || name == "isalpha" ||
             name == "isalnum" || name == "isspace" || name == "islower" || name == "isupper") {
    f = [s, name](Interpreter&, Args&) {
      if (name == "islower" || name == "isupper") {
        bool cased = false;
        for (const char c : s) {
          if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z')) {
            cased = true;
            if ((name == "islower") != (c >= 'a' && c <= 'z')) return Value(false);
          }
        }
        return Value(cased);
      }
      if (s.empty()) return Value(false);
      for (const char c : s) {
        const auto u = static_cast<unsigned char>(c);
        bool ok = false;
        if (name == "isspace")
          ok = std::isspace(u) != 0;
        else if (name == "isalpha")
          ok = std::isalpha(u) != 0;
        else if (name == "isalnum")
          ok = std::isalnum(u) != 0;
        else
          ok = std::isdigit(u) != 0;
        if (!ok) return Value(false);
      }
      return Value(true);
    };
  } else if (name == "ljust" || name == "rjust" || name == "center" || name == "zfill") {
    f = [s, name, full](Interpreter& in, Args& a) {
      Params p(full, a, {"width", "fillchar"});
      const int64_t width = p.integer(0, 0);
      const std::string fill = name == "zfill" ? "0" : p.string(1, " ");
      const int64_t len = static_cast<int64_t>(utf8_length(s));
      if (width <= len) return Value(s);
      const auto pad = static_cast<size_t>(width - len);
      in.charge(pad * fill.size());
      const auto rep = [&](size_t n) {
        std::string r;
        for (size_t i = 0; i < n; ++i) r += fill;
        return r;
      };
      if (name == "ljust") return Value(s + rep(pad));
      if (name == "rjust" || name == "zfill") return Value(rep(pad) + s);
      const size_t left = pad / 2 + (pad & static_cast<size_t>(width) & 1);
      return Value(rep(left) + s + rep(pad - left));
    };
  } else {
    static const char* const kPython[] = {"encode",       "expandtabs",  "format_map", "isascii",
                                          "isidentifier", "isprintable", "istitle",    "maketrans",
                                          "partition",    "rpartition",  "translate",  "casefold"};
    for (const char* m : kPython) {
      if (name == m) {
        return method(full, [full](Interpreter&, Args&) -> Value {
          throw UnsupportedError("string method '" + full + "'");
        });
      }
    }
    return Value::undefined(fmt::format("'str object' has no attribute '{}'", name));
  }
  return method(full, std::move(f));
}

Value dict_method(const Value& self, const std::string& name) {
  const std::string full = "dict." + name;
  if (name == "items" || name == "keys" || name == "values") {
    return method(full, [self, name](Interpreter& in, Args&) {
      std::vector<Value> out;
      for (const auto& [k, v] : self.dict().items) {
        if (name == "items") {
          out.push_back(Value::list({Value(k), v}, true));
        } else {
          out.push_back(name == "keys" ? Value(k) : v);
        }
      }
      in.charge(out.size() * sizeof(Value) * 3);
      return Value::list(std::move(out));
    });
  }
  if (name == "get") {
    return method(full, [self, full](Interpreter&, Args& a) {
      Params p(full, a, {"key", "default"});
      const Value& key = p.need(0);
      if (key.is_string()) {
        if (const Value* v = self.dict().find(key.str())) return *v;
      }
      return p.get_or(1, Value::none());
    });
  }
  if (name == "copy") {
    return method(full, [self](Interpreter&, Args&) { return self; });
  }
  if (name == "pop" || name == "popitem" || name == "update" || name == "setdefault" ||
      name == "clear") {
    return unsafe("dict", name);
  }
  return Value();
}

Value list_method(const Value& self, const std::string& name) {
  const std::string full = "list." + name;
  if (name == "index" || name == "count") {
    return method(full, [self, name, full](Interpreter&, Args& a) {
      Params p(full, a, {"value"});
      const Value& x = p.need(0);
      int64_t n = 0;
      const auto& items = self.list().items;
      for (size_t i = 0; i < items.size(); ++i) {
        if (items[i] == x) {
          if (name == "index") return Value(static_cast<int64_t>(i));
          ++n;
        }
      }
      if (name == "index") throw RenderError(x.repr() + " is not in list");
      return Value(n);
    });
  }
  if (name == "append" || name == "extend" || name == "insert" || name == "pop" ||
      name == "remove" || name == "clear" || name == "sort" || name == "reverse") {
    return unsafe("list", name);
  }
  return Value::undefined(fmt::format("'list object' has no attribute '{}'", name));
}

std::string kind_label(const Value& v) {
  if (v.is_none()) return "None";
  return v.type_name() + " object";
}

}  // namespace

std::vector<Value> iterate(const Value& v) {
  switch (v.kind()) {
    case Value::Kind::kUndefined:
      return {};
    case Value::Kind::kList:
      return v.list().items;
    case Value::Kind::kDict: {
      std::vector<Value> keys;
      keys.reserve(v.dict().items.size());
      for (const auto& [k, val] : v.dict().items) keys.emplace_back(k);
      return keys;
    }
    case Value::Kind::kString: {
      std::vector<Value> out;
      for (const auto cp : code_points(v.str())) out.emplace_back(cp);
      return out;
    }
    default:
      throw RenderError(
          fmt::format("'{}' object is not iterable", v.is_none() ? "NoneType" : v.type_name()));
  }
}

bool contains(const Value& container, const Value& item) {
  switch (container.kind()) {
    case Value::Kind::kUndefined:
      return false;
    case Value::Kind::kString:
      if (!item.is_string()) {
        throw RenderError(
            fmt::format("'in <string>' requires string as left operand, not {}", item.type_name()));
      }
      return container.str().find(item.str()) != std::string::npos;
    case Value::Kind::kList:
      for (const auto& v : container.list().items) {
        if (v == item) return true;
      }
      return false;
    case Value::Kind::kDict:
      return item.is_string() && container.dict().find(item.str()) != nullptr;
    case Value::Kind::kNamespace:
      return item.is_string() && container.ns().find(item.str()) != nullptr;
    default:
      throw RenderError(fmt::format("argument of type '{}' is not iterable",
                                    container.is_none() ? "NoneType" : container.type_name()));
  }
}

Value get_attr(Interpreter&, const Value& obj, const std::string& name) {
  switch (obj.kind()) {
    case Value::Kind::kUndefined:
      throw RenderError(obj.undefined_hint());
    case Value::Kind::kDict: {
      Value m = dict_method(obj, name);
      if (!m.is_undefined()) return m;
      if (const Value* v = obj.dict().find(name)) return *v;
      return Value::undefined(fmt::format("'dict object' has no attribute '{}'", name));
    }
    case Value::Kind::kNamespace:
      if (const Value* v = obj.ns().find(name)) return *v;
      return Value::undefined(fmt::format("'Namespace' object has no attribute '{}'", name));
    case Value::Kind::kString:
      return string_method(obj, name);
    case Value::Kind::kList:
      return list_method(obj, name);
    default:
      return Value::undefined(fmt::format("'{}' has no attribute '{}'", kind_label(obj), name));
  }
}

Value get_item(Interpreter& in, const Value& obj, const Value& key) {
  switch (obj.kind()) {
    case Value::Kind::kUndefined:
      throw RenderError(obj.undefined_hint());
    case Value::Kind::kDict:
      if (key.is_string()) {
        if (const Value* v = obj.dict().find(key.str())) return *v;
        Value m = dict_method(obj, key.str());
        if (!m.is_undefined()) return m;
      }
      return Value::undefined(fmt::format("'dict object' has no attribute {}", key.repr()));
    case Value::Kind::kNamespace:
      if (key.is_string()) {
        if (const Value* v = obj.ns().find(key.str())) return *v;
      }
      return Value::undefined(fmt::format("'Namespace' object has no attribute {}", key.repr()));
    case Value::Kind::kList:
    case Value::Kind::kString:
      if (key.is_int() || key.is_bool()) {
        int64_t i = key.is_bool() ? key.as_bool() : key.as_int();
        if (obj.is_list()) {
          const auto n = static_cast<int64_t>(obj.list().items.size());
          if (i < 0) i += n;
          if (i < 0 || i >= n) {
            return Value::undefined(fmt::format("'list object' has no element {}", key.to_str()));
          }
          return obj.list().items[static_cast<size_t>(i)];
        }
        const std::vector<size_t> off = utf8_offsets(obj.str());
        const auto n = static_cast<int64_t>(off.size()) - 1;
        if (i < 0) i += n;
        if (i < 0 || i >= n) {
          return Value::undefined(fmt::format("'str object' has no element {}", key.to_str()));
        }
        const auto k = static_cast<size_t>(i);
        return Value(obj.str().substr(off[k], off[k + 1] - off[k]));
      }
      if (key.is_string()) return get_attr(in, obj, key.str());
      return Value::undefined(fmt::format("'{}' has no element {}", kind_label(obj), key.repr()));
    default:
      return Value::undefined(fmt::format("'{}' has no element {}", kind_label(obj), key.repr()));
  }
}

std::string percent_format(Interpreter&, const std::string& f, const Value& args) {
  std::vector<Value> values;
  const Dict* named = nullptr;
  if (args.is_list() && args.list().tuple) {
    values = args.list().items;
  } else if (args.is_dict()) {
    named = &args.dict();
  } else {
    values.push_back(args);
  }
  std::string out;
  size_t next = 0;
  for (size_t i = 0; i < f.size(); ++i) {
    if (f[i] != '%') {
      out += f[i];
      continue;
    }
    if (++i >= f.size()) throw RenderError("incomplete format");
    const Value* v = nullptr;
    if (f[i] == '(' && named) {
      const size_t close = f.find(')', i);
      if (close == std::string::npos) throw RenderError("incomplete format key");
      v = named->find(f.substr(i + 1, close - i - 1));
      if (!v) throw RenderError("format key not found");
      i = close + 1;
      if (i >= f.size()) throw RenderError("incomplete format");
    }
    const char c = f[i];
    if (c == '%') {
      out += '%';
      continue;
    }
    if (!v) {
      if (next >= values.size()) throw RenderError("not enough arguments for format string");
      v = &values[next++];
    }
    switch (c) {
      case 's':
        out += v->to_str();
        break;
      case 'r':
        out += v->repr();
        break;
      case 'd':
      case 'i':
        if (!v->is_number()) throw RenderError("%d format: a number is required");
        out += std::to_string(v->is_float() ? static_cast<int64_t>(v->as_float())
                                            : (v->is_bool() ? v->as_bool() : v->as_int()));
        break;
      case 'f':
        if (!v->is_number()) throw RenderError("%f format: a number is required");
        out += fmt::format("{:.6f}", v->to_double());
        break;
      default:
        throw UnsupportedError(fmt::format("the '%{}' format", c));
    }
  }
  if (!named && next < values.size()) {
    throw RenderError("not all arguments converted during string formatting");
  }
  return out;
}

namespace {

// Python int(str): optional sign, digits with single underscores, surrounding whitespace.
std::optional<int64_t> parse_int(const std::string& s, int base) {
  const std::string t = strip(s, nullptr, true, true);
  size_t i = 0;
  bool neg = false;
  if (i < t.size() && (t[i] == '+' || t[i] == '-')) neg = t[i++] == '-';
  if (base == 16 && t.compare(i, 2, "0x") == 0) i += 2;
  if (i >= t.size()) return std::nullopt;
  int64_t r = 0;
  bool prev_digit = false;
  for (; i < t.size(); ++i) {
    const char c = t[i];
    if (c == '_' && prev_digit && i + 1 < t.size()) {
      prev_digit = false;
      continue;
    }
    int d = -1;
    if (c >= '0' && c <= '9')
      d = c - '0';
    else if (c >= 'a' && c <= 'z')
      d = c - 'a' + 10;
    else if (c >= 'A' && c <= 'Z')
      d = c - 'A' + 10;
    if (d < 0 || d >= base) return std::nullopt;
    if (__builtin_mul_overflow(r, base, &r) || __builtin_add_overflow(r, d, &r))
      return std::nullopt;
    prev_digit = true;
  }
  if (!prev_digit) return std::nullopt;
  return neg ? -r : r;
}

std::optional<double> parse_float(const std::string& s) {
  const std::string t = strip(s, nullptr, true, true);
  if (t.empty()) return std::nullopt;
  char* end = nullptr;
  const double d = std::strtod(t.c_str(), &end);
  if (end != t.c_str() + t.size()) return std::nullopt;
  return d;
}

// The attribute path "a.b.0" of a value, as jinja2's make_attrgetter resolves it.
Value attribute_path(Interpreter& in, const Value& v, const Value& attr) {
  if (attr.is_int()) return get_item(in, v, attr);
  const std::string& path = need_string(attr, "attribute");
  Value cur = v;
  size_t pos = 0;
  while (pos <= path.size()) {
    const size_t dot = path.find('.', pos);
    const std::string part =
        path.substr(pos, dot == std::string::npos ? std::string::npos : dot - pos);
    const auto idx = parse_int(part, 10);
    cur = idx && !part.empty() && std::isdigit(static_cast<unsigned char>(part[0]))
              ? get_item(in, cur, Value(*idx))
              : get_item(in, cur, Value(part));
    if (dot == std::string::npos) break;
    pos = dot + 1;
  }
  return cur;
}

// A sort key for sort/unique/min/max: strings folded to lower case unless case_sensitive.
Value sort_key(Interpreter& in, const Value& v, const Value* attribute, bool case_sensitive) {
  Value k = attribute && !attribute->is_none() ? attribute_path(in, v, *attribute) : v;
  if (!case_sensitive && k.is_string()) return Value(ascii_lower(k.str()));
  return k;
}

Args rest_args(const Args& a, size_t from) {
  Args out;
  for (size_t i = from; i < a.positional.size(); ++i) out.positional.push_back(a.positional[i]);
  out.keyword = a.keyword;
  return out;
}

std::vector<Value> select_items(Interpreter& in, const Value& seq, Args& args, bool by_attr,
                                bool keep, const std::string& what) {
  std::vector<Value> out;
  size_t next = 0;
  Value attribute;
  if (by_attr) {
    if (args.positional.empty()) throw RenderError(what + " needs an attribute name");
    attribute = args.positional[next++];
  }
  std::optional<std::string> test;
  if (next < args.positional.size()) test = need_string(args.positional[next++], what);
  Args test_args = rest_args(args, next);
  for (const Value& item : iterate(seq)) {
    in.step();
    const Value v = by_attr ? attribute_path(in, item, attribute) : item;
    Args copy = test_args;
    const bool ok = test ? apply_test(in, *test, v, copy) : v.truthy();
    if (ok == keep) out.push_back(item);
  }
  return out;
}

Value list_of(Interpreter& in, std::vector<Value> items) {
  in.charge(items.size() * sizeof(Value));
  return Value::list(std::move(items));
}

std::vector<Value> sorted(Interpreter& in, std::vector<Value> items, const Value* attribute,
                          bool case_sensitive, bool reverse) {
  std::vector<std::pair<Value, Value>> keyed;
  for (auto& v : items) keyed.emplace_back(sort_key(in, v, attribute, case_sensitive), v);
  std::stable_sort(keyed.begin(), keyed.end(), [&](const auto& a, const auto& b) {
    in.step();
    return reverse ? compare(b.first, a.first) < 0 : compare(a.first, b.first) < 0;
  });
  std::vector<Value> out;
  for (auto& [k, v] : keyed) out.push_back(std::move(v));
  return out;
}

}  // namespace

Value apply_filter(Interpreter& in, const std::string& name, const Value& v, Args& args) {
  const std::string what = "filter '" + name + "'";
  if (name == "default" || name == "d") {
    Params p(what, args, {"default_value", "boolean"});
    if (v.is_undefined() || (p.flag(1, false) && !v.truthy())) return p.get_or(0, Value(""));
    return v;
  }
  if (name == "length" || name == "count") {
    switch (v.kind()) {
      case Value::Kind::kUndefined:
        return Value(0);
      case Value::Kind::kString:
        return Value(static_cast<int64_t>(utf8_length(v.str())));
      case Value::Kind::kList:
        return Value(static_cast<int64_t>(v.list().items.size()));
      case Value::Kind::kDict:
        return Value(static_cast<int64_t>(v.dict().items.size()));
      default:
        throw RenderError(fmt::format("object of type '{}' has no len()", v.type_name()));
    }
  }
  if (name == "string") return Value(v.to_str());
  if (name == "safe") return Value(v.to_str());
  if (name == "tojson") {
    Params p(what, args, {"indent"});
    std::string s = v.to_json(static_cast<int>(std::clamp<int64_t>(p.integer(0, -1), -1, 64)));
    in.charge(s.size());
    return Value(std::move(s));
  }
  if (name == "trim") {
    Params p(what, args, {"chars"});
    return Value(strip(v.to_str(), p.get(0), true, true));
  }
  if (name == "upper") return Value(ascii_upper(v.to_str()));
  if (name == "lower") return Value(ascii_lower(v.to_str()));
  if (name == "capitalize") return Value(capitalize(v.to_str()));
  if (name == "title") return Value(title(v.to_str()));
  if (name == "replace") {
    Params p(what, args, {"old", "new", "count"});
    return Value(replace(in, v.to_str(), p.need(0).to_str(), p.need(1).to_str(), p.integer(2, -1)));
  }
  if (name == "escape" || name == "e" || name == "forceescape")
    return Value(markup_escape(v.to_str()));
  if (name == "items") {
    if (v.is_undefined()) return Value::list({});
    if (!v.is_dict())
      throw RenderError(fmt::format("items: expected a mapping, got {}", v.type_name()));
    std::vector<Value> out;
    for (const auto& [k, val] : v.dict().items) out.push_back(Value::list({Value(k), val}, true));
    return list_of(in, std::move(out));
  }
  if (name == "list") return list_of(in, iterate(v));
  if (name == "first" || name == "last") {
    std::vector<Value> items = iterate(v);
    if (items.empty()) return Value::undefined(fmt::format("no {} item, sequence was empty", name));
    return name == "first" ? items.front() : items.back();
  }
  if (name == "join") {
    Params p(what, args, {"d", "attribute"});
    const std::string sep = p.get_or(0, Value("")).to_str();
    std::string out;
    bool first = true;
    for (const Value& item : iterate(v)) {
      if (!first) out += sep;
      first = false;
      const Value* attr = p.get(1);
      out += (attr ? attribute_path(in, item, *attr) : item).to_str();
      in.charge(sep.size() + 16);
    }
    in.charge(out.size());
    return Value(std::move(out));
  }
  if (name == "int") {
    Params p(what, args, {"default", "base"});
    const Value def = p.get_or(0, Value(0));
    if (v.is_int()) return v;
    if (v.is_bool()) return Value(static_cast<int64_t>(v.as_bool()));
    if (v.is_float()) {
      if (!std::isfinite(v.as_float()) || std::fabs(v.as_float()) >= 9.2e18) return def;
      return Value(static_cast<int64_t>(v.as_float()));
    }
    if (v.is_string()) {
      if (auto i =
              parse_int(v.str(), static_cast<int>(std::clamp<int64_t>(p.integer(1, 10), 2, 36))))
        return Value(*i);
      if (auto d = parse_float(v.str()); d && std::isfinite(*d) && std::fabs(*d) < 9.2e18) {
        return Value(static_cast<int64_t>(*d));
      }
    }
    return def;
  }
  if (name == "float") {
    Params p(what, args, {"default"});
    if (v.is_number()) return Value(v.to_double());
    if (v.is_string()) {
      if (auto d = parse_float(v.str())) return Value(*d);
    }
    return p.get_or(0, Value(0.0));
  }
  if (name == "abs") {
    if (v.is_int()) {
      if (v.as_int() == INT64_MIN) throw RenderError("integer overflow");
      return Value(v.as_int() < 0 ? -v.as_int() : v.as_int());
    }
    if (v.is_bool()) return Value(static_cast<int64_t>(v.as_bool()));
    return Value(std::fabs(v.to_double()));
  }
  if (name == "round") {
    Params p(what, args, {"precision", "method"});
    const int64_t precision = std::clamp<int64_t>(p.integer(0, 0), -20, 20);
    const std::string method = p.string(1, "common");
    const double scale = std::pow(10.0, static_cast<double>(precision));
    const double x = v.to_double() * scale;
    double r;
    if (method == "common") {
      r = std::nearbyint(x);  // Python's round(): halves to even
    } else if (method == "ceil") {
      r = std::ceil(x);
    } else if (method == "floor") {
      r = std::floor(x);
    } else {
      throw RenderError("round: method must be common, ceil or floor");
    }
    return Value(r / scale);
  }
  if (name == "reverse") {
    if (v.is_string()) {
      auto cps = code_points(v.str());
      std::string out;
      for (auto it = cps.rbegin(); it != cps.rend(); ++it) out += *it;
      return Value(std::move(out));
    }
    std::vector<Value> items = iterate(v);
    std::reverse(items.begin(), items.end());
    return list_of(in, std::move(items));
  }
  if (name == "sort") {
    Params p(what, args, {"reverse", "case_sensitive", "attribute"});
    return list_of(in, sorted(in, iterate(v), p.get(2), p.flag(1, false), p.flag(0, false)));
  }
  if (name == "dictsort") {
    Params p(what, args, {"case_sensitive", "by", "reverse"});
    if (!v.is_dict()) throw RenderError("dictsort: expected a mapping");
    const bool by_value = p.string(1, "key") == "value";
    std::vector<Value> pairs;
    for (const auto& [k, val] : v.dict().items) pairs.push_back(Value::list({Value(k), val}, true));
    const Value index(static_cast<int64_t>(by_value ? 1 : 0));
    return list_of(in, sorted(in, std::move(pairs), &index, p.flag(0, false), p.flag(2, false)));
  }
  if (name == "unique") {
    Params p(what, args, {"case_sensitive", "attribute"});
    std::vector<Value> out, keys;
    for (const Value& item : iterate(v)) {
      in.step();
      Value k = sort_key(in, item, p.get(1), p.flag(0, false));
      if (std::find(keys.begin(), keys.end(), k) != keys.end()) continue;
      keys.push_back(std::move(k));
      out.push_back(item);
    }
    return list_of(in, std::move(out));
  }
  if (name == "min" || name == "max") {
    Params p(what, args, {"case_sensitive", "attribute"});
    std::vector<Value> items = iterate(v);
    if (items.empty()) return Value::undefined(fmt::format("no {} item, sequence was empty", name));
    size_t best = 0;
    Value best_key = sort_key(in, items[0], p.get(1), p.flag(0, false));
    for (size_t i = 1; i < items.size(); ++i) {
      Value k = sort_key(in, items[i], p.get(1), p.flag(0, false));
      const int c = compare(k, best_key);
      if (name == "min" ? c < 0 : c > 0) {
        best = i;
        best_key = std::move(k);
      }
    }
    return items[best];
  }
  if (name == "sum") {
    Params p(what, args, {"attribute", "start"});
    Value total = p.get_or(1, Value(0));
    for (const Value& item : iterate(v)) {
      const Value x = p.get(0) ? attribute_path(in, item, *p.get(0)) : item;
      if (!x.is_number() || !total.is_number()) throw RenderError("sum: the items must be numbers");
      if (x.is_float() || total.is_float()) {
        total = Value(total.to_double() + x.to_double());
      } else {
        int64_t r;
        const int64_t a = total.is_bool() ? total.as_bool() : total.as_int();
        const int64_t b = x.is_bool() ? x.as_bool() : x.as_int();
        if (__builtin_add_overflow(a, b, &r)) throw RenderError("integer overflow");
        total = Value(r);
      }
    }
    return total;
  }
  if (name == "map") {
    std::vector<Value> out;
    const Value* attribute = nullptr;
    const Value* def = nullptr;
    for (const auto& [k, val] : args.keyword) {
      if (k == "attribute") attribute = &val;
      if (k == "default") def = &val;
    }
    if (attribute) {
      for (const Value& item : iterate(v)) {
        in.step();
        Value x = attribute_path(in, item, *attribute);
        if (x.is_undefined() && def) x = *def;
        out.push_back(std::move(x));
      }
      return list_of(in, std::move(out));
    }
    if (args.positional.empty()) throw RenderError("map needs a filter name or attribute=");
    const std::string filter = need_string(args.positional[0], what);
    const Args rest = rest_args(args, 1);
    for (const Value& item : iterate(v)) {
      in.step();
      Args copy = rest;
      out.push_back(apply_filter(in, filter, item, copy));
    }
    return list_of(in, std::move(out));
  }
  if (name == "select" || name == "reject" || name == "selectattr" || name == "rejectattr") {
    const bool by_attr = name.ends_with("attr");
    const bool keep = name.starts_with("select");
    return list_of(in, select_items(in, v, args, by_attr, keep, what));
  }
  if (name == "attr") {
    Params p(what, args, {"name"});
    return get_attr(in, v, need_string(p.need(0), what));
  }
  if (name == "batch") {
    Params p(what, args, {"linecount", "fill_with"});
    const int64_t n = p.integer(0, 1);
    if (n <= 0) throw RenderError("batch: linecount must be positive");
    std::vector<Value> out, cur;
    for (const Value& item : iterate(v)) {
      cur.push_back(item);
      if (static_cast<int64_t>(cur.size()) == n) out.push_back(Value::list(std::exchange(cur, {})));
    }
    if (!cur.empty()) {
      if (const Value* fill = p.get(1)) {
        while (static_cast<int64_t>(cur.size()) < n) cur.push_back(*fill);
      }
      out.push_back(Value::list(std::move(cur)));
    }
    return list_of(in, std::move(out));
  }
  if (name == "indent") {
    Params p(what, args, {"width", "first", "blank"});
    const Value* w = p.get(0);
    std::string pad =
        w && w->is_string()
            ? w->str()
            : std::string(static_cast<size_t>(std::clamp<int64_t>(p.integer(0, 4), 0, 1000)), ' ');
    const std::string s = v.to_str() + "\n";
    std::vector<std::string> lines;
    size_t pos = 0;
    while (pos < s.size()) {
      const size_t e = s.find('\n', pos);
      lines.push_back(s.substr(pos, e - pos));
      pos = e + 1;
    }
    std::string out;
    for (size_t i = 0; i < lines.size(); ++i) {
      if (i > 0) out += "\n";
      const bool indent = i == 0 ? p.flag(1, false) : (p.flag(2, false) || !lines[i].empty());
      if (indent) out += pad;
      out += lines[i];
      in.charge(lines[i].size() + pad.size());
    }
    return Value(std::move(out));
  }
  if (name == "center") {
    Params p(what, args, {"width"});
    Args a;
    a.positional.push_back(p.get_or(0, Value(80)));
    Value m = string_method(Value(v.to_str()), "center");
    return in.call(m, a, "center");
  }
  if (name == "wordcount") {
    return Value(static_cast<int64_t>(split(v.to_str(), nullptr, -1, false).size()));
  }
  if (name == "format") {
    if (!args.keyword.empty()) {
      Dict d;
      for (const auto& [k, val] : args.keyword) d.set(k, val);
      return Value(percent_format(in, v.to_str(), Value::dict(std::move(d))));
    }
    return Value(percent_format(in, v.to_str(), Value::list(args.positional, true)));
  }
  if (name == "truncate") {
    Params p(what, args, {"length", "killwords", "end", "leeway"});
    const std::string s = v.to_str();
    const auto length = static_cast<size_t>(std::max<int64_t>(0, p.integer(0, 255)));
    const std::string end = p.string(2, "...");
    const auto leeway = static_cast<size_t>(std::max<int64_t>(0, p.integer(3, 5)));
    const auto cps = code_points(s);
    if (cps.size() <= length + leeway) return Value(s);
    const size_t keep = length > utf8_length(end) ? length - utf8_length(end) : 0;
    std::string out;
    for (size_t i = 0; i < keep; ++i) out += cps[i];
    if (!p.flag(1, false)) {
      const size_t sp = out.rfind(' ');
      if (sp != std::string::npos) out.resize(sp);
    }
    return Value(out + end);
  }
  throw UnsupportedError(what);
}

bool apply_test(Interpreter& in, const std::string& name, const Value& v, Args& args) {
  const std::string what = "test '" + name + "'";
  const auto arg = [&]() -> const Value& {
    if (args.positional.empty()) throw RenderError(what + " needs an argument");
    return args.positional[0];
  };
  if (name == "defined") return !v.is_undefined();
  if (name == "undefined") return v.is_undefined();
  if (name == "none") return v.is_none();
  if (name == "boolean") return v.is_bool();
  if (name == "true") return v.is_bool() && v.as_bool();
  if (name == "false") return v.is_bool() && !v.as_bool();
  if (name == "integer") return v.is_int();
  if (name == "float") return v.is_float();
  if (name == "number") return v.is_number();
  if (name == "string") return v.is_string();
  if (name == "mapping") return v.is_dict();
  if (name == "iterable") return v.is_undefined() || v.is_string() || v.is_list() || v.is_dict();
  if (name == "sequence") return v.is_undefined() || v.is_string() || v.is_list() || v.is_dict();
  if (name == "callable") return v.is_callable();
  if (name == "escaped") return false;
  if (name == "lower" || name == "upper") {
    Args none;
    return string_method(Value(v.to_str()), "is" + name).callable().fn(in, none).truthy();
  }
  if (name == "even" || name == "odd") {
    if (!v.is_int() && !v.is_bool()) throw RenderError(what + " needs an integer");
    const int64_t x = v.is_bool() ? v.as_bool() : v.as_int();
    return (x % 2 == 0) == (name == "even");
  }
  if (name == "divisibleby") {
    const Value& d = arg();
    if (!d.is_number() || d.to_double() == 0)
      throw RenderError("divisibleby needs a non-zero number");
    return std::fmod(v.to_double(), d.to_double()) == 0;
  }
  if (name == "eq" || name == "equalto" || name == "==") return v == arg();
  if (name == "ne" || name == "!=") return !(v == arg());
  if (name == "lt" || name == "lessthan" || name == "<") return compare(v, arg()) < 0;
  if (name == "le" || name == "<=") return compare(v, arg()) <= 0;
  if (name == "gt" || name == "greaterthan" || name == ">") return compare(v, arg()) > 0;
  if (name == "ge" || name == ">=") return compare(v, arg()) >= 0;
  if (name == "in") return contains(arg(), v);
  if (name == "sameas") {
    const Value& o = arg();
    if (v.is_none() || v.is_bool() || v.is_undefined()) return v.kind() == o.kind() && v == o;
    return v.kind() == o.kind() && v == o;
  }
  throw UnsupportedError(what);
}

void add_globals(std::unordered_map<std::string, Value>& globals) {
  globals["raise_exception"] =
      Value::callable("raise_exception", [](Interpreter&, Args& a) -> Value {
        throw RaisedError(a.positional.empty() ? std::string() : a.positional[0].to_str());
      });
  globals["strftime_now"] = Value::callable("strftime_now", [](Interpreter& in, Args& a) {
    Params p("strftime_now", a, {"format"});
    const std::string f = need_string(p.need(0), "strftime_now");
    const std::time_t t = in.now();
    std::tm tm{};
    localtime_r(&t, &tm);
    char buf[512];
    const size_t n = f.empty() ? 0 : std::strftime(buf, sizeof buf, f.c_str(), &tm);
    if (n == 0 && !f.empty())
      throw RenderError("strftime_now: the formatted date is too long or empty");
    return Value(std::string(buf, n));
  });
  globals["range"] = Value::callable("range", [](Interpreter& in, Args& a) {
    if (!a.keyword.empty()) throw RenderError("range takes no keyword arguments");
    std::vector<int64_t> n;
    for (const Value& v : a.positional) {
      if (!v.is_int() && !v.is_bool()) throw RenderError("range needs integers");
      n.push_back(v.is_bool() ? v.as_bool() : v.as_int());
    }
    int64_t start = 0, stop = 0, step_by = 1;
    if (n.size() == 1) {
      stop = n[0];
    } else if (n.size() == 2 || n.size() == 3) {
      start = n[0];
      stop = n[1];
      if (n.size() == 3) step_by = n[2];
    } else {
      throw RenderError("range takes 1 to 3 arguments");
    }
    if (step_by == 0) throw RenderError("range() arg 3 must not be zero");
    std::vector<Value> out;
    for (int64_t i = start; step_by > 0 ? i < stop : i > stop; i += step_by) {
      in.step();
      in.charge(sizeof(Value));
      out.emplace_back(i);
      if ((step_by > 0 && i > INT64_MAX - step_by) || (step_by < 0 && i < INT64_MIN - step_by))
        break;
    }
    return Value::list(std::move(out));
  });
  const auto make_dict = [](Args& a, const char* what) {
    Dict d;
    if (a.positional.size() > 1)
      throw RenderError(std::string(what) + " takes at most one positional argument");
    if (!a.positional.empty()) {
      const Value& m = a.positional[0];
      if (m.is_dict()) {
        for (const auto& [k, v] : m.dict().items) d.set(k, v);
      } else {
        for (const Value& pair : iterate(m)) {
          const auto kv = iterate(pair);
          if (kv.size() != 2 || !kv[0].is_string())
            throw RenderError(std::string(what) + ": expected (key, value) pairs");
          d.set(kv[0].str(), kv[1]);
        }
      }
    }
    for (auto& [k, v] : a.keyword) d.set(k, v);
    return d;
  };
  globals["namespace"] = Value::callable("namespace", [make_dict](Interpreter& in, Args& a) {
    return in.make_namespace(make_dict(a, "namespace"));
  });
  globals["dict"] = Value::callable(
      "dict", [make_dict](Interpreter&, Args& a) { return Value::dict(make_dict(a, "dict")); });
  globals["joiner"] = Value::callable("joiner", [](Interpreter&, Args& a) {
    Params p("joiner", a, {"sep"});
    const std::string sep = p.string(0, ", ");
    auto used = std::make_shared<bool>(false);
    return Value::callable("joiner", [sep, used](Interpreter&, Args&) {
      if (!*used) {
        *used = true;
        return Value("");
      }
      return Value(sep);
    });
  });
  for (const char* name : {"cycler", "lipsum"}) {
    const std::string n = name;
    globals[n] = Value::callable(
        n, [n](Interpreter&, Args&) -> Value { throw UnsupportedError("the global '" + n + "'"); });
  }
}

}  // namespace kvc::jinja
