// API key files: tenants, admin flags, and errors that name the line.
#include "server/api_keys.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <fstream>

#include "base/error.h"
#include "test_models.h"

namespace kvc::server {
namespace {

using ::testing::HasSubstr;

std::string error_of(const std::string& text) {
  try {
    ApiKeys::parse(text, "keys.txt");
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(ApiKeys, MapsKeysToTenantsWithAdminFlags) {
  const ApiKeys keys = ApiKeys::parse(
      "# operators\n"
      "sk-alice   alice admin\n"
      "\n"
      "sk-bob bob\r\n"
      "  sk-bob-2\tbob  \n",
      "keys.txt");
  EXPECT_EQ(keys.size(), 3u);
  ASSERT_TRUE(keys.find("sk-alice"));
  EXPECT_EQ(keys.find("sk-alice")->name, "alice");
  EXPECT_TRUE(keys.find("sk-alice")->admin);
  EXPECT_EQ(keys.find("sk-bob")->name, "bob");
  EXPECT_FALSE(keys.find("sk-bob")->admin);
  EXPECT_EQ(keys.find("sk-bob-2")->name, "bob");
  EXPECT_FALSE(keys.find("sk-carol"));
  EXPECT_FALSE(keys.find(""));
  EXPECT_FALSE(keys.find("sk-alice "));
  EXPECT_EQ(keys.tenant_names(), (std::vector<std::string>{"alice", "bob"}));
}

TEST(ApiKeys, ErrorsNameTheLine) {
  EXPECT_THAT(error_of("sk-a a\nonly-a-key\n"),
              HasSubstr("keys.txt:2: expected 'KEY TENANT [admin]'"));
  EXPECT_THAT(error_of("sk-a a root\n"), HasSubstr("keys.txt:1: expected"));
  EXPECT_THAT(error_of("sk-a a admin extra\n"), HasSubstr("keys.txt:1: expected"));
  EXPECT_THAT(error_of("sk-a a\n\nsk-a b\n"),
              HasSubstr("keys.txt:3: this key is already given on line 1"));
  EXPECT_THAT(error_of("sk-a te\"nant\n"), HasSubstr("keys.txt:1: tenant name 'te\"nant'"));
}

TEST(ApiKeys, LoadReadsAFileAndRefusesAnEmptyOne) {
  const std::string path = (kvc::testing::scratch_dir() / "keys.txt").string();
  std::ofstream(path) << "sk-x x admin\n";
  EXPECT_TRUE(ApiKeys::load(path).find("sk-x")->admin);
  std::ofstream(path) << "# nothing\n";
  EXPECT_THROW(ApiKeys::load(path), Error);
  EXPECT_THROW(ApiKeys::load(path + ".missing"), Error);
}

}  // namespace
}  // namespace kvc::server
