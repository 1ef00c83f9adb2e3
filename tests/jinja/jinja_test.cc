// Unit tests of the Jinja interpreter: each statement, filter, test, whitespace rule and
// error. The expected renderings are Jinja's semantics as jinja2 3.1 renders them with
// Hugging Face's settings (trim_blocks, lstrip_blocks, tojson as json.dumps).
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "jinja/template.h"

namespace kvc::jinja {
namespace {

using ::testing::HasSubstr;

std::string render(const std::string& source, const std::string& context = "{}",
                   const RenderOptions& options = {}) {
  return Template::parse(source).render_json(nlohmann::ordered_json::parse(context), options);
}

struct Case {
  const char* name;
  const char* source;
  const char* context;  // JSON object
  const char* expected;
};

// clang-format off
const Case kCases[] = {
    {"text", "hello", "{}", "hello"},
    {"trailing_newline_dropped", "a\n", "{}", "a"},
    {"only_one_trailing_newline", "a\n\n", "{}", "a\n"},
    {"crlf_normalised", "a\r\nb\rc", "{}", "a\nb\nc"},
    {"var", "{{ x }}", "{\"x\": \"v\"}", "v"},
    {"undefined_prints_empty", "[{{ nope }}]", "{}", "[]"},
    {"none_prints_None", "{{ none }}|{{ None }}", "{}", "None|None"},
    {"bools", "{{ true }} {{ False }}", "{}", "True False"},
    {"ints_floats", "{{ 1 + 2 }} {{ 7 / 2 }} {{ 7 // 2 }} {{ -7 // 2 }} {{ -7 % 3 }} {{ 2 ** 10 }} {{ 1.0 }} {{ 1e16 }} {{ 0.0001 }} {{ 1.5e-5 }} {{ 3 * 1.5 }}", "{}", "3 3.5 3 -4 2 1024 1.0 1e+16 0.0001 1.5e-05 4.5"},
    {"string_ops", "{{ 'a' + 'b' }} {{ 'ab' * 3 }} {{ 1 ~ 'x' ~ none }}", "{}", "ab ababab 1xNone"},
    {"escapes", "{{ 'a\\nb\\t\\'\\\"\\\\ \\u00e9\\x41' }}", "{}", "a\nb\t'\"\\ \xc3""\xa9""A"},
    {"compare", "{{ 1 < 2 }} {{ 2 <= 1 }} {{ 'a' == 'a' }} {{ 1 == 1.0 }} {{ 1 != 2 }} {{ 1 < 2 < 3 }} {{ 3 > 2 > 2 }}", "{}", "True False True True True True False"},
    {"in", "{{ 'a' in 'cat' }} {{ 2 in [1,2] }} {{ 'k' in {'k': 1} }} {{ 3 not in [1] }} {{ 'x' in nope }}", "{}", "True True True True False"},
    {"and_or_values", "{{ 0 or 'y' }} {{ 'x' and 'y' }} {{ '' and 'y' }}|{{ not 0 }}", "{}", "y y |True"},
    {"ternary", "{{ 'a' if x else 'b' }}{{ 'c' if not x }}", "{\"x\": false}", "bc"},
    {"list_dict_repr", "{{ [1, 'a', none, true, 1.5] }} {{ {'a': [1], 'b': {'c': \"it's\"}} }} {{ (1,) }} {{ (1, 2) }}", "{}", "[1, 'a', None, True, 1.5] {'a': [1], 'b': {'c': \"it's\"}} (1,) (1, 2)"},
    {"if_elif_else", "{% for x in [1,2,3] %}{% if x == 1 %}one{% elif x == 2 %}two{% else %}many{% endif %};{% endfor %}", "{}", "one;two;many;"},
    {"for_loop_vars", "{% for x in 'abc' %}{{ loop.index }}{{ loop.index0 }}{{ loop.revindex }}{{ loop.revindex0 }}{{ loop.first }}{{ loop.last }}{{ loop.length }}{{ loop.previtem }}{{ loop.nextitem }}|{% endfor %}", "{}", "1032TrueFalse3b|2121FalseFalse3ac|3210FalseTrue3b|"},
    {"for_else", "{% for x in [] %}x{% else %}empty{% endfor %}", "{}", "empty"},
    {"for_filter", "{% for x in range(10) if x % 3 == 0 %}{{ x }}{{ loop.length }},{% endfor %}", "{}", "04,34,64,94,"},
    {"for_unpack", "{% for k, v in {'a': 1, 'b': 2}.items() %}{{ k }}={{ v }};{% endfor %}{% for a, b in [[1, 2], (3, 4)] %}{{ a + b }}{% endfor %}", "{}", "a=1;b=2;37"},
    {"for_dict_iterates_keys", "{% for k in {'z': 1, 'a': 2} %}{{ k }}{% endfor %}", "{}", "za"},
    {"loop_cycle", "{% for x in range(4) %}{{ loop.cycle('a', 'b', 'c') }}{% endfor %}", "{}", "abca"},
    {"break_continue", "{% for x in range(10) %}{% if x == 2 %}{% continue %}{% endif %}{% if x == 5 %}{% break %}{% endif %}{{ x }}{% endfor %}", "{}", "0134"},
    {"nested_loops", "{% for a in [1,2] %}{% for b in 'xy' %}{{ loop.index }}{{ a }}{{ b }} {% endfor %}{{ loop.index }}|{% endfor %}", "{}", "11x 21y 1|12x 22y 2|"},
    {"set_scoping", "{% set x = 1 %}{% for i in [1] %}{% set x = 2 %}{{ x }}{% endfor %}{{ x }}{% if true %}{% set x = 3 %}{% endif %}{{ x }}", "{}", "213"},
    {"namespace", "{% set ns = namespace(n=0, s='') %}{% for i in range(3) %}{% set ns.n = ns.n + i %}{% set ns.s = ns.s ~ i %}{% endfor %}{{ ns.n }} {{ ns.s }}", "{}", "3 012"},
    {"set_tuple", "{% set a, b = 1, 2 %}{{ a }}{{ b }}", "{}", "12"},
    {"set_block", "{% set x %}  in {{ 1 + 1 }}  {% endset %}[{{ x }}]{% set y | upper %}abc{% endset %}{{ y }}", "{}", "[  in 2  ]ABC"},
    {"macro", "{% macro greet(name, punct='!') %}Hi {{ name }}{{ punct }}{% endmacro %}{{ greet('a') }} {{ greet('b', '?') }} {{ greet(punct='.', name='c') }} [{{ greet() }}]", "{}", "Hi a! Hi b? Hi c. [Hi !]"},
    {"macro_call_block", "{% macro wrap(t) %}<{{ t }}>{{ caller() }}</{{ t }}>{% endmacro %}{% call wrap('b') %}inside{% endcall %}", "{}", "<b>inside</b>"},
    {"call_block_args", "{% macro each(xs) %}{% for x in xs %}{{ caller(x) }}{% endfor %}{% endmacro %}{% call(item) each([1,2]) %}[{{ item }}]{% endcall %}", "{}", "[1][2]"},
    {"filter_block", "{% filter upper %}abc {{ 'd' }}{% endfilter %}", "{}", "ABC D"},
    {"raw", "{% raw %}{{ not rendered }}{% endraw %}", "{}", "{{ not rendered }}"},
    {"comment", "a{# comment #}b", "{}", "ab"},
    {"with", "{% with a = 1, b = 2 %}{{ a + b }}{% endwith %}[{{ a }}]", "{}", "3[]"},
    {"ws_minus", "a  {{- 'b' -}}  c {%- if true -%}  d  {%- endif -%} e", "{}", "abcde"},
    {"ws_trim_blocks", "{% if true %}\nx\n{% endif %}\ny", "{}", "x\ny"},
    {"ws_lstrip_blocks", "  {% if true %}\n    x\n  {% endif %}\nz", "{}", "    x\nz"},
    {"ws_lstrip_not_var", "  {{ 'v' }}\n", "{}", "  v"},
    {"ws_plus", "  {%+ if true +%}\nx{% endif %}", "{}", "  \nx"},
    {"ws_comment_trim", "a\n  {# c #}\nb", "{}", "a\nb"},
    {"ws_lstrip_mid_line", "x {% if true %}y{% endif %}", "{}", "x y"},
    {"slicing", "{{ [1,2,3,4][1:] }} {{ [1,2,3,4][:-1] }} {{ [1,2,3,4][::-1] }} {{ 'h\xc3""\xa9""llo'[1:3] }} {{ 'abc'[-1] }} {{ [1,2,3][-1] }} {{ 'abcdef'[::2] }} {{ [1,2,3][5:] }}", "{}", "[2, 3, 4] [1, 2, 3] [4, 3, 2, 1] \xc3""\xa9""l c 3 ace []"},
    {"subscript_attr", "{{ d.a }} {{ d['a'] }} {{ d.b.c }} {{ l.0 }} {{ d.missing }}|", "{\"d\": {\"a\": 1, \"b\": {\"c\": 2}}, \"l\": [9]}", "1 1 2 9 |"},
    {"dict_methods", "{{ d.get('a') }} {{ d.get('x', 'def') }} {{ d.get('x') }} {{ d.keys() | list }} {{ d.values() | list }} {{ d.items() | list }}", "{\"d\": {\"a\": 1, \"b\": 2}}", "1 def None ['a', 'b'] [1, 2] [('a', 1), ('b', 2)]"},
    {"string_methods", "{{ '  x  '.strip() }}|{{ 'xxaxx'.strip('x') }}|{{ '  x '.lstrip() }}|{{ ' x  '.rstrip() }}|{{ 'a,b,,c'.split(',') }}|{{ ' a  b '.split() }}|{{ 'a b c'.split(' ', 1) }}|{{ 'a.b.c'.rsplit('.', 1) }}", "{}", "x|a|x | x|['a', 'b', '', 'c']|['a', 'b']|['a', 'b c']|['a.b', 'c']"},
    {"string_methods2", "{{ 'abc'.startswith('ab') }} {{ 'abc'.endswith(('x', 'c')) }} {{ 'aBc'.upper() }} {{ 'aBc'.lower() }} {{ 'hello world'.title() }} {{ 'hello World'.capitalize() }} {{ 'aaa'.replace('a', 'b', 2) }} {{ '{} and {}'.format(1, 'x') }} {{ ', '.join(['a', 'b']) }} {{ 'abcb'.find('b') }} {{ 'abcb'.count('b') }}", "{}", "True True ABC abc Hello World Hello world bba 1 and x a, b 1 2"},
    {"filters_basic", "{{ '  x '|trim }}|{{ [1,2,3]|length }}|{{ 'h\xc3""\xa9""llo'|length }}|{{ {'a':1}|count }}|{{ [3,1,2]|sort }}|{{ [3,1,2]|sort(reverse=true) }}|{{ ['b','A','a']|sort }}|{{ [1,2]|first }}|{{ [1,2]|last }}|{{ 'ab'|list }}|{{ ['a', 'b']|join('-') }}|{{ [1, 2]|join }}", "{}", "x|3|5|1|[1, 2, 3]|[3, 2, 1]|['A', 'a', 'b']|1|2|['a', 'b']|a-b|12"},
    {"filters_default", "{{ nope|default('d') }}|{{ ''|default('d') }}|{{ ''|default('d', true) }}|{{ none|default('d') }}|{{ nope|d('x') }}", "{}", "d||d|None|x"},
    {"filters_case", "{{ 'abc'|upper }} {{ 'ABC'|lower }} {{ 'abc def'|capitalize }} {{ 'abc def'|title }} {{ 'aXa'|replace('a', 'b') }}", "{}", "ABC abc Abc def Abc Def bXb"},
    {"filters_numbers", "{{ '42'|int }} {{ '4.7'|int }} {{ 'x'|int }} {{ 'x'|int(7) }} {{ 3.9|int }} {{ '2.5'|float }} {{ -3|abs }} {{ 2.567|round(2) }} {{ 2.5|round }} {{ [1,2,3]|sum }} {{ [1,5,3]|max }} {{ [4,2,3]|min }}", "{}", "42 4 0 7 3 2.5 3 2.57 2.0 6 5 2"},
    {"filters_items_dictsort", "{{ {'b': 1, 'a': 2}|items|list }} {{ {'b': 1, 'a': 2}|dictsort }}", "{}", "[('b', 1), ('a', 2)] [('a', 2), ('b', 1)]"},
    {"filters_select", "{{ [1,2,3,4]|select('odd')|list }} {{ [1,2,3,4]|reject('odd')|list }} {{ [0,1,'',2]|select|list }} {{ ms|selectattr('role', 'equalto', 'user')|map(attribute='content')|list }} {{ ms|rejectattr('role', 'eq', 'user')|list|length }} {{ ms|selectattr('x')|list }}", "{\"ms\": [{\"role\": \"user\", \"content\": \"a\"}, {\"role\": \"assistant\", \"content\": \"b\", \"x\": 1}]}", "[1, 3] [2, 4] [1, 2] ['a'] 1 [{'role': 'assistant', 'content': 'b', 'x': 1}]"},
    {"filters_map", "{{ ['a','b']|map('upper')|list }} {{ ms|map(attribute='n', default=0)|list }} {{ [1,2,2,1]|unique|list }} {{ [1,2]|reverse|list }} {{ 'abc'|reverse }}", "{\"ms\": [{\"n\": 1}, {}]}", "['A', 'B'] [1, 0] [1, 2] [2, 1] cba"},
    {"filters_string", "{{ 42|string }} {{ none|string }} {{ [1]|string }} {{ 'x'|safe }} {{ '<a href=\"x\">&\\''|e }} {{ 'a b  c'|wordcount }} {{ '%s-%d'|format('a', 3) }} {{ 'abc'|center(7) }}|", "{}", "42 None [1] x &lt;a href=&#34;x&#34;&gt;&amp;&#39; 3 a-3   abc  |"},
    {"filters_indent", "{{ 'a\nb\n\nc'|indent(2) }}|{{ 'a\nb'|indent(2, true) }}|{{ 'a\n\nb'|indent(2, blank=true) }}", "{}", "a\n  b\n\n  c|  a\n  b|a\n  \n  b"},
    {"tojson", "{{ x|tojson }}|{{ x|tojson(indent=2) }}|{{ '\xc3""\xa9""\"\\n<'|tojson }}|{{ [1.0, 1e20, none, true]|tojson }}|{{ {}|tojson }}|{{ []|tojson(indent=4) }}", "{\"x\": {\"b\": [1, {\"c\": \"d\"}], \"a\": null}}", "{\"b\": [1, {\"c\": \"d\"}], \"a\": null}|{\n  \"b\": [\n    1,\n    {\n      \"c\": \"d\"\n    }\n  ],\n  \"a\": null\n}|\"\xc3""\xa9""\\\"\\n<\"|[1.0, 1e+20, null, true]|{}|[]"},
    {"tests", "{{ x is defined }} {{ nope is undefined }} {{ none is none }} {{ 'a' is string }} {{ {} is mapping }} {{ [] is iterable }} {{ 'a' is iterable }} {{ 1 is number }} {{ 1.5 is float }} {{ 1 is integer }} {{ true is boolean }} {{ true is true }} {{ 0 is false }} {{ [] is sequence }} {{ 3 is odd }} {{ 4 is even }} {{ 9 is divisibleby 3 }} {{ 1 is in [1] }} {{ 'a' is not string }} {{ x is sameas x }} {{ 2 is gt 1 }} {{ 'ab' is lower }} {{ x is callable }} {{ range is callable }}", "{\"x\": 1}", "True True True True True True True True True True True True False True True True True True False True True True False True"},
    {"undefined_tests", "{{ nope is iterable }} {{ nope is sequence }} {{ nope is string }} {{ nope|length }} {{ nope|list }} {{ nope|join }}|{% for x in nope %}x{% endfor %}|{{ nope is none }}", "{}", "True True False 0 [] ||False"},
    {"attr_of_missing", "{{ m.tool_calls is defined }} {{ m.content.content is defined }} {{ m.content is string }}", "{\"m\": {\"content\": \"s\"}}", "False False True"},
    {"none_attr", "[{{ n.x }}] {{ n.x is defined }}", "{\"n\": null}", "[] False"},
    {"set_messages_slice", "{% set messages = messages[1:] %}{% for m in messages %}{{ m.role }}{% endfor %}", "{\"messages\": [{\"role\": \"system\"}, {\"role\": \"user\"}]}", "user"},
    {"strftime_fixed", "{{ strftime_now('%Y') | length }}", "{}", "4"},
    {"range", "{{ range(3)|list }} {{ range(1, 7, 2)|list }} {{ range(3, 0, -1)|list }}", "{}", "[0, 1, 2] [1, 3, 5] [3, 2, 1]"},
    {"dict_global", "{{ dict(a=1, b='x') }} {{ dict(a=1).a }}", "{}", "{'a': 1, 'b': 'x'} 1"},
    {"joiner", "{% set j = joiner(', ') %}{% for x in 'abc' %}{{ j() }}{{ x }}{% endfor %}", "{}", "a, b, c"},
    {"percent", "{{ '%s is %s' % ('a', 1) }} {{ '%d%%' % 5 }}", "{}", "a is 1 5%"},
    {"loop_in_macro_scope", "{% set g = 'G' %}{% macro m() %}{{ g }}{% endmacro %}{{ m() }}", "{}", "G"},
    {"string_concat_number_in_tilde", "{{ 'n=' ~ 1.5 ~ ' ' ~ [1] }}", "{}", "n=1.5 [1]"},
    {"unicode_upper_ascii_only", "{{ 'abc'|upper }}", "{}", "ABC"},
    {"is_not_precedence", "{{ not x is defined }} {{ not nope is defined }}", "{\"x\": 1}", "False True"},
    {"filter_precedence", "{{ -1|abs }} {{ 'a' ~ 'b'|upper }} {{ 1 ~ 2|string }}", "{}", "1 aB 12"},
    {"neg_index_message", "{{ messages[-1].content }}", "{\"messages\": [{\"content\": \"a\"}, {\"content\": \"b\"}]}", "b"},
    {"content_list", "{% for p in m.content %}{% if p.type == 'text' %}{{ p.text }}{% endif %}{% endfor %}", "{\"m\": {\"content\": [{\"type\": \"text\", \"text\": \"hi\"}, {\"type\": \"image\"}]}}", "hi"},
    {"do_stmt", "{% do [1].index(1) %}ok", "{}", "ok"},
    {"int_tostring_loop", "{% for i in range(3) %}{{ i }}{{ ',' if not loop.last }}{% endfor %}", "{}", "0,1,2"},
    {"multiline_tag", "{{\n  'a'\n  ~ 'b'\n}}", "{}", "ab"},
    {"nested_dict_literal_in_var", "{{ {'a': {'b': 1}} }}", "{}", "{'a': {'b': 1}}"},
    {"string_compare", "{{ 'a' < 'b' }} {{ [1, 2] < [1, 3] }}", "{}", "True True"},
    {"split_last", "{{ 'x</think>y'.split('</think>')[-1] }}", "{}", "y"},
};
// clang-format on

TEST(Jinja, RendersAsJinja2Does) {
  for (const Case& c : kCases) {
    SCOPED_TRACE(c.name);
    try {
      EXPECT_EQ(render(c.source, c.context), c.expected) << c.source;
    } catch (const std::exception& e) {
      ADD_FAILURE() << c.source << " threw " << e.what();
    }
  }
}

template <typename E>
std::string error_of(const std::string& source, const std::string& context = "{}",
                     const RenderOptions& options = {}) {
  try {
    render(source, context, options);
  } catch (const E& e) {
    return e.what();
  } catch (const std::exception& e) {
    return std::string("wrong exception type: ") + e.what();
  }
  return "no error";
}

TEST(Jinja, RaiseExceptionCarriesTheTemplatesMessage) {
  EXPECT_EQ(error_of<RaisedError>("{{ raise_exception('Roles must alternate') }}"),
            "Roles must alternate");
  EXPECT_EQ(error_of<RaisedError>("{% if true %}{{ raise_exception('x' ~ 1) }}{% endif %}"), "x1");
}

TEST(Jinja, RuntimeErrorsWhereJinja2Raises) {
  EXPECT_THAT(error_of<RenderError>("{{ nope + 1 }}"), HasSubstr("'nope' is undefined"));
  EXPECT_THAT(error_of<RenderError>("{{ nope.x }}"), HasSubstr("'nope' is undefined"));
  EXPECT_THAT(error_of<RenderError>("{{ nope[0] }}"), HasSubstr("'nope' is undefined"));
  EXPECT_THAT(error_of<RenderError>("{{ nope() }}"), HasSubstr("'nope' is undefined"));
  EXPECT_THAT(error_of<RenderError>("{{ 'a' + 1 }}"), HasSubstr("unsupported operand"));
  EXPECT_THAT(error_of<RenderError>("{{ 1 / 0 }}"), HasSubstr("division by zero"));
  EXPECT_THAT(error_of<RenderError>("{% set d = {} %}{% set d.x = 1 %}"),
              HasSubstr("only on a namespace"));
  EXPECT_THAT(error_of<RenderError>("{{ nope|tojson }}"), HasSubstr("not JSON serializable"));
  EXPECT_THAT(error_of<RenderError>("{% set l = [] %}{{ l.append(1) }}"), HasSubstr("unsafe"));
  EXPECT_THAT(error_of<RenderError>("{% for x in none %}{% endfor %}"), HasSubstr("not iterable"));
  EXPECT_THAT(error_of<RenderError>("{{ 1 < 'a' }}"), HasSubstr("not supported"));
  EXPECT_THAT(error_of<RenderError>("{{ 9223372036854775807 + 1 }}"),
              HasSubstr("integer overflow"));
  EXPECT_THAT(error_of<RenderError>("{% set a, b = [1] %}"), HasSubstr("unpack"));
}

TEST(Jinja, SyntaxErrorsNameTheLineAndProblem) {
  EXPECT_THAT(error_of<SyntaxError>("{% if x %}a"), HasSubstr("missing {% endif %}"));
  EXPECT_THAT(error_of<SyntaxError>("\n{% frobnicate %}"),
              HasSubstr("line 2: unknown tag 'frobnicate'"));
  EXPECT_THAT(error_of<SyntaxError>("{{ x "), HasSubstr("unterminated {{"));
  EXPECT_THAT(error_of<SyntaxError>("{{ 1 + }}"), HasSubstr("unexpected '}}'"));
  EXPECT_THAT(error_of<SyntaxError>("{{ 'abc }}"), HasSubstr("unterminated string"));
  EXPECT_THAT(error_of<SyntaxError>("{% endfor %}"), HasSubstr("unknown tag 'endfor'"));
  EXPECT_THAT(error_of<SyntaxError>("{% break %}"), HasSubstr("'break' outside a loop"));
  EXPECT_THAT(error_of<SyntaxError>("{# abc"), HasSubstr("unterminated comment"));
  EXPECT_THAT(error_of<SyntaxError>("{% raw %}abc"), HasSubstr("endraw"));
  EXPECT_THAT(error_of<SyntaxError>("{{ 99999999999999999999 }}"), HasSubstr("too large"));
  EXPECT_THAT(error_of<SyntaxError>("{{ a ! b }}"), HasSubstr("unexpected character '!'"));
}

TEST(Jinja, UnsupportedFeaturesAreNamedWhenReached) {
  // Parsing succeeds; the error comes only if rendering reaches the feature.
  const Template t = Template::parse("{% if x %}{{ y|groupby('a') }}{% endif %}ok");
  EXPECT_EQ(t.render_json({{"x", false}}), "ok");
  try {
    t.render_json({{"x", true}, {"y", nlohmann::ordered_json::array()}});
    FAIL();
  } catch (const UnsupportedError& e) {
    EXPECT_EQ(e.feature(), "filter 'groupby'");
    EXPECT_THAT(e.what(), HasSubstr("does not support"));
  }
  EXPECT_THAT(error_of<UnsupportedError>("{{ 1 is frobnicated }}"),
              HasSubstr("test 'frobnicated'"));
  EXPECT_THAT(error_of<UnsupportedError>("{% include 'x.jinja' %}"), HasSubstr("{% include %}"));
  EXPECT_THAT(error_of<UnsupportedError>("{{ 'a'.encode() }}"), HasSubstr("str.encode"));
  EXPECT_THAT(error_of<UnsupportedError>("{{ cycler(1) }}"), HasSubstr("cycler"));
}

TEST(Jinja, HuggingFaceExtras) {
  EXPECT_EQ(render("{% generation %}g{% endgeneration %}"), "g");
  RenderOptions fixed;
  fixed.now = [] { return std::time_t{86400 * 365}; };  // 1971-01-01 UTC
  EXPECT_EQ(render("{{ strftime_now('%Y') }}", "{}", fixed).substr(0, 3), "197");
  EXPECT_EQ(render("{{ x|tojson }}", R"({"x": {"b": 1, "a": [1.5, "é"]}})"),
            R"({"b": 1, "a": [1.5, "é"]})");
}

TEST(Jinja, FloatsPrintAsPython) {
  EXPECT_EQ(python_float_repr(1.0), "1.0");
  EXPECT_EQ(python_float_repr(0.1), "0.1");
  EXPECT_EQ(python_float_repr(-2.5), "-2.5");
  EXPECT_EQ(python_float_repr(1e16), "1e+16");
  EXPECT_EQ(python_float_repr(1.5e-5), "1.5e-05");
  EXPECT_EQ(python_float_repr(123456789012345.0), "123456789012345.0");
  EXPECT_EQ(python_float_repr(0.0001), "0.0001");
  EXPECT_EQ(python_float_repr(1.0 / 0.0), "inf");
}

TEST(Jinja, LimitsStopHostileTemplates) {
  RenderOptions small;
  small.limits.max_steps = 10000;
  EXPECT_THAT(error_of<LimitError>("{% for i in range(100000) %}{% endfor %}", "{}", small),
              HasSubstr("steps"));
  RenderOptions few_bytes;
  few_bytes.limits.max_bytes = 1 << 20;
  EXPECT_THAT(error_of<LimitError>(
                  "{% set ns = namespace(s='xx') %}{% for i in range(64) %}{% set ns.s = ns.s ~ "
                  "ns.s %}{% endfor %}",
                  "{}", few_bytes),
              HasSubstr("bytes"));
  EXPECT_THAT(error_of<LimitError>("{% set ns = namespace(l=[1]) %}{% for i in range(64) %}"
                                   "{% set ns.l = ns.l + ns.l %}{% endfor %}",
                                   "{}", few_bytes),
              HasSubstr("bytes"));
  EXPECT_THAT(error_of<LimitError>("{{ 'x' * 9000000000000000000 }}"), HasSubstr("bytes"));
  small.limits.max_output_bytes = 100;
  EXPECT_THAT(error_of<LimitError>("{% for i in range(1000) %}abc{% endfor %}", "{}", small),
              HasSubstr("output"));
  EXPECT_THAT(error_of<LimitError>("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}"),
              HasSubstr("deep"));
  EXPECT_THAT(error_of<LimitError>("{% set ns = namespace(l=[]) %}{% for i in range(1000) %}"
                                   "{% set ns.l = [ns.l] %}{% endfor %}"),
              HasSubstr("nest"));
  // Deeply nested syntax is refused when parsing.
  EXPECT_THAT(
      error_of<SyntaxError>("{{ " + std::string(5000, '(') + "1" + std::string(5000, ')') + " }}"),
      HasSubstr("nests more than"));
  // Namespaces that hold each other are freed (LeakSanitizer checks under ASan).
  EXPECT_EQ(render("{% set a = namespace() %}{% set b = namespace(a=a) %}{% set a.b = b %}"
                   "{% set a.a = a %}ok"),
            "ok");
}

TEST(Jinja, TemplatesAreReusableAndValuesIsolated) {
  const Template t = Template::parse(
      "{% set ns = namespace(n=0) %}{% for m in messages %}"
      "{% set ns.n = ns.n + 1 %}{% endfor %}{{ ns.n }}");
  EXPECT_EQ(t.render_json({{"messages", {1, 2, 3}}}), "3");
  EXPECT_EQ(t.render_json({{"messages", {1}}}), "1");
}

}  // namespace
}  // namespace kvc::jinja
