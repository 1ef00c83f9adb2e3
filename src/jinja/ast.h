// The syntax tree the parser builds and the interpreter walks. Immutable after parsing.
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "jinja/value.h"

namespace kvc::jinja {

struct Expr;
using ExprPtr = std::unique_ptr<Expr>;

struct Expr {
  enum class Kind {
    kLiteral,  // literal
    kName,     // name
    kAttr,     // args[0].name
    kItem,     // args[0][args[1]]
    kSlice,    // args[0][args[1]:args[2]:args[3]] (each bound may be null)
    kCall,     // args[0](args[1:], kwargs)
    kFilter,   // args[0] | name(args[1:], kwargs); args[0] null in filter blocks
    kTest,     // args[0] is [not] name(args[1:], kwargs)
    kUnary,    // name ("-" or "+") args[0]
    kBinary,   // args[0] name args[1], name one of + - * / // % ** ~
    kAnd,      // args[0] and args[1]
    kOr,       // args[0] or args[1]
    kNot,      // not args[0]
    kCompare,  // args[0] ops[0] args[1] ops[1] args[2] ...
    kCond,     // args[0] if args[1] else args[2] (args[2] may be null)
    kList,     // [args...]
    kTuple,    // (args...)
    kDict,     // {args[0]: args[1], ...}
  };
  Kind kind;
  int line = 0;
  Value literal;
  std::string name;
  std::vector<ExprPtr> args;
  std::vector<std::pair<std::string, ExprPtr>> kwargs;
  std::vector<std::string> ops;
  bool negated = false;
};

struct Stmt;
using StmtPtr = std::unique_ptr<Stmt>;
using Body = std::vector<StmtPtr>;

struct Param {
  std::string name;
  ExprPtr default_value;  // null: required
};

struct Stmt {
  enum class Kind {
    kText,         // text
    kOutput,       // {{ expr }}
    kIf,           // branches (condition, body); else_body
    kFor,          // for targets in expr [if cond]: body; else_body
    kSet,          // set targets = expr, or set targets[0].attr = expr (attr non-empty)
    kSetBlock,     // set targets[0] | filters: body
    kMacro,        // macro name(params): body
    kCallBlock,    // call(params) expr: body
    kFilterBlock,  // filter filters: body
    kBreak,
    kContinue,
    kDo,           // do expr
    kScope,        // with (targets = values): body
    kBody,         // a body with no scope of its own (generation, block, autoescape)
    kUnsupported,  // text names the feature; fails when executed
  };
  Kind kind;
  int line = 0;
  std::string text;
  std::string name;
  std::string attr;
  ExprPtr expr;
  ExprPtr cond;
  std::vector<std::string> targets;
  std::vector<ExprPtr> values;  // with: one per target
  std::vector<std::pair<ExprPtr, Body>> branches;
  Body body;
  Body else_body;
  std::vector<Param> params;
  std::vector<ExprPtr> filters;  // kFilter expressions whose operand is null
  bool recursive = false;
};

}  // namespace kvc::jinja
