#include "jinja/parser.h"

#include <fmt/format.h>

#include <initializer_list>

#include "jinja/error.h"

namespace kvc::jinja {

namespace {

class Parser {
 public:
  explicit Parser(const std::vector<Token>& tokens) : t_(tokens) {}

  Body run() {
    std::string end;
    Body body = parse_until({}, end);
    return body;
  }

 private:
  struct DepthGuard {
    explicit DepthGuard(Parser& p) : p(p) {
      if (++p.depth_ > kMaxParseDepth) {
        p.fail(fmt::format("the template nests more than {} levels deep", kMaxParseDepth));
      }
    }
    ~DepthGuard() { --p.depth_; }
    Parser& p;
  };

  const Token& cur() const { return t_[pos_]; }
  const Token& peek(size_t n = 1) const { return t_[std::min(pos_ + n, t_.size() - 1)]; }
  void advance() {
    if (pos_ + 1 < t_.size()) ++pos_;
  }

  [[noreturn]] void fail(const std::string& what) const {
    throw SyntaxError(fmt::format("template syntax error at line {}: {}", cur().line, what));
  }

  static std::string describe(const Token& t) {
    switch (t.type) {
      case TokenType::kEof:
        return "the end of the template";
      case TokenType::kBlockEnd:
        return "'%}'";
      case TokenType::kVarEnd:
        return "'}}'";
      case TokenType::kText:
        return "text";
      case TokenType::kString:
        return "a string";
      default:
        return fmt::format("'{}'", t.text);
    }
  }

  bool is_op(const char* op) const { return cur().type == TokenType::kOp && cur().text == op; }
  bool is_name(const char* n) const { return cur().type == TokenType::kName && cur().text == n; }
  bool skip_op(const char* op) {
    if (!is_op(op)) return false;
    advance();
    return true;
  }
  bool skip_name(const char* n) {
    if (!is_name(n)) return false;
    advance();
    return true;
  }
  void expect_op(const char* op) {
    if (!skip_op(op)) fail(fmt::format("expected '{}', got {}", op, describe(cur())));
  }
  void expect_name(const char* n) {
    if (!skip_name(n)) fail(fmt::format("expected '{}', got {}", n, describe(cur())));
  }
  std::string expect_identifier() {
    if (cur().type != TokenType::kName) fail("expected a name, got " + describe(cur()));
    std::string n = cur().text;
    advance();
    return n;
  }
  void expect_block_end() {
    if (cur().type != TokenType::kBlockEnd) fail("expected '%}', got " + describe(cur()));
    advance();
  }

  ExprPtr make(Expr::Kind k, int line) {
    auto e = std::make_unique<Expr>();
    e->kind = k;
    e->line = line;
    return e;
  }

  // Statements until {% end %} for one of ends; leaves the position on the end tag's name
  // and sets found to it. With no ends, runs to the end of the template.
  Body parse_until(std::initializer_list<const char*> ends, std::string& found) {
    DepthGuard guard(*this);
    Body body;
    for (;;) {
      const Token& t = cur();
      switch (t.type) {
        case TokenType::kEof:
          if (ends.size() != 0) {
            const char* end = *ends.begin();
            for (const char* e : ends) {
              if (std::string_view(e).starts_with("end")) end = e;
            }
            fail(fmt::format("missing {{% {} %}}", end));
          }
          return body;
        case TokenType::kText: {
          auto s = std::make_unique<Stmt>();
          s->kind = Stmt::Kind::kText;
          s->line = t.line;
          s->text = t.text;
          body.push_back(std::move(s));
          advance();
          break;
        }
        case TokenType::kVarBegin: {
          auto s = std::make_unique<Stmt>();
          s->kind = Stmt::Kind::kOutput;
          s->line = t.line;
          advance();
          s->expr = parse_tuple(true, {});
          if (cur().type != TokenType::kVarEnd) fail("expected '}}', got " + describe(cur()));
          advance();
          body.push_back(std::move(s));
          break;
        }
        case TokenType::kBlockBegin: {
          advance();
          if (cur().type != TokenType::kName) fail("expected a tag name, got " + describe(cur()));
          for (const char* e : ends) {
            if (cur().text == e) {
              found = e;
              return body;
            }
          }
          body.push_back(parse_statement());
          break;
        }
        default:
          fail("unexpected " + describe(t));
      }
    }
  }

  // After the end tag's name: skips it and expects '%}'.
  void end_tag() {
    advance();
    expect_block_end();
  }

