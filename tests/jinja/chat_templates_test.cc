// The chat templates of real models, rendered against the exact expected outputs in
// $KVCACHE_TESTDATA/chat-templates (NAME.jinja and NAME.cases.json). Every case must match:
// `expected` byte for byte, or `error` as the message the template raises.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "jinja/template.h"

namespace kvc::jinja {
namespace {

std::string read_file(const std::filesystem::path& p) {
  std::ifstream f(p, std::ios::binary);
  std::ostringstream s;
  s << f.rdbuf();
  return s.str();
}

TEST(ChatTemplates, EveryCaseOfEveryModelMatches) {
  const char* root = std::getenv("KVCACHE_TESTDATA");
  if (root == nullptr || *root == '\0') {
    GTEST_SKIP() << "KVCACHE_TESTDATA is not set (point it at ../shared/testdata); the real "
                    "models' chat templates are not checked";
  }
  const std::filesystem::path dir = std::filesystem::path(root) / "chat-templates";
  ASSERT_TRUE(std::filesystem::is_directory(dir)) << dir << " is missing";
  int templates = 0;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    const std::string name = entry.path().filename().string();
    if (!name.ends_with(".cases.json")) continue;
    const auto cases = nlohmann::ordered_json::parse(read_file(entry.path()));
    const std::filesystem::path source = dir / cases.at("template").get<std::string>();
    SCOPED_TRACE(source.string());
    const Template t = Template::parse(read_file(source));
    int matched = 0, total = 0;
    for (const auto& c : cases.at("cases")) {
      ++total;
      nlohmann::ordered_json context = {{"messages", c.at("messages")},
                                        {"add_generation_prompt", c.at("add_generation_prompt")},
                                        {"bos_token", c.at("bos_token")},
                                        {"eos_token", c.at("eos_token")},
                                        {"tools", nullptr},
                                        {"documents", nullptr}};
      if (c.contains("expected")) {
        try {
          const std::string out = t.render_json(context);
          EXPECT_EQ(out, c.at("expected").get<std::string>()) << "case " << total - 1;
          matched += out == c.at("expected").get<std::string>();
        } catch (const std::exception& e) {
          ADD_FAILURE() << "case " << total - 1 << " threw " << e.what();
        }
      } else {
        try {
          t.render_json(context);
          ADD_FAILURE() << "case " << total - 1 << " rendered; expected an error";
        } catch (const RaisedError& e) {
          EXPECT_EQ(std::string(e.what()), c.at("error").get<std::string>());
          matched += std::string(e.what()) == c.at("error").get<std::string>();
        }
      }
    }
    std::printf("%s: %d/%d cases match\n", name.c_str(), matched, total);
    ++templates;
  }
  EXPECT_GT(templates, 0);
}

}  // namespace
}  // namespace kvc::jinja
