// Chat templates: the four built-in formats, recognising a GGUF's Jinja template by its
// markers, and special markers mapped to token ids.
#include "server/chat_template.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <fstream>

#include "base/error.h"
#include "model/gguf.h"
#include "model/gguf_writer.h"
#include "model/llama_model.h"
#include "scratch_dir.h"
#include "server/api_error.h"
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

// A vocabulary-only GGUF with <s>/</s> as BOS/EOS and, when given, a chat template.
std::unique_ptr<gguf::File> template_file(const std::string* chat_template) {
  gguf::Writer w;
  w.set_string("general.architecture", "llama");
  w.set_string_array("tokenizer.ggml.tokens", {"<unk>", "<s>", "</s>", "a"});
  w.set_u32("tokenizer.ggml.bos_token_id", 1);
  w.set_u32("tokenizer.ggml.eos_token_id", 2);
  if (chat_template) w.set_string("tokenizer.chat_template", *chat_template);
  return gguf::File::parse(w.to_bytes(), "template-test");
}

const std::string kGemmaLike =
    "{{ bos_token }}{% if messages[0]['role'] == 'system' %}{{ raise_exception('System role not "
    "supported') }}{% endif %}{% for message in messages %}{{ '<start_of_turn>' + "
    "message['role'] + '\n' + message['content'] | trim + '<end_of_turn>\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<start_of_turn>model\n' }}{% endif %}";

TEST(ChatTemplate, RunsTheModelsOwnJinjaTemplate) {
  const auto file = template_file(&kGemmaLike);
  std::string note;
  bool warning = true;
  const ChatTemplate t = ChatTemplate::for_model(*file, ChatTemplateFlags{}, note, warning);
  EXPECT_EQ(t.format(), ChatFormat::kJinja);
  EXPECT_FALSE(warning);
  EXPECT_THAT(note, HasSubstr("tokenizer.chat_template (Jinja)"));
  EXPECT_EQ(t.render({{"user", " Hi "}}),
            "<s><start_of_turn>user\nHi<end_of_turn>\n<start_of_turn>model\n");
  EXPECT_EQ(t.render({{"user", "Hi"}}, false), "<s><start_of_turn>user\nHi<end_of_turn>\n");
  // raise_exception: 400 with the template's own message.
  try {
    t.render({{"system", "x"}, {"user", "Hi"}});
    FAIL();
  } catch (const ApiError& e) {
    EXPECT_EQ(e.status(), 400);
    EXPECT_EQ(std::string(e.what()), "System role not supported");
  }
  // The flag picks a built-in format over the model's template.
  EXPECT_EQ(ChatTemplate::for_model(*file, ChatTemplateFlags{"chatml", {}}, note, warning).format(),
            ChatFormat::kChatml);
}

TEST(ChatTemplate, UnsupportedFeaturesAndFailuresAnswerTheirStatuses) {
  const ChatTemplate unsupported =
      ChatTemplate::jinja("{{ messages|groupby('role') }}", "<s>", "</s>", "test");
  try {
    unsupported.render({{"user", "Hi"}});
    FAIL();
  } catch (const ApiError& e) {
    EXPECT_EQ(e.status(), 500);
    EXPECT_THAT(e.what(), HasSubstr("filter 'groupby'"));
  }
  const ChatTemplate failing = ChatTemplate::jinja("{{ messages[0].content + 1 }}", "", "", "t");
  try {
    failing.render({{"user", "Hi"}});
    FAIL();
  } catch (const ApiError& e) {
    EXPECT_EQ(e.status(), 400);
    EXPECT_THAT(e.what(), HasSubstr("chat template failed"));
  }
}

TEST(ChatTemplate, ATemplateThatDoesNotParseFallsBackWithAWarning) {
  const std::string broken = "{% for m in messages %}<|im_start|>{{ m.content }";
  const auto file = template_file(&broken);
  std::string note;
  bool warning = false;
  const ChatTemplate t = ChatTemplate::for_model(*file, ChatTemplateFlags{}, note, warning);
  EXPECT_TRUE(warning);
  EXPECT_EQ(t.format(), ChatFormat::kChatml);  // by its markers
  EXPECT_THAT(note, HasSubstr("does not parse"));
  EXPECT_THAT(note, HasSubstr("line 1"));
}