  StmtPtr parse_statement() {
    auto s = std::make_unique<Stmt>();
    s->line = cur().line;
    const std::string tag = cur().text;
    advance();
    std::string found;
    if (tag == "for") {
      s->kind = Stmt::Kind::kFor;
      s->targets = parse_targets();
      expect_name("in");
      s->expr = parse_tuple(false, {"if", "recursive"});
      if (skip_name("if")) s->cond = parse_expression(true);
      if (skip_name("recursive")) s->recursive = true;
      expect_block_end();
      ++loop_depth_;
      s->body = parse_until({"endfor", "else"}, found);
      --loop_depth_;
      if (found == "else") {
        end_tag();
        s->else_body = parse_until({"endfor"}, found);
      }
      end_tag();
    } else if (tag == "if") {
      s->kind = Stmt::Kind::kIf;
      ExprPtr cond = parse_expression(true);
      expect_block_end();
      for (;;) {
        Body b = parse_until({"elif", "else", "endif"}, found);
        s->branches.emplace_back(std::move(cond), std::move(b));
        if (found == "elif") {
          advance();
          cond = parse_expression(true);
          expect_block_end();
          continue;
        }
        if (found == "else") {
          end_tag();
          s->else_body = parse_until({"endif"}, found);
        }
        end_tag();
        break;
      }
    } else if (tag == "set") {
      const std::string first = expect_identifier();
      s->targets.push_back(first);
      if (skip_op(".")) {
        s->attr = expect_identifier();
      } else {
        while (skip_op(",")) s->targets.push_back(expect_identifier());
      }
      if (skip_op("=")) {
        s->kind = Stmt::Kind::kSet;
        s->expr = parse_tuple(true, {});
        expect_block_end();
      } else {
        if (!s->attr.empty() || s->targets.size() != 1) fail("expected '='");
        s->kind = Stmt::Kind::kSetBlock;
        while (skip_op("|")) s->filters.push_back(parse_filter(nullptr));
        expect_block_end();
        s->body = parse_until({"endset"}, found);
        end_tag();
      }
    } else if (tag == "macro") {
      s->kind = Stmt::Kind::kMacro;
      s->name = expect_identifier();
      s->params = parse_params();
      expect_block_end();
      const int saved = loop_depth_;
      loop_depth_ = 0;
      s->body = parse_until({"endmacro"}, found);
      loop_depth_ = saved;
      end_tag();
    } else if (tag == "call") {
      s->kind = Stmt::Kind::kCallBlock;
      if (is_op("(")) s->params = parse_params();
      s->expr = parse_expression(true);
      if (s->expr->kind != Expr::Kind::kCall) fail("expected a call after {% call");
      expect_block_end();
      const int saved = loop_depth_;
      loop_depth_ = 0;
      s->body = parse_until({"endcall"}, found);
      loop_depth_ = saved;
      end_tag();
    } else if (tag == "filter") {
      s->kind = Stmt::Kind::kFilterBlock;
      s->filters.push_back(parse_filter(nullptr));
      while (skip_op("|")) s->filters.push_back(parse_filter(nullptr));
      expect_block_end();
      s->body = parse_until({"endfilter"}, found);
      end_tag();
    } else if (tag == "break" || tag == "continue") {
      if (loop_depth_ == 0) fail(fmt::format("'{}' outside a loop", tag));
      s->kind = tag == "break" ? Stmt::Kind::kBreak : Stmt::Kind::kContinue;
      expect_block_end();
    } else if (tag == "do") {
      s->kind = Stmt::Kind::kDo;
      s->expr = parse_tuple(true, {});
      expect_block_end();
    } else if (tag == "with") {
      s->kind = Stmt::Kind::kScope;
      while (cur().type != TokenType::kBlockEnd) {
        if (!s->targets.empty()) expect_op(",");
        s->targets.push_back(expect_identifier());
        expect_op("=");
        s->values.push_back(parse_expression(true));
      }
      expect_block_end();
      s->body = parse_until({"endwith"}, found);
      end_tag();
    } else if (tag == "generation" || tag == "autoescape" || tag == "block") {
      s->kind = Stmt::Kind::kBody;
      if (tag == "autoescape") parse_expression(true);
      if (tag == "block") {
        expect_identifier();
        while (cur().type == TokenType::kName) advance();  // scoped, required
      }
      expect_block_end();
      const char* end_name = tag == "generation" ? "endgeneration"
                             : tag == "block"    ? "endblock"
                                                 : "endautoescape";
      s->body = parse_until({end_name}, found);
      advance();
      if (tag == "block" && cur().type == TokenType::kName) advance();
      expect_block_end();
    } else if (tag == "include" || tag == "import" || tag == "from" || tag == "extends") {
      s->kind = Stmt::Kind::kUnsupported;
      s->text = fmt::format("{{% {} %}}", tag);
      while (cur().type != TokenType::kBlockEnd && cur().type != TokenType::kEof) advance();
      expect_block_end();
    } else {
      pos_ -= 1;
      fail(fmt::format("unknown tag '{}'", tag));
    }
    return s;
  }

