// Chat templates: the four built-in formats, recognising a GGUF's Jinja template by its
// markers, and special markers mapped to token ids.
#include "server/chat_template.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "base/error.h"
#include "model/gguf.h"
#include "model/llama_model.h"
#include "test_models.h"

namespace kvc::server {
namespace {

using ::testing::HasSubstr;

const std::vector<ChatMessage> kConversation = {
    {"system", "Be kind."}, {"user", "Hi"}, {"assistant", "Hello!"}, {"user", "Tell a story"}};

TEST(ChatTemplate, RendersEachBuiltInFormat) {
  EXPECT_EQ(ChatTemplate(ChatFormat::kChatml).render(kConversation),
            "<|im_start|>system\nBe kind.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
            "<|im_start|>assistant\nHello!<|im_end|>\n<|im_start|>user\nTell a story<|im_end|>\n"
            "<|im_start|>assistant\n");
  EXPECT_EQ(ChatTemplate(ChatFormat::kLlama3).render(kConversation),
            "<|start_header_id|>system<|end_header_id|>\n\nBe kind.<|eot_id|>"
            "<|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>"
            "<|start_header_id|>assistant<|end_header_id|>\n\nHello!<|eot_id|>"
            "<|start_header_id|>user<|end_header_id|>\n\nTell a story<|eot_id|>"
            "<|start_header_id|>assistant<|end_header_id|>\n\n");
  EXPECT_EQ(ChatTemplate(ChatFormat::kZephyr).render(kConversation),
            "<|system|>\nBe kind.</s>\n<|user|>\nHi</s>\n<|assistant|>\nHello!</s>\n"
            "<|user|>\nTell a story</s>\n<|assistant|>\n");
  EXPECT_EQ(ChatTemplate(ChatFormat::kLlama2).render(kConversation),
            "[INST] <<SYS>>\nBe kind.\n<</SYS>>\n\nHi [/INST] Hello! </s><s>[INST] Tell a story "
            "[/INST]");
}

TEST(ChatTemplate, RecognisesJinjaTemplatesByTheirMarkers) {
  // Excerpts of the templates these model families ship in tokenizer.chat_template.
  const std::string chatml =
      "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + "
      "message['content'] + '<|im_end|>' + '\\n'}}{% endfor %}";
  const std::string llama3 =
      "{% set loop_messages = messages %}{% for message in loop_messages %}{% set content = "
      "'<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n'+ "
      "message['content'] | trim + '<|eot_id|>' %}";
  const std::string llama2 =
      "{% if messages[0]['role'] == 'system' %}{% set system_message = '<<SYS>>\\n' + "
      "messages[0]['content'] | trim + '\\n<</SYS>>\\n\\n' %}{% endif %}{{ bos_token + '[INST] ' "
      "+ content | trim + ' [/INST]' }}";
  const std::string zephyr =
      "{% for message in messages %}{% if message['role'] == 'user' %}{{ '<|user|>\\n' + "
      "message['content'] + eos_token }}{% elif message['role'] == 'assistant' %}{{ "
      "'<|assistant|>\\n' + message['content'] + eos_token }}{% endif %}{% endfor %}";
  const std::string mistral =
      "{{ bos_token }}{% for m in messages %}[INST] {{ m['content'] }} "
      "[/INST]{% endfor %}";
  const std::string phi3 = "{{'<|user|>\\n' + message['content'] + '<|end|>\\n<|assistant|>'}}";
  EXPECT_EQ(ChatTemplate::recognise(chatml)->format(), ChatFormat::kChatml);
  EXPECT_EQ(ChatTemplate::recognise(llama3)->format(), ChatFormat::kLlama3);
  EXPECT_EQ(ChatTemplate::recognise(llama2)->format(), ChatFormat::kLlama2);
  EXPECT_EQ(ChatTemplate::recognise(zephyr)->format(), ChatFormat::kZephyr);
  EXPECT_FALSE(ChatTemplate::recognise(mistral));
  EXPECT_FALSE(ChatTemplate::recognise(phi3));
  EXPECT_FALSE(ChatTemplate::recognise("{{ messages }}"));
}

TEST(ChatTemplate, NamesAndDefaults) {
  EXPECT_EQ(ChatTemplate::named("llama-2").format(), ChatFormat::kLlama2);
  EXPECT_EQ(ChatTemplate::named("llama3").format(), ChatFormat::kLlama3);
  EXPECT_EQ(ChatTemplate::named("zephyr").name(), "zephyr");
  try {
    ChatTemplate::named("vicuna");
    FAIL();
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("unknown chat template 'vicuna'"));
    EXPECT_THAT(e.what(), HasSubstr("llama-2, chatml, llama-3, zephyr"));
  }
  // The synthetic model has no tokenizer.chat_template: chatml, as llama.cpp falls back to.
  const auto model =
      model::LlamaModel::load(kvc::testing::synthetic_model_path("tiny", DType::F32));
  std::string note;
  EXPECT_EQ(ChatTemplate::for_model(model->file(), "", note).format(), ChatFormat::kChatml);
  EXPECT_THAT(note, HasSubstr("no tokenizer.chat_template"));
  EXPECT_EQ(ChatTemplate::for_model(model->file(), "zephyr", note).format(), ChatFormat::kZephyr);
  EXPECT_THAT(note, HasSubstr("--chat-template"));
}

TEST(ChatTemplate, MarkersTheVocabularyHasBecomeTheirIds) {
  KVC_REQUIRE_STORIES(path);
  const auto model = model::LlamaModel::load(path);
  const auto tok = model::Tokenizer::from_gguf(model->file());
  // Llama-2: <s> and </s> are BOS and EOS in this vocabulary; the rest is text.
  const ChatTemplate llama2(ChatFormat::kLlama2);
  const std::vector<int32_t> ids = llama2.apply(kConversation, tok);
  std::vector<int32_t> expected =
      tok.encode("[INST] <<SYS>>\nBe kind.\n<</SYS>>\n\nHi [/INST] Hello! ", true);
  expected.push_back(tok.eos_id());
  expected.push_back(tok.bos_id());
  const auto tail = tok.encode("[INST] Tell a story [/INST]", false);
  expected.insert(expected.end(), tail.begin(), tail.end());
  EXPECT_EQ(ids, expected);
  std::vector<int32_t> stop_tokens;
  std::vector<std::string> stop_strings;
  llama2.end_of_turn(tok, stop_tokens, stop_strings);
  EXPECT_EQ(stop_tokens, std::vector<int32_t>{tok.eos_id()});
  EXPECT_TRUE(stop_strings.empty());
  // chatml markers are not in this vocabulary: they stay text, and its end of turn is a stop
  // string.
  const ChatTemplate chatml(ChatFormat::kChatml);
  EXPECT_EQ(chatml.apply({{"user", "Hi"}}, tok),
            tok.encode("<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n", true));
  stop_tokens.clear();
  chatml.end_of_turn(tok, stop_tokens, stop_strings);
  EXPECT_TRUE(stop_tokens.empty());
  EXPECT_EQ(stop_strings, std::vector<std::string>{"<|im_end|>"});
}

}  // namespace
}  // namespace kvc::server
