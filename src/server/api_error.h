// Errors the HTTP API returns, in the OpenAI shape
// {"error": {"message", "type", "param", "code"}}, with their HTTP status.
#pragma once

#include <nlohmann/json.hpp>
#include <string>

#include "base/error.h"

namespace kvc::server {

class ApiError : public Error {
 public:
  // status: the HTTP status; type: the OpenAI error type ("invalid_request_error", ...);
  // param: the request field at fault, or "" for none; code: a machine-readable code or "".
  ApiError(int status, std::string type, const std::string& message, std::string param = {},
           std::string code = {});
  // The parts given to the constructor.
  int status() const { return status_; }
  const std::string& type() const { return type_; }
  const std::string& param() const { return param_; }
  const std::string& code() const { return code_; }
  // {"error": {...}}, with null for an empty param or code.
  nlohmann::json to_json() const;

 private:
  int status_;
  std::string type_, param_, code_;
};

// 400 invalid_request_error naming the field at fault.
[[noreturn]] void bad_field(const std::string& param, const std::string& message);

// 405 for a known path asked with a method it does not take; allow lists the ones it does
// (the value of the response's Allow header).
ApiError method_not_allowed(const std::string& method, const std::string& path,
                            const std::string& allow);

// The error body for a status that no handler produced (404 route, 413 body, 400 framing).
ApiError error_for_status(int status, const std::string& method, const std::string& path,
                          size_t max_body_bytes);

}  // namespace kvc::server