  std::vector<std::string> parse_targets() {
    std::vector<std::string> names;
    const bool paren = skip_op("(");
    names.push_back(expect_identifier());
    while (skip_op(",")) {
      if (cur().type != TokenType::kName || is_name("in")) break;
      names.push_back(expect_identifier());
    }
    if (paren) expect_op(")");
    return names;
  }

  std::vector<Param> parse_params() {
    std::vector<Param> params;
    expect_op("(");
    while (!is_op(")")) {
      if (!params.empty()) expect_op(",");
      if (is_op(")")) break;
      Param p;
      p.name = expect_identifier();
      if (skip_op("=")) p.default_value = parse_expression(true);
      params.push_back(std::move(p));
    }
    expect_op(")");
    return params;
  }

  bool at_tuple_end(std::initializer_list<const char*> extra_end) const {
    const Token& t = cur();
    if (t.type == TokenType::kBlockEnd || t.type == TokenType::kVarEnd || t.type == TokenType::kEof)
      return true;
    if (t.type == TokenType::kOp && (t.text == ")" || t.text == "]" || t.text == "}")) return true;
    if (t.type == TokenType::kName) {
      for (const char* e : extra_end) {
        if (t.text == e) return true;
      }
    }
    return false;
  }

  ExprPtr parse_tuple(bool with_condexpr, std::initializer_list<const char*> extra_end) {
    const int line = cur().line;
    std::vector<ExprPtr> items;
    bool saw_comma = false;
    for (;;) {
      if (!items.empty()) {
        if (!skip_op(",")) break;
        saw_comma = true;
        if (at_tuple_end(extra_end)) break;
      }
      items.push_back(parse_expression(with_condexpr));
    }
    if (!saw_comma) return std::move(items[0]);
    auto e = make(Expr::Kind::kTuple, line);
    e->args = std::move(items);
    return e;
  }

  ExprPtr parse_expression(bool with_condexpr) {
    DepthGuard guard(*this);
    ExprPtr e = parse_or();
    if (!with_condexpr) return e;
    while (is_name("if")) {
      const int line = cur().line;
      advance();
      auto c = make(Expr::Kind::kCond, line);
      ExprPtr cond = parse_or();
      ExprPtr other = skip_name("else") ? parse_expression(true) : nullptr;
      c->args.push_back(std::move(e));
      c->args.push_back(std::move(cond));
      c->args.push_back(std::move(other));
      e = std::move(c);
    }
    return e;
  }

  ExprPtr binary(Expr::Kind k, std::string op, ExprPtr a, ExprPtr b, int line) {
    auto e = make(k, line);
    e->name = std::move(op);
    e->args.push_back(std::move(a));
    e->args.push_back(std::move(b));
    return e;
  }

  ExprPtr parse_or() {
    ExprPtr e = parse_and();
    while (is_name("or")) {
      const int line = cur().line;
      advance();
      e = binary(Expr::Kind::kOr, "or", std::move(e), parse_and(), line);
    }
    return e;
  }

  ExprPtr parse_and() {
    ExprPtr e = parse_not();
    while (is_name("and")) {
      const int line = cur().line;
      advance();
      e = binary(Expr::Kind::kAnd, "and", std::move(e), parse_not(), line);
    }
    return e;
  }

  ExprPtr parse_not() {
    if (is_name("not")) {
      DepthGuard guard(*this);
      auto e = make(Expr::Kind::kNot, cur().line);
      advance();
      e->args.push_back(parse_not());
      return e;
    }
    return parse_compare();
  }

  ExprPtr parse_compare() {
    const int line = cur().line;
    ExprPtr first = parse_math1();
    std::vector<ExprPtr> operands;
    std::vector<std::string> ops;
    for (;;) {
      const Token& t = cur();
      if (t.type == TokenType::kOp && (t.text == "==" || t.text == "!=" || t.text == "<" ||
                                       t.text == ">" || t.text == "<=" || t.text == ">=")) {
        ops.push_back(t.text);
        advance();
      } else if (is_name("in")) {
        ops.push_back("in");
        advance();
      } else if (is_name("not") && peek().type == TokenType::kName && peek().text == "in") {
        ops.push_back("notin");
        advance();
        advance();
      } else {
        break;
      }
      operands.push_back(parse_math1());
    }
    if (ops.empty()) return first;
    auto e = make(Expr::Kind::kCompare, line);
    e->args.push_back(std::move(first));
    for (auto& o : operands) e->args.push_back(std::move(o));
    e->ops = std::move(ops);
    return e;
  }

