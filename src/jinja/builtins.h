// Jinja's built-in filters, tests and globals, and the methods of strings, lists and dicts,
// with jinja2's (and Python's) semantics. Used by the interpreter only.
#pragma once

#include <string>
#include <unordered_map>
#include <vector>

#include "jinja/value.h"

namespace kvc::jinja {

// value | name(args). Throws UnsupportedError for a filter this interpreter lacks.
Value apply_filter(Interpreter& in, const std::string& name, const Value& v, Args& args);
// value is name(args). Throws UnsupportedError for a test this interpreter lacks.
bool apply_test(Interpreter& in, const std::string& name, const Value& v, Args& args);
// obj.name, as jinja2's getattr: methods and attributes first, then items; undefined when
// missing. Throws RenderError when obj is undefined.
Value get_attr(Interpreter& in, const Value& obj, const std::string& name);
// obj[key], as jinja2's getitem: items first, then attributes.
Value get_item(Interpreter& in, const Value& obj, const Value& key);
// What a for loop iterates: list items, dict keys, string characters; nothing for
// undefined. Throws RenderError for values that are not iterable.
std::vector<Value> iterate(const Value& v);
// item in container.
bool contains(const Value& container, const Value& item);
// fmt % args (printf-style formatting of strings).
std::string percent_format(Interpreter& in, const std::string& fmt, const Value& args);
// range, namespace, dict, joiner, raise_exception, strftime_now.
void add_globals(std::unordered_map<std::string, Value>& globals);

}  // namespace kvc::jinja