TEST(ChatTemplate, TemplateFileFlag) {
  const auto file = template_file(nullptr);
  const std::string path = (kvc::testing::scratch_dir() / "template.jinja").string();
  {
    std::ofstream out(path);
    out << "{% for m in messages %}[{{ m.role }}] {{ m.content }}\n{% endfor %}"
           "{% if add_generation_prompt %}[assistant] {% endif %}{{ eos_token }}";
  }
  std::string note;
  bool warning = false;
  const ChatTemplate t = ChatTemplate::for_model(*file, ChatTemplateFlags{{}, path}, note, warning);
  EXPECT_EQ(t.render({{"user", "Hi"}}), "[user] Hi\n[assistant] </s>");
  EXPECT_THAT(note, HasSubstr("--chat-template-file"));
  // A file that does not parse, or does not exist, stops start-up with the reason.
  {
    std::ofstream out(path);
    out << "{% if %}";
  }
  EXPECT_THROW(ChatTemplate::for_model(*file, ChatTemplateFlags{{}, path}, note, warning), Error);
  EXPECT_THROW(
      ChatTemplate::for_model(*file, ChatTemplateFlags{{}, path + ".missing"}, note, warning),
      Error);
  EXPECT_THROW(ChatTemplate::for_model(*file, ChatTemplateFlags{"chatml", path}, note, warning),
               Error);
}

TEST(ChatTemplate, MessagesCarryTheirWholeJson) {
  const ChatTemplate t = ChatTemplate::jinja(
      "{% for m in messages %}{{ m.role }}:{{ m.content }}{% if m.tool_calls is defined %}"
      "{{ m.tool_calls[0].function | tojson }}{% endif %}|{% endfor %}",
      "", "", "t");
  ChatMessage call{"assistant", "",
                   nlohmann::ordered_json::parse(
                       R"({"role": "assistant", "content": null, "tool_calls":
                                        [{"function": {"name": "f", "arguments": {"x": 1}}}]})")};
  EXPECT_EQ(t.render({{"user", "Hi"}, call}, false),
            R"(user:Hi|assistant:None{"name": "f", "arguments": {"x": 1}}|)");
}

TEST(ChatTemplate, RenderedSpecialTokensAreTokensAndBosIsNotDoubled) {
  KVC_REQUIRE_STORIES(path);
  const auto model = model::LlamaModel::load(path);
  const auto tok = model::Tokenizer::from_gguf(model->file());
  ASSERT_TRUE(tok.add_bos());
  // A template that writes the BOS text itself: one BOS, not two.
  const ChatTemplate with_bos = ChatTemplate::jinja(
      "{{ bos_token }}{% for m in messages %}{{ m.content }}{{ eos_token }}{% endfor %}", "<s>",
      "</s>", "t");
  std::vector<int32_t> expected{tok.bos_id()};
  const auto hi = tok.encode("Hi there", false);
  expected.insert(expected.end(), hi.begin(), hi.end());
  expected.push_back(tok.eos_id());
  EXPECT_EQ(with_bos.apply({{"user", "Hi there"}}, tok), expected);
  // A template that does not: the tokenizer adds it.
  const ChatTemplate without_bos =
      ChatTemplate::jinja("{% for m in messages %}{{ m.content }}{% endfor %}", "<s>", "</s>", "t");
  std::vector<int32_t> added{tok.bos_id()};
  added.insert(added.end(), hi.begin(), hi.end());
  EXPECT_EQ(without_bos.apply({{"user", "Hi there"}}, tok), added);
  // Special tokens in the middle of the text are parsed too; the text between them is text.
  const auto ids = ChatTemplate::tokenize("Hi</s><s>there", tok);
  std::vector<int32_t> mid{tok.bos_id()};
  const auto a = tok.encode("Hi", false);
  const auto b = tok.encode("there", false);
  mid.insert(mid.end(), a.begin(), a.end());
  mid.push_back(tok.eos_id());
  mid.push_back(tok.bos_id());
  mid.insert(mid.end(), b.begin(), b.end());
  EXPECT_EQ(ids, mid);
  std::vector<int32_t> stop_tokens;
  std::vector<std::string> stop_strings;
  with_bos.end_of_turn(tok, stop_tokens, stop_strings);
  EXPECT_EQ(stop_tokens, std::vector<int32_t>{tok.eos_id()});
}

}  // namespace
}  // namespace kvc::server