  ExprPtr parse_math1() {
    ExprPtr e = parse_concat();
    while (is_op("+") || is_op("-")) {
      const std::string op = cur().text;
      const int line = cur().line;
      advance();
      e = binary(Expr::Kind::kBinary, op, std::move(e), parse_concat(), line);
    }
    return e;
  }

  ExprPtr parse_concat() {
    ExprPtr e = parse_math2();
    while (is_op("~")) {
      const int line = cur().line;
      advance();
      e = binary(Expr::Kind::kBinary, "~", std::move(e), parse_math2(), line);
    }
    return e;
  }

  ExprPtr parse_math2() {
    ExprPtr e = parse_pow();
    while (is_op("*") || is_op("/") || is_op("//") || is_op("%")) {
      const std::string op = cur().text;
      const int line = cur().line;
      advance();
      e = binary(Expr::Kind::kBinary, op, std::move(e), parse_pow(), line);
    }
    return e;
  }

  ExprPtr parse_pow() {
    ExprPtr e = parse_unary(true);
    while (is_op("**")) {
      const int line = cur().line;
      advance();
      e = binary(Expr::Kind::kBinary, "**", std::move(e), parse_unary(true), line);
    }
    return e;
  }

  ExprPtr parse_unary(bool with_filter) {
    DepthGuard guard(*this);
    ExprPtr e;
    if (is_op("-") || is_op("+")) {
      e = make(Expr::Kind::kUnary, cur().line);
      e->name = cur().text;
      advance();
      e->args.push_back(parse_unary(false));
    } else {
      e = parse_primary();
    }
    e = parse_postfix(std::move(e));
    if (with_filter) e = parse_filter_expr(std::move(e));
    return e;
  }

  ExprPtr parse_primary() {
    const Token& t = cur();
    const int line = t.line;
    switch (t.type) {
      case TokenType::kName: {
        auto e = make(Expr::Kind::kLiteral, line);
        if (t.text == "true" || t.text == "True") {
          e->literal = Value(true);
        } else if (t.text == "false" || t.text == "False") {
          e->literal = Value(false);
        } else if (t.text == "none" || t.text == "None") {
          e->literal = Value::none();
        } else {
          e->kind = Expr::Kind::kName;
          e->name = t.text;
        }
        advance();
        return e;
      }
      case TokenType::kString: {
        std::string s;
        while (cur().type == TokenType::kString) {
          s += cur().text;
          advance();
        }
        auto e = make(Expr::Kind::kLiteral, line);
        e->literal = Value(std::move(s));
        return e;
      }
      case TokenType::kInt: {
        auto e = make(Expr::Kind::kLiteral, line);
        e->literal = Value(t.int_value);
        advance();
        return e;
      }
      case TokenType::kFloat: {
        auto e = make(Expr::Kind::kLiteral, line);
        e->literal = Value(t.float_value);
        advance();
        return e;
      }
      case TokenType::kOp:
        if (t.text == "(") {
          advance();
          if (skip_op(")")) return make(Expr::Kind::kTuple, line);
          ExprPtr first = parse_expression(true);
          if (skip_op(")")) return first;
          auto e = make(Expr::Kind::kTuple, line);
          e->args.push_back(std::move(first));
          while (skip_op(",")) {
            if (is_op(")")) break;
            e->args.push_back(parse_expression(true));
          }
          expect_op(")");
          return e;
        }
        if (t.text == "[") {
          advance();
          auto e = make(Expr::Kind::kList, line);
          while (!is_op("]")) {
            if (!e->args.empty()) {
              expect_op(",");
              if (is_op("]")) break;
            }
            e->args.push_back(parse_expression(true));
          }
          expect_op("]");
          return e;
        }
        if (t.text == "{") {
          advance();
          auto e = make(Expr::Kind::kDict, line);
          while (!is_op("}")) {
            if (!e->args.empty()) {
              expect_op(",");
              if (is_op("}")) break;
            }
            e->args.push_back(parse_expression(true));
            expect_op(":");
            e->args.push_back(parse_expression(true));
          }
          expect_op("}");
          return e;
        }
        break;
      default:
        break;
    }
    fail("unexpected " + describe(t));
  }

