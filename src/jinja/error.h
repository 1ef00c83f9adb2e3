// Errors of the Jinja interpreter. Thread-safe: plain exception types.
//
// Every error is a kvc::Error, so callers that only need a message can catch that. Callers
// that map errors to outcomes (the server: 400 or 500) catch the specific types:
//   SyntaxError       the template does not parse (at load time)
//   RaisedError       the template called raise_exception(msg); what() is msg, unchanged
//   UnsupportedError  the template uses a Jinja feature this interpreter does not have
//   LimitError        rendering hit a resource limit (steps, bytes, nesting)
//   RenderError       any other failure while rendering (type errors, undefined values)
#pragma once

#include <string>

#include "base/error.h"

namespace kvc::jinja {

class TemplateError : public Error {
 public:
  using Error::Error;
};

class SyntaxError : public TemplateError {
 public:
  using TemplateError::TemplateError;
};

class RenderError : public TemplateError {
 public:
  using TemplateError::TemplateError;
};

class RaisedError : public TemplateError {
 public:
  using TemplateError::TemplateError;
};

class UnsupportedError : public TemplateError {
 public:
  // feature: what is missing, e.g. "filter 'groupby'".
  explicit UnsupportedError(const std::string& feature)
      : TemplateError("the chat template uses " + feature +
                      ", which kvcache's Jinja interpreter does not support"),
        feature_(feature) {}
  const std::string& feature() const { return feature_; }

 private:
  std::string feature_;
};

class LimitError : public RenderError {
 public:
  using RenderError::RenderError;
};

}  // namespace kvc::jinja
