#include "cli/plan_report.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "base/byte_size.h"
#include "base/error.h"
#include "cli/cli_options.h"
#include "kv/disk_store.h"
#include "scratch_dir.h"
#include "test_models.h"

namespace kvc::cli {
namespace {

using nlohmann::json;
using ::testing::HasSubstr;

constexpr uint64_t GiB = 1ull << 30;

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

PlanArgs llama_args() {
  PlanArgs a;
  a.preset = "llama3-8b";
  a.contexts = {"8192,131072"};
  a.concurrencies = {"1", "8"};
  a.budget = "24GiB";
  return a;
}

TEST(PlanReport, ParseSize) {
  EXPECT_EQ(parse_byte_size("24GiB", "--budget"), 24 * GiB);
  EXPECT_EQ(parse_byte_size("512MiB", "--budget"), 512ull << 20);
  EXPECT_EQ(parse_byte_size("80GB", "--budget"), 80000000000ull);
  EXPECT_EQ(parse_byte_size("1048576", "--budget"), 1048576u);
  EXPECT_EQ(parse_byte_size(" 2 gib ", "--budget"), 2 * GiB);
  EXPECT_EQ(parse_byte_size("1.5GiB", "--budget"), 3 * GiB / 2);
  EXPECT_EQ(parse_byte_size("16K", "--budget"), 16384u);
  EXPECT_EQ(parse_byte_size("3kb", "--budget"), 3000u);
  EXPECT_EQ(parse_byte_size("7B", "--budget"), 7u);
}

TEST(PlanReport, ParseSizeErrors) {
  EXPECT_THAT(error_of([] { parse_byte_size("0", "--budget"); }), HasSubstr("must be positive"));
  EXPECT_THAT(error_of([] { parse_byte_size("0GiB", "--budget"); }), HasSubstr("must be positive"));
  EXPECT_THAT(error_of([] { parse_byte_size("-1GiB", "--budget"); }),
              HasSubstr("must be positive"));
  EXPECT_THAT(error_of([] { parse_byte_size("abc", "--budget"); }),
              HasSubstr("--budget: cannot read size 'abc'"));
  EXPECT_THAT(error_of([] { parse_byte_size("12XB", "--budget"); }), HasSubstr("cannot read size"));
  EXPECT_THAT(error_of([] { parse_byte_size("", "--budget"); }), HasSubstr("cannot read size"));
  EXPECT_THAT(error_of([] { parse_byte_size("GiB", "--budget"); }), HasSubstr("cannot read size"));
  EXPECT_THAT(error_of([] { parse_byte_size("1.2.3GB", "--budget"); }),
              HasSubstr("cannot read size"));
  EXPECT_THAT(error_of([] { parse_byte_size("99999999999999999999", "--budget"); }),
              HasSubstr("too large"));
  EXPECT_THAT(error_of([] { parse_byte_size("20000000TiB", "--budget"); }), HasSubstr("too large"));
}

TEST(PlanReport, ParseCounts) {
  EXPECT_EQ(parse_count("8k", "--context"), 8192u);
  EXPECT_EQ(parse_count_list({"8192,131072", "4"}, "--context"),
            (std::vector<uint64_t>{8192, 131072, 4}));
  EXPECT_THAT(error_of([] { parse_count("0", "--context"); }),
              HasSubstr("--context must be positive"));
  EXPECT_THAT(error_of([] { parse_count("-3", "--concurrency"); }),
              HasSubstr("--concurrency must be positive"));
  EXPECT_THAT(error_of([] { parse_count("many", "--concurrency"); }),
              HasSubstr("cannot read 'many'"));
  EXPECT_THAT(error_of([] { parse_count_list({"1,,2"}, "--context"); }),
              HasSubstr("cannot read ''"));
  EXPECT_EQ(parse_kv_dtype("int8"), DType::Q8_0);
  EXPECT_EQ(parse_kv_dtype("int4"), DType::Q4_0);
  EXPECT_THAT([] { parse_kv_dtype("q4_K"); },
              ::testing::ThrowsMessage<Error>(::testing::HasSubstr("q4_K is a weight type")));
  EXPECT_EQ(parse_kv_dtype("BF16"), DType::BF16);
  EXPECT_THAT(error_of([] { parse_kv_dtype("fp8"); }), HasSubstr("unknown KV dtype 'fp8'"));
}

TEST(PlanReport, ArgumentErrors) {
  PlanArgs none = llama_args();
  none.preset.clear();
  EXPECT_THAT(error_of([&] { make_plan(none); }), HasSubstr("no model given"));

  PlanArgs both = llama_args();
  both.config_path = "config.json";
  EXPECT_THAT(error_of([&] { make_plan(both); }), HasSubstr("conflicting model sources"));

  PlanArgs unknown = llama_args();
  unknown.preset = "gpt-5";
  const std::string e = error_of([&] { make_plan(unknown); });
  EXPECT_THAT(e, HasSubstr("unknown preset 'gpt-5'"));
  EXPECT_THAT(e, HasSubstr("deepseek-v3"));

  PlanArgs small = llama_args();
  small.budget = "8GiB";
  const std::string budget = error_of([&] { make_plan(small); });
  EXPECT_THAT(budget, HasSubstr("8589934592 B (8.0 GiB)"));
  EXPECT_THAT(budget, HasSubstr("16060522496 B (15.0 GiB)"));

  PlanArgs weights = llama_args();
  weights.weights = "maybe";
  EXPECT_THAT(error_of([&] { make_plan(weights); }), HasSubstr("--weights must be"));

  PlanArgs gguf_dtype = llama_args();
  gguf_dtype.preset.clear();
  gguf_dtype.model_path = "model.gguf";
  gguf_dtype.weights_dtype = "q8_0";
  EXPECT_THAT(error_of([&] { make_plan(gguf_dtype); }), HasSubstr("--weights-dtype applies"));

  PlanArgs block = llama_args();
  block.block_tokens = "0";
  EXPECT_THAT(error_of([&] { make_plan(block); }), HasSubstr("--block-tokens must be positive"));

  PlanArgs no_context = llama_args();
  no_context.contexts.clear();
  EXPECT_THAT(error_of([&] { make_plan(no_context); }), HasSubstr("--context is required"));
}

void expect_integer_bytes(const json& j, const std::string& where) {
  if (j.is_object()) {
    for (const auto& [key, value] : j.items()) {
      if (key.find("bytes") != std::string::npos) {
        EXPECT_TRUE(value.is_number_unsigned()) << where << "." << key << " = " << value.dump();
      }
      expect_integer_bytes(value, where + "." + key);
    }
  } else if (j.is_array()) {
    for (const auto& item : j) expect_integer_bytes(item, where + "[]");
  }
}

TEST(PlanReport, JsonHasEveryFigureInBytes) {
  const std::string text = render_json(make_plan(llama_args()));
  const json j = json::parse(text);
  expect_integer_bytes(j, "plan");
  EXPECT_EQ(j["bytes_per_token"], 131072);
  EXPECT_EQ(j["bytes_per_block"], 2097152);
  EXPECT_EQ(j["weights_bytes"], 16060522496ull);
  EXPECT_EQ(j["budget"]["bytes"], 24 * GiB);
  EXPECT_EQ(j["budget"]["pool_blocks"], 4629);
  EXPECT_EQ(j["requests"][1]["allocated_bytes"], 16 * GiB);
  EXPECT_EQ(j["requests"][0]["max_concurrency"], 9);
  EXPECT_EQ(j["requests"][1]["max_concurrency"], 0);
  ASSERT_EQ(j["totals"].size(), 4u);
  EXPECT_EQ(j["totals"][1]["total_bytes"], 8 * GiB + 16060522496ull);
  EXPECT_EQ(j["totals"][1]["fits"], true);
  EXPECT_EQ(j["max_context"][0]["tokens"], 74064);
  EXPECT_EQ(j["max_context"][1]["tokens"], 9248);
  EXPECT_EQ(j["model"]["attention"], "GQA");
  EXPECT_EQ(j["model"]["parameters"], 8030261248ull);

  PlanArgs no_budget = llama_args();
  no_budget.budget.clear();
  const json nb = json::parse(render_json(make_plan(no_budget)));
  EXPECT_TRUE(nb["budget"].is_null());
  EXPECT_TRUE(nb["requests"][0]["max_concurrency"].is_null());
  expect_integer_bytes(nb, "no_budget");
}

TEST(PlanReport, TableShowsTheFigures) {
  const std::string table = render_table(make_plan(llama_args()));
  EXPECT_THAT(table, HasSubstr("llama3-8b (preset, llama): 32 layers, 32 heads, 8 KV heads x 128"));
  EXPECT_THAT(table, HasSubstr("131072 B (128.0 KiB)/token"));
  EXPECT_THAT(table, HasSubstr("4629 blocks"));
  EXPECT_THAT(table, HasSubstr("holds 74064 tokens"));
  EXPECT_THAT(table, HasSubstr("longest context per request"));
  EXPECT_THAT(table, ::testing::Not(HasSubstr("note")));

  PlanArgs mla = llama_args();
  mla.preset = "deepseek-v3";
  mla.budget = "2TiB";
  EXPECT_THAT(render_table(make_plan(mla)), HasSubstr("note"));

  // Separate K and V types; bf16, which the pool does not store, is noted.
  PlanArgs mixed = llama_args();
  mixed.kv_dtypes = {"", "q8_0", "q4_0"};
  const Plan p = make_plan(mixed);
  // Keys per channel: 35 B per 32 tokens of a channel; values 18 B per 32.
  EXPECT_EQ(p.figures.bytes_per_token, 32u * 8 * (128 * 35 / 32 + 128 / 32 * 18));
  EXPECT_THAT(render_table(p), HasSubstr("KV       K q8_0 / V q4_0, 32-token blocks"));
  EXPECT_THAT(render_table(p), ::testing::Not(HasSubstr("note")));
  PlanArgs bf16 = llama_args();
  bf16.kv_dtypes.both = "bf16";
  EXPECT_THAT(render_table(make_plan(bf16)), HasSubstr("not bf16"));
}

// Checks that every tag is closed in order; enough to catch broken SVG.
void expect_well_formed(const std::string& xml) {
  std::vector<std::string> stack;
  size_t pos = 0;
  while ((pos = xml.find('<', pos)) != std::string::npos) {
    const size_t end = xml.find('>', pos);
    ASSERT_NE(end, std::string::npos) << "unterminated tag at " << pos;
    const std::string tag = xml.substr(pos + 1, end - pos - 1);
    pos = end + 1;
    if (tag.front() == '?' || tag.front() == '!') continue;
    if (tag.front() == '/') {
      ASSERT_FALSE(stack.empty()) << "stray </" << tag << ">";
      EXPECT_EQ(stack.back(), tag.substr(1));
      stack.pop_back();
      continue;
    }
    if (tag.back() == '/') continue;
    stack.push_back(tag.substr(0, tag.find_first_of(" \n")));
  }
  EXPECT_TRUE(stack.empty()) << "unclosed <" << stack.back() << ">";
}

size_t count(const std::string& haystack, const std::string& needle) {
  size_t n = 0;
  for (size_t p = haystack.find(needle); p != std::string::npos; p = haystack.find(needle, p + 1)) {
    ++n;
  }
  return n;
}

TEST(PlanReport, SvgHasALinePerConcurrencyAndTheBudget) {
  PlanArgs a = llama_args();
  a.concurrencies = {"1,4,16"};
  a.model_path.clear();
  a.preset = "qwen2.5-7b";
  a.budget = "80GB";
  const std::string svg = render_svg(make_plan(a));
  expect_well_formed(svg);
  EXPECT_EQ(svg.rfind("<?xml", 0), 0u);
  EXPECT_EQ(count(svg, "<polyline"), 3u);
  for (const char* n : {"1", "4", "16"}) {
    EXPECT_THAT(svg, HasSubstr(fmt::format("data-concurrency=\"{}\"", n)));
  }
  EXPECT_EQ(count(svg, "class=\"budget\""), 1u);
  EXPECT_THAT(svg, HasSubstr("context length"));
  EXPECT_THAT(svg, HasSubstr("budget 74.5 GiB"));
  EXPECT_THAT(svg, HasSubstr("16 requests at once"));

  PlanArgs no_budget = a;
  no_budget.budget.clear();
  const std::string plain = render_svg(make_plan(no_budget));
  expect_well_formed(plain);
  EXPECT_EQ(count(plain, "class=\"budget\""), 0u);
}

TEST(PlanReport, RunPlanWritesThePlot) {
  const auto path = kvc::testing::scratch_dir() / "kvcache_plan_test.svg";
  std::filesystem::remove(path);
  PlanArgs a = llama_args();
  a.plot_path = path.string();
  std::ostringstream out;
  run_plan(a, out);
  EXPECT_THAT(out.str(), HasSubstr("plot written to"));
  std::ifstream file(path);
  std::stringstream svg;
  svg << file.rdbuf();
  EXPECT_EQ(count(svg.str(), "<polyline"), 2u);

  a.json = true;
  a.plot_path.clear();
  std::ostringstream json_out;
  run_plan(a, json_out);
  EXPECT_NO_THROW(json::parse(json_out.str()));
}

TEST(PlanReport, ConfigSourceAndExcludedWeights) {
  const auto path = kvc::testing::scratch_dir() / "kvcache_plan_config.json";
  std::ofstream(path) << R"({"num_hidden_layers": 22, "num_attention_heads": 32,
    "num_key_value_heads": 4, "hidden_size": 2048, "intermediate_size": 5632,
    "vocab_size": 32000, "torch_dtype": "float16"})";
  PlanArgs a;
  a.config_path = path.string();
  a.contexts = {"2048"};
  a.budget = "1GiB";
  a.weights = "excluded";
  a.kv_dtypes.both = "q8_0";
  const Plan p = make_plan(a);
  EXPECT_EQ(p.model.weights_dtype, DType::F16);
  EXPECT_EQ(p.figures.bytes_per_token, 22u * 4 * (64 * 35 / 32 + 2 * 34));
  EXPECT_EQ(*p.figures.kv_budget_bytes, GiB);
  EXPECT_EQ(p.options.concurrencies, std::vector<uint64_t>{1});
}

}  // namespace
}  // namespace kvc::cli

