// The tokenizer-only mode over llama.cpp's vocabulary-only GGUFs (shared/testdata/vocab):
// /tokenize, /detokenize and /apply-template answer as in normal serving, /health, /v1/models
// and /metrics answer, and every endpoint that needs the engine answers one clear 400.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "server_fixture.h"

namespace kvc::server {
namespace {

using testing::get;
using ::testing::HasSubstr;
using testing::json;
using testing::post;
using testing::TestServer;

struct VocabFile {
  std::string name;    // NAME.gguf, NAME.inp and NAME.out under vocab/
  int context_length;  // its max_model_len, as the test passes it
  std::string chat;    // /apply-template's text for one user message "hi"
};

void PrintTo(const VocabFile& v, std::ostream* os) {
  *os << v.name;
}

std::string read_all(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

class TokenizerOnly : public ::testing::TestWithParam<VocabFile> {
 protected:
  void SetUp() override {
    const char* root = std::getenv("KVCACHE_TESTDATA");
    if (root == nullptr || *root == '\0') {
      GTEST_SKIP() << "KVCACHE_TESTDATA not set: point it at shared/testdata to serve llama.cpp's "
                      "vocabulary-only GGUFs in the tokenizer-only mode";
    }
    dir_ = std::filesystem::path(root) / "vocab";
    const auto path = dir_ / (GetParam().name + ".gguf");
    ASSERT_TRUE(std::filesystem::exists(path)) << path << " is missing";
    server_ = TestServer::tokenizer_only(path.string(), GetParam().context_length);
  }

  const TestServer& s() const { return *server_; }
  const model::Tokenizer& tokenizer() const { return *server_->tokenizer; }

  std::filesystem::path dir_;
  std::unique_ptr<TestServer> server_;
};

TEST_P(TokenizerOnly, TokenizeGivesTheTokenizersIdsAndLlamaCppsFirstPair) {
  const std::string text = "Hello world, this is a test.";
  auto r = post(s(), "/tokenize", json{{"prompt", text}});
  ASSERT_EQ(r.status, 200) << r.text;
  // BOS only where the vocabulary adds one (phi-3 does, gpt-2 does not), as a completion would.
  const std::vector<int32_t> expected = tokenizer().encode(text, tokenizer().add_bos());
  EXPECT_EQ(r.body["tokens"].get<std::vector<int32_t>>(), expected);
  EXPECT_EQ(r.body["count"], expected.size());
  EXPECT_EQ(r.body["max_model_len"], GetParam().context_length);
  r = post(s(), "/tokenize", json{{"content", text}, {"add_special", false}});
  ASSERT_EQ(r.status, 200) << r.text;
  EXPECT_EQ(r.body["tokens"].get<std::vector<int32_t>>(), tokenizer().encode(text, false));
  r = post(s(), "/tokenize", json{{"prompt", text}, {"with_pieces", true}});
  ASSERT_EQ(r.status, 200) << r.text;
  ASSERT_EQ(r.body["tokens"].size(), expected.size());
  EXPECT_EQ(r.body["tokens"].back()["id"], expected.back());
  EXPECT_EQ(r.body["tokens"].back()["piece"], tokenizer().piece(expected.back()));

  // llama.cpp's first test pair: the text before the first separator, the ids on line 1.
  const std::string inp = read_all(dir_ / (GetParam().name + ".inp"));
  const size_t sep = inp.find("\n__ggml_vocab_test__\n");
  ASSERT_NE(sep, std::string::npos);
  std::istringstream out(read_all(dir_ / (GetParam().name + ".out")));
  std::string line;
  ASSERT_TRUE(std::getline(out, line));
  std::istringstream nums(line);
  std::vector<int32_t> pair_ids;
  for (int32_t id = 0; nums >> id;) pair_ids.push_back(id);
  r = post(s(), "/tokenize", json{{"prompt", inp.substr(0, sep)}, {"add_special", false}});
  ASSERT_EQ(r.status, 200) << r.text;
  EXPECT_EQ(r.body["tokens"].get<std::vector<int32_t>>(), pair_ids);
}

TEST_P(TokenizerOnly, DetokenizeRoundTrips) {
  for (const std::string text : {"Hello world", "ied 4 ½ months", "The quick brown fox."}) {
    const std::vector<int32_t> ids = tokenizer().encode(text, false);
    const auto r = post(s(), "/detokenize", json{{"tokens", ids}});
    ASSERT_EQ(r.status, 200) << r.text;
    EXPECT_EQ(r.body["content"], text);
  }
  const auto r = post(s(), "/detokenize", json{{"tokens", {1, 999999}}});
  EXPECT_EQ(r.status, 400);
  EXPECT_EQ(r.body["error"]["param"], "tokens");
}

TEST_P(TokenizerOnly, ApplyTemplateUsesTheFilesOwnTemplate) {
  const json messages = json::array({{{"role", "user"}, {"content", "hi"}}});
  auto r = post(s(), "/apply-template", json{{"messages", messages}});
  ASSERT_EQ(r.status, 200) << r.text;
  EXPECT_EQ(r.body["prompt"], GetParam().chat);
  // Messages tokenize through the same template, special markers as their ids.
  r = post(s(), "/tokenize", json{{"messages", messages}});
  ASSERT_EQ(r.status, 200) << r.text;
  EXPECT_FALSE(r.body["tokens"].empty());
}

TEST_P(TokenizerOnly, GenerationAndCacheEndpointsAnswerAClearError) {
  const std::string message = GetParam().name +
                              " is a vocabulary-only GGUF (no weights): only /tokenize, "
                              "/detokenize and /apply-template are served";
  const json messages = json::array({{{"role", "user"}, {"content", "hi"}}});
  auto expect_refused = [&](const testing::Reply& r, const std::string& what) {
    EXPECT_EQ(r.status, 400) << what << ": " << r.text;
    EXPECT_EQ(r.body["error"]["message"], message) << what;
    EXPECT_EQ(r.body["error"]["type"], "invalid_request_error") << what;
    EXPECT_EQ(r.body["error"]["code"], "model_has_no_weights") << what;
  };
  expect_refused(post(s(), "/v1/completions", json{{"prompt", "hi"}, {"max_tokens", 4}}),
                 "completions");
  expect_refused(post(s(), "/v1/completions", json{{"prompt", "hi"}, {"stream", true}}),
                 "streamed completions");
  expect_refused(post(s(), "/v1/chat/completions", json{{"messages", messages}}), "chat");
  // Whatever the body: the request could never be served.
  expect_refused(post(s(), "/v1/chat/completions", std::string("not json")), "bad chat body");
  expect_refused(get(s(), "/v1/cache"), "cache stats");
  expect_refused(post(s(), "/v1/cache/explain", json{{"prompt", "hi"}}), "explain");
  expect_refused(post(s(), "/v1/cache/pin", json{{"prompt", "hi"}, {"ttl_seconds", 60}}), "pin");
  expect_refused(post(s(), "/v1/cache/flush", std::string()), "flush");
}

TEST_P(TokenizerOnly, HealthModelsAndMetricsAnswer) {
  auto r = get(s(), "/health");
  EXPECT_EQ(r.status, 200);
  EXPECT_EQ(r.body, json({{"status", "ok"}}));
  r = get(s(), "/v1/models");
  ASSERT_EQ(r.status, 200) << r.text;
  ASSERT_EQ(r.body["data"].size(), 1u);
  EXPECT_EQ(r.body["data"][0]["id"], GetParam().name);
  EXPECT_EQ(r.body["data"][0]["max_model_len"], GetParam().context_length);
  post(s(), "/v1/completions", json{{"prompt", "hi"}});
  r = get(s(), "/metrics");
  ASSERT_EQ(r.status, 200) << r.text;
  std::vector<std::string> errors;
  const auto families = testing::parse_prometheus(r.text, errors);
  EXPECT_TRUE(errors.empty()) << ::testing::PrintToString(errors) << "\n" << r.text;
  EXPECT_EQ(testing::prom_value(families, "kvcache_info",
                                {{"model", GetParam().name}, {"mode", "tokenizer-only"}}),
            1.0);
  EXPECT_GE(testing::prom_value(families, "kvcache_http_responses_total", {{"code", "400"}}), 1.0);
  EXPECT_GE(testing::prom_value(families, "kvcache_http_responses_total", {{"code", "200"}}), 2.0);
}

INSTANTIATE_TEST_SUITE_P(VocabOnly, TokenizerOnly,
                         ::testing::Values(
                             // No chat template in the file: chatml, as in normal serving.
                             VocabFile{"gpt-2", 1024,
                                       "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"},
                             // Phi-3's own tokenizer.chat_template.
                             VocabFile{"phi-3", 4096, "<s><|user|>\nhi<|end|>\n<|assistant|>\n"}),
                         [](const ::testing::TestParamInfo<VocabFile>& info) {
                           std::string name = info.param.name;
                           for (char& c : name) c = c == '-' ? '_' : c;
                           return name;
                         });

}  // namespace
}  // namespace kvc::server
