#include "server/api_error.h"

#include <fmt/format.h>

namespace kvc::server {

ApiError::ApiError(int status, std::string type, const std::string& message, std::string param,
                   std::string code)
    : Error(message),
      status_(status),
      type_(std::move(type)),
      param_(std::move(param)),
      code_(std::move(code)) {}

nlohmann::json ApiError::to_json() const {
  nlohmann::json e = {{"message", what()}, {"type", type_}, {"param", nullptr}, {"code", nullptr}};
  if (!param_.empty()) e["param"] = param_;
  if (!code_.empty()) e["code"] = code_;
  return {{"error", e}};
}

void bad_field(const std::string& param, const std::string& message) {
  throw ApiError(400, "invalid_request_error", message, param);
}

ApiError method_not_allowed(const std::string& method, const std::string& path,
                            const std::string& allow) {
  return ApiError(405, "invalid_request_error",
                  fmt::format("Method Not Allowed: {} {} (it takes {})", method, path, allow), "",
                  "method_not_allowed");
}

ApiError error_for_status(int status, const std::string& method, const std::string& path,
                          size_t max_body_bytes) {
  switch (status) {
    case 404:
      return ApiError(404, "not_found_error", fmt::format("no route for {} {}", method, path), "",
                      "not_found");
    case 413:
      return ApiError(413, "invalid_request_error",
                      fmt::format("the request body is larger than the limit of {} bytes "
                                  "(--max-body)",
                                  max_body_bytes),
                      "", "request_too_large");
    case 414:
      return ApiError(414, "invalid_request_error",
                      "the request line is longer than the limit of 8192 bytes", "",
                      "uri_too_long");
    case 400:
      return ApiError(400, "invalid_request_error",
                      "malformed HTTP request (or a header line longer than the limit of 8192 "
                      "bytes)");
    default:
      return ApiError(status, status >= 500 ? "server_error" : "invalid_request_error",
                      fmt::format("HTTP status {}", status));
  }
}

}  // namespace kvc::server