namespace kvc::cli {
namespace {

// With a model and a tier, plan times recompute against loads: one row per depth, the
// break-even reuse, and the same figures in JSON.
TEST(PlanReport, TierCostsWithAModelAndADiskTier) {
  const std::string model = kvc::testing::stories_model_path();
  if (model.empty()) GTEST_SKIP() << "KVCACHE_TEST_MODEL (stories260K.gguf) not set";
  PlanArgs a;
  a.model_path = model;
  a.contexts = {"512"};
  a.tiers.disk = (kvc::testing::scratch_dir() / "plan-disk").string();
  a.threads = 1;
  std::ostringstream out;
  run_plan(a, out);
  EXPECT_THAT(out.str(), HasSubstr("disk break-even"));
  EXPECT_THAT(out.str(), HasSubstr("recompute fitted from"));
  a.json = true;
  std::ostringstream json_out;
  run_plan(a, json_out);
  const json j = json::parse(json_out.str());
  const json& rows = j.at("tier_costs").at("depths");
  ASSERT_GE(rows.size(), 1u);
  EXPECT_EQ(rows[0]["depth"], 0);
  EXPECT_GT(rows[0]["recompute_ms"].get<double>(), 0);
  EXPECT_GT(rows[0]["disk_load_ms"].get<double>(), 0);
  EXPECT_GT(j["tier_costs"]["passes"].get<int>(), 0);
  // The probe blocks are deleted again: the directory holds no block.
  EXPECT_EQ(kvc::kv::DiskStore::stored_blocks(a.tiers.disk).size(), 0u);
}

TEST(PlanReport, TierFlagsNeedAModel) {
  PlanArgs a;
  a.preset = "llama3-8b";
  a.contexts = {"512"};
  a.tiers.disk = (kvc::testing::scratch_dir() / "plan-disk-no-model").string();
  std::ostringstream out;
  try {
    run_plan(a, out);
    FAIL();
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("needs --model"));
  }
}

}  // namespace
}  // namespace kvc::cli
