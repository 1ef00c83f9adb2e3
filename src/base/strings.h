// Small text helpers shared by the command-line parsers, the reports and the templates.
#pragma once

#include <string>
#include <string_view>

namespace kvc {

// s without leading and trailing ASCII white space.
std::string_view trim(std::string_view s);
// s with ASCII letters lower-cased.
std::string to_lower(std::string_view s);
// s safe as HTML or XML text and attribute values: & < > " ' as character references (as
// Jinja's and markupsafe's escape writes them).
std::string markup_escape(std::string_view s);

}  // namespace kvc