  ExprPtr parse_postfix(ExprPtr e) {
    for (;;) {
      const int line = cur().line;
      if (is_op(".")) {
        advance();
        if (cur().type == TokenType::kInt) {
          auto item = make(Expr::Kind::kItem, line);
          auto key = make(Expr::Kind::kLiteral, line);
          key->literal = Value(cur().int_value);
          advance();
          item->args.push_back(std::move(e));
          item->args.push_back(std::move(key));
          e = std::move(item);
        } else {
          auto attr = make(Expr::Kind::kAttr, line);
          attr->name = expect_identifier();
          attr->args.push_back(std::move(e));
          e = std::move(attr);
        }
      } else if (is_op("[")) {
        advance();
        e = parse_subscript(std::move(e), line);
      } else if (is_op("(")) {
        e = parse_call(std::move(e));
      } else {
        return e;
      }
    }
  }

  ExprPtr parse_subscript(ExprPtr obj, int line) {
    DepthGuard guard(*this);
    ExprPtr bounds[3];
    bool slice = false;
    int part = 0;
    while (!is_op("]")) {
      if (skip_op(":")) {
        slice = true;
        if (++part > 2) fail("a slice takes at most three parts");
        continue;
      }
      if (bounds[part]) fail("expected ':' or ']', got " + describe(cur()));
      bounds[part] = parse_expression(true);
    }
    expect_op("]");
    if (!slice) {
      if (!bounds[0]) fail("empty subscript");
      auto e = make(Expr::Kind::kItem, line);
      e->args.push_back(std::move(obj));
      e->args.push_back(std::move(bounds[0]));
      return e;
    }
    auto e = make(Expr::Kind::kSlice, line);
    e->args.push_back(std::move(obj));
    for (auto& b : bounds) e->args.push_back(std::move(b));
    return e;
  }

  void parse_call_args(Expr& e) {
    DepthGuard guard(*this);
    expect_op("(");
    bool any = false;
    while (!is_op(")")) {
      if (any) {
        expect_op(",");
        if (is_op(")")) break;
      }
      any = true;
      if (is_op("*") || is_op("**")) fail("*args and **kwargs in calls are not supported");
      if (cur().type == TokenType::kName && peek().type == TokenType::kOp && peek().text == "=") {
        std::string key = cur().text;
        advance();
        advance();
        e.kwargs.emplace_back(std::move(key), parse_expression(true));
      } else {
        if (!e.kwargs.empty()) fail("a positional argument follows a keyword argument");
        e.args.push_back(parse_expression(true));
      }
    }
    expect_op(")");
  }

  ExprPtr parse_call(ExprPtr callee) {
    auto e = make(Expr::Kind::kCall, cur().line);
    e->args.push_back(std::move(callee));
    parse_call_args(*e);
    return e;
  }

  ExprPtr parse_filter(ExprPtr operand) {
    auto e = make(Expr::Kind::kFilter, cur().line);
    e->name = expect_identifier();
    while (skip_op(".")) e->name = fmt::format("{}.{}", e->name, expect_identifier());
    e->args.push_back(std::move(operand));
    if (is_op("(")) parse_call_args(*e);
    return e;
  }

  ExprPtr parse_filter_expr(ExprPtr e) {
    for (;;) {
      if (skip_op("|")) {
        e = parse_filter(std::move(e));
      } else if (is_name("is")) {
        const int line = cur().line;
        advance();
        auto test = make(Expr::Kind::kTest, line);
        test->negated = skip_name("not");
        test->name = expect_identifier();
        while (skip_op(".")) test->name = fmt::format("{}.{}", test->name, expect_identifier());
        test->args.push_back(std::move(e));
        const Token& t = cur();
        if (is_op("(")) {
          parse_call_args(*test);
        } else if ((t.type == TokenType::kName || t.type == TokenType::kString ||
                    t.type == TokenType::kInt || t.type == TokenType::kFloat || is_op("[") ||
                    is_op("{")) &&
                   !is_name("else") && !is_name("or") && !is_name("and") && !is_name("if") &&
                   !is_name("is") && !is_name("in") && !is_name("not")) {
          test->args.push_back(parse_postfix(parse_primary()));
        }
        e = std::move(test);
      } else if (is_op("(")) {
        e = parse_call(std::move(e));
      } else {
        return e;
      }
    }
  }

  const std::vector<Token>& t_;
  size_t pos_ = 0;
  int depth_ = 0;
  int loop_depth_ = 0;
};

}  // namespace

Body parse(const std::vector<Token>& tokens) {
  return Parser(tokens).run();
}

}  // namespace kvc::jinja
