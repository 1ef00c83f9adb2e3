#include "cli/plan_report.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>

#include "base/byte_size.h"
#include "base/error.h"
#include "base/strings.h"
#include "cli/cli_options.h"
#include "cli/tier_cost_report.h"

namespace kvc::cli {

using namespace kvc::model;  // the plan is built from the model layer's geometry

namespace {

using Wide = unsigned __int128;
constexpr uint64_t kMax = std::numeric_limits<uint64_t>::max();

// ---- table ----

std::string with_bytes(uint64_t bytes) {
  return fmt::format("{} B ({})", bytes, format_bytes(bytes));
}

std::string source_line(const ModelGeometry& m) {
  std::string what = m.source;
  if (!m.architecture.empty()) what += ", " + m.architecture;
  return fmt::format("{} ({}): {}", m.name, what, describe_attention(m));
}

std::string weights_line(const ModelGeometry& m) {
  if (!m.weights_dtype) {
    return fmt::format("{}: {} parameters as stored", with_bytes(m.weights_bytes), m.parameters);
  }
  return fmt::format("{}: {} parameters at {}", with_bytes(m.weights_bytes), m.parameters,
                     dtype_name(*m.weights_dtype));
}

std::string optional_count(const std::optional<uint64_t>& v) {
  return v ? std::to_string(*v) : std::string("-");
}

// ---- SVG ----

// A 1-2-2.5-5 step that cuts range into about `target` intervals.
double nice_step(double range, int target) {
  const double raw = range / target;
  const double magnitude = std::pow(10.0, std::floor(std::log10(raw)));
  for (double m : {1.0, 2.0, 2.5, 5.0, 10.0}) {
    if (m * magnitude >= raw) return m * magnitude;
  }
  return 10 * magnitude;
}

std::string trim_number(double v) {
  std::string s = fmt::format("{:.2f}", v);
  while (s.back() == '0') s.pop_back();
  if (s.back() == '.') s.pop_back();
  return s;
}

std::string token_label(double tokens) {
  if (tokens >= 1000 && std::fmod(tokens, 1000) == 0) return trim_number(tokens / 1000) + "k";
  return trim_number(tokens);
}

constexpr const char* kPalette[] = {"#1f77b4", "#ff7f0e", "#2ca02c", "#9467bd",
                                    "#8c564b", "#e377c2", "#17becf", "#bcbd22"};

}  // namespace

uint64_t parse_count(std::string_view text, std::string_view what) {
  std::string_view s = trim(text);
  if (!s.empty() && s.front() == '-') fail("{} must be positive, got '{}'", what, text);
  uint64_t mult = 1;
  if (!s.empty() && (s.back() == 'k' || s.back() == 'K')) {
    mult = 1024;
    s.remove_suffix(1);
  }
  if (s.empty() || !std::all_of(s.begin(), s.end(), [](char c) {
        return std::isdigit(static_cast<unsigned char>(c));
      })) {
    fail("{}: cannot read '{}': expected a whole number such as 8192 or 8k", what, text);
  }
  Wide value = 0;
  for (char c : s) {
    value = value * 10 + static_cast<unsigned>(c - '0');
    if (value * mult > kMax) fail("{}: '{}' is too large", what, text);
  }
  value *= mult;
  if (value == 0) fail("{} must be positive, got '{}'", what, text);
  return static_cast<uint64_t>(value);
}

std::vector<uint64_t> parse_count_list(const std::vector<std::string>& items,
                                       std::string_view what) {
  std::vector<uint64_t> out;
  for (const std::string& item : items) {
    std::string_view rest = item;
    while (true) {
      const size_t comma = rest.find(',');
      out.push_back(parse_count(rest.substr(0, comma), what));
      if (comma == std::string_view::npos) break;
      rest.remove_prefix(comma + 1);
    }
  }
  return out;
}

Plan make_plan(const PlanArgs& args) {
  std::vector<std::string> sources;
  if (!args.model_path.empty()) sources.push_back("--model " + args.model_path);
  if (!args.config_path.empty()) sources.push_back("--config " + args.config_path);
  if (!args.preset.empty()) sources.push_back("--preset " + args.preset);
  if (sources.empty()) {
    fail(
        "no model given: pass one of --model FILE.gguf, --config config.json or --preset NAME "
        "(presets: {})",
        fmt::join(preset_names(), ", "));
  }
  if (sources.size() > 1) {
    fail("conflicting model sources ({}): pass exactly one of --model, --config, --preset",
         fmt::join(sources, ", "));
  }
  if (args.contexts.empty()) {
    fail("--context is required: one or more context lengths, e.g. --context 8192,131072");
  }

  Plan plan;
  kv::PlanOptions& o = plan.options;
  o.contexts = parse_count_list(args.contexts, "--context");
  o.concurrencies = args.concurrencies.empty()
                        ? std::vector<uint64_t>{1}
                        : parse_count_list(args.concurrencies, "--concurrency");
  const KvDtypes kv = resolve_kv_dtypes(args.kv_dtypes, DType::F16, false);
  o.k_dtype = kv.k;
  o.v_dtype = kv.v;
  const uint64_t block =
      args.block_tokens.empty() ? 0 : parse_count(args.block_tokens, "--block-tokens");
  if (!args.block_tokens.empty() && (block == 0 || block > 4096)) {
    fail("--block-tokens must be 1..4096, got {}", args.block_tokens);
  }
  o.block_tokens = kv::block_tokens_for(o.k_dtype, static_cast<int>(block));
  if (args.weights != "included" && args.weights != "excluded") {
    fail("--weights must be 'included' or 'excluded', got '{}'", args.weights);
  }
  o.budget_includes_weights = args.weights == "included";
  if (!args.budget.empty()) o.budget_bytes = parse_byte_size(args.budget, "--budget");

  std::optional<DType> weights_dtype;
  if (!args.weights_dtype.empty()) {
    if (!args.model_path.empty()) {
      fail(
          "--weights-dtype applies to --config and --preset; a GGUF file's weights are the "
          "bytes it stores");
    }
    weights_dtype = parse_dtype(to_lower(args.weights_dtype));
    if (!weights_dtype) {
      fail("--weights-dtype: unknown dtype '{}'; use f32, f16, bf16, q8_0 or q4_0",
           args.weights_dtype);
    }
  }

  if (!args.model_path.empty()) {
    plan.model = geometry_from_gguf_file(args.model_path);
  } else if (!args.config_path.empty()) {
    plan.model = geometry_from_config_file(args.config_path, weights_dtype);
  } else {
    plan.model = geometry_from_preset(args.preset, weights_dtype);
  }
  o.weights_bytes = plan.model.weights_bytes;
  plan.figures = kv::plan_memory(plan.model.attention, o);
  return plan;
}

std::string render_table(const Plan& plan) {
  const kv::MemoryPlan& f = plan.figures;
  std::string out;
  out += fmt::format("model    {}\n", source_line(plan.model));
  out += fmt::format("weights  {}\n", weights_line(plan.model));
  out += fmt::format("KV       {}, {}-token blocks: {}/token, {}/block\n",
                     kv::kv_dtypes_name(f.k_dtype, f.v_dtype), f.block_tokens,
                     with_bytes(f.bytes_per_token), with_bytes(f.bytes_per_block));
  if (f.budget_bytes) {
    if (f.budget_includes_weights) {
      out += fmt::format("budget   {} including weights, leaving {} for KV\n",
                         with_bytes(*f.budget_bytes), with_bytes(*f.kv_budget_bytes));
    } else {
      out +=
          fmt::format("budget   {} for KV alone (weights excluded)\n", with_bytes(*f.budget_bytes));
    }
    out += fmt::format("pool     {} blocks = {}, holds {} tokens\n", *f.pool_blocks,
                       with_bytes(*f.pool_bytes), *f.pool_tokens);
  }
  if (plan.model.attention.has_window() && f.pool_layout) {
    const auto pool = plan.model.attention.pool_geometry(f.k_dtype, f.v_dtype, f.block_tokens);
    if (pool && pool->window_tokens > 0) {
      out += fmt::format(
          "note     every layer slides over {} tokens: a request holds the blocks its window "
          "touches and frees those behind it\n",
          pool->window_tokens);
    } else if (pool && pool->split_window > 0) {
      out += fmt::format(
          "note     the windowed layers ({} tokens) have blocks of their own: a request holds "
          "those their window touches, and the full layers' blocks of every token\n",
          pool->split_window);
    } else {
      out +=
          "note     the layers' windows differ: kvcache's block pool keeps every layer's K/V for "
          "every token; these figures are what it allocates\n";
    }
  } else if (plan.model.attention.has_window()) {
    out +=
        "note     these figures are for a paged cache that frees a windowed layer's blocks once "
        "they leave its window\n";
  } else if (!f.pool_layout && (f.k_dtype == DType::BF16 || f.v_dtype == DType::BF16)) {
    out +=
        "note     kvcache's block pool stores f32, f16, q8_0 or q4_0, not bf16; these figures "
        "are for a cache that stores bf16\n";
  } else if (!f.pool_layout && plan.model.attention.pool_geometry(DType::F16, DType::F16, 16)) {
    out +=
        "note     no 32-value group fits this model's KV heads in kvcache's block pool; these "
        "figures are for a cache that rounds each head's row up to whole groups\n";
  } else if (!f.pool_layout) {
    out +=
        "note     kvcache's block pool stores K/V heads of one shape; these figures are for "
        "a paged cache of the same blocks that stores this model's layers as they are\n";
  }

  out += "\nper request\n";
  out += fmt::format("  {:>9}  {:>11}  {:>11}  {:>11}  {:>8}  {:>15}\n", "context", "exact KV",
                     "allocated", "waste", "blocks", "max concurrency");
  for (const auto& r : f.requests) {
    out += fmt::format("  {:>9}  {:>11}  {:>11}  {:>11}  {:>8}  {:>15}\n", r.context,
                       format_bytes(r.exact_bytes), format_bytes(r.allocated_bytes),
                       format_bytes(r.waste_bytes), optional_count(r.blocks),
                       optional_count(r.max_concurrency));
  }

  out += "\ncontext x concurrency\n";
  out += fmt::format("  {:>9}  {:>11}  {:>11}  {:>12}  {:>4}\n", "context", "concurrency", "KV",
                     "KV + weights", "fits");
  for (const auto& c : f.cells) {
    const std::string fits = c.fits ? (*c.fits ? "yes" : "no") : "-";
    out += fmt::format("  {:>9}  {:>11}  {:>11}  {:>12}  {:>4}\n", c.context, c.concurrency,
                       format_bytes(c.kv_bytes), format_bytes(c.total_bytes), fits);
  }

  if (f.kv_budget_bytes) {
    out += "\nlongest context per request at each concurrency\n";
    out += fmt::format("  {:>11}  {:>11}\n", "concurrency", "max context");
    for (const auto& l : f.limits) {
      out += fmt::format("  {:>11}  {:>11}\n", l.concurrency,
                         l.max_context ? std::to_string(*l.max_context) : "unbounded");
    }
  }
  return out;
}

std::string render_json(const Plan& plan) {
  // Ordered, so that the output reads top-down: model, per-token figures, budget, tables.
  using json = nlohmann::ordered_json;
  const kv::MemoryPlan& f = plan.figures;
  const ModelGeometry& m = plan.model;
  const auto optional = [](const std::optional<uint64_t>& v) { return v ? json(*v) : json(); };

  json out;
  out["model"] = {
      {"name", m.name},
      {"source", m.source},
      {"architecture", m.architecture},
      {"attention", attention_kind(m)},
      {"description", describe_attention(m)},
      {"layers", m.attention.layers.size()},
      {"heads", m.n_heads},
      {"parameters", m.parameters},
      {"weights_dtype", m.weights_dtype ? json(dtype_name(*m.weights_dtype)) : json()},
  };
  out["kv_dtype_k"] = dtype_name(f.k_dtype);
  out["kv_dtype_v"] = dtype_name(f.v_dtype);
  out["block_tokens"] = f.block_tokens;
  out["pool_layout"] = f.pool_layout;
  out["bytes_per_token"] = f.bytes_per_token;
  out["bytes_per_block"] = f.bytes_per_block;
  out["weights_bytes"] = f.weights_bytes;
  if (f.budget_bytes) {
    out["budget"] = {
        {"bytes", *f.budget_bytes},
        {"weights", f.budget_includes_weights ? "included" : "excluded"},
        {"kv_bytes", *f.kv_budget_bytes},
        {"pool_blocks", *f.pool_blocks},
        {"pool_bytes", *f.pool_bytes},
        {"pool_tokens", *f.pool_tokens},
    };
  } else {
    out["budget"] = nullptr;
  }
  out["requests"] = json::array();
  for (const auto& r : f.requests) {
    out["requests"].push_back({
        {"context", r.context},
        {"exact_bytes", r.exact_bytes},
        {"allocated_bytes", r.allocated_bytes},
        {"waste_bytes", r.waste_bytes},
        {"blocks", optional(r.blocks)},
        {"max_concurrency", optional(r.max_concurrency)},
    });
  }
  out["totals"] = json::array();
  for (const auto& c : f.cells) {
    out["totals"].push_back({
        {"context", c.context},
        {"concurrency", c.concurrency},
        {"kv_bytes", c.kv_bytes},
        {"weights_bytes", f.weights_bytes},
        {"total_bytes", c.total_bytes},
        {"fits", c.fits ? json(*c.fits) : json()},
    });
  }
  out["max_context"] = json::array();
  if (f.kv_budget_bytes) {
    for (const auto& l : f.limits) {
      out["max_context"].push_back({
          {"concurrency", l.concurrency},
          {"tokens", optional(l.max_context)},
          {"unbounded", !l.max_context.has_value()},
      });
    }
  }
  return out.dump(2) + "\n";
}

std::string render_svg(const Plan& plan) {
  const kv::MemoryPlan& f = plan.figures;
  if (plan.options.contexts.empty() || plan.options.concurrencies.empty()) {
    fail("--plot needs at least one context length and one concurrency");
  }
  const uint64_t max_context =
      *std::max_element(plan.options.contexts.begin(), plan.options.contexts.end());
  // Enough samples to show the block staircase's trend, plus the requested contexts exactly.
  constexpr int kSamples = 200;
  kv::PlanOptions samples = plan.options;
  samples.budget_bytes.reset();
  samples.contexts.clear();
  for (int i = 1; i <= kSamples; ++i) {
    samples.contexts.push_back(std::max<uint64_t>(1, max_context * i / kSamples));
  }
  samples.contexts.insert(samples.contexts.end(), plan.options.contexts.begin(),
                          plan.options.contexts.end());
  std::sort(samples.contexts.begin(), samples.contexts.end());
  samples.contexts.erase(std::unique(samples.contexts.begin(), samples.contexts.end()),
                         samples.contexts.end());
  const kv::MemoryPlan curve = kv::plan_memory(plan.model.attention, samples);

  const bool with_weights = f.budget_includes_weights;
  const uint64_t base = with_weights ? f.weights_bytes : 0;
  uint64_t top = base;
  for (const auto& c : curve.cells) top = std::max(top, with_weights ? c.total_bytes : c.kv_bytes);
  double y_max = static_cast<double>(top);
  if (f.budget_bytes) {
    // Keep the budget readable: lines far above it are clipped at twice the budget.
    const double budget = static_cast<double>(*f.budget_bytes);
    y_max = std::max(budget * 1.1, std::min(y_max, budget * 2));
  }
  y_max = std::max(y_max, 1.0);

  constexpr double kWidth = 900, kHeight = 520;
  constexpr double kLeft = 90, kRight = 230, kTop = 50, kBottom = 70;
  constexpr double kPlotW = kWidth - kLeft - kRight, kPlotH = kHeight - kTop - kBottom;
  const double x_max = static_cast<double>(max_context);
  const auto px = [&](double tokens) { return kLeft + tokens / x_max * kPlotW; };
  const auto py = [&](double bytes) { return kTop + kPlotH - bytes / y_max * kPlotH; };

  static constexpr const char* kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
  size_t unit = 0;
  double unit_bytes = 1;
  while (y_max / unit_bytes >= 1024 && unit + 1 < std::size(kUnits)) {
    unit_bytes *= 1024;
    ++unit;
  }

  std::string out;
  out += fmt::format(
      "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
      "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{0}\" height=\"{1}\" "
      "viewBox=\"0 0 {0} {1}\" font-family=\"sans-serif\" font-size=\"12\">\n",
      kWidth, kHeight);
  out += fmt::format("<rect width=\"{}\" height=\"{}\" fill=\"white\"/>\n", kWidth, kHeight);
  out += fmt::format(
      "<text x=\"{}\" y=\"28\" font-size=\"16\" text-anchor=\"middle\">KV memory: {}, {} KV, "
      "{}-token blocks</text>\n",
      kLeft + kPlotW / 2, markup_escape(plan.model.name), kv::kv_dtypes_name(f.k_dtype, f.v_dtype),
      f.block_tokens);
  out += fmt::format(
      "<defs><clipPath id=\"plot\"><rect x=\"{}\" y=\"{}\" width=\"{}\" "
      "height=\"{}\"/></clipPath></defs>\n",
      kLeft, kTop, kPlotW, kPlotH);

  // Grid, ticks and labels.
  out += "<g class=\"axes\" stroke=\"#888\" stroke-width=\"1\">\n";
  const double x_step = nice_step(x_max, 6);
  for (double t = 0; t <= x_max * 1.0001; t += x_step) {
    out += fmt::format(
        "<line x1=\"{0:.1f}\" y1=\"{1}\" x2=\"{0:.1f}\" y2=\"{2}\" stroke=\"#eee\"/>"
        "<text x=\"{0:.1f}\" y=\"{3}\" text-anchor=\"middle\" stroke=\"none\" "
        "fill=\"black\">{4}</text>\n",
        px(t), kTop, kTop + kPlotH, kTop + kPlotH + 18, token_label(t));
  }
  const double y_step = nice_step(y_max / unit_bytes, 6) * unit_bytes;
  for (double b = 0; b <= y_max * 1.0001; b += y_step) {
    out += fmt::format(
        "<line x1=\"{0}\" y1=\"{1:.1f}\" x2=\"{2}\" y2=\"{1:.1f}\" stroke=\"#eee\"/>"
        "<text x=\"{3}\" y=\"{4:.1f}\" text-anchor=\"end\" stroke=\"none\" "
        "fill=\"black\">{5}</text>\n",
        kLeft, py(b), kLeft + kPlotW, kLeft - 8, py(b) + 4, trim_number(b / unit_bytes));
  }
  out += fmt::format("<rect x=\"{}\" y=\"{}\" width=\"{}\" height=\"{}\" fill=\"none\"/>\n", kLeft,
                     kTop, kPlotW, kPlotH);
  out += "</g>\n";
  out += fmt::format(
      "<text x=\"{}\" y=\"{}\" text-anchor=\"middle\">context length (tokens per "
      "request)</text>\n",
      kLeft + kPlotW / 2, kHeight - 25);
  out += fmt::format(
      "<text x=\"20\" y=\"{0}\" text-anchor=\"middle\" transform=\"rotate(-90 20 "
      "{0})\">memory ({1}, {2})</text>\n",
      kTop + kPlotH / 2, kUnits[unit], with_weights ? "KV + weights" : "KV only");

  // Data: weights floor, budget, one line per concurrency.
  out += "<g clip-path=\"url(#plot)\" fill=\"none\" stroke-width=\"2\">\n";
  if (with_weights && base > 0) {
    out += fmt::format(
        "<line class=\"weights\" x1=\"{0}\" y1=\"{1:.1f}\" x2=\"{2}\" "
        "y2=\"{1:.1f}\" stroke=\"#999\" stroke-dasharray=\"2 4\"/>\n",
        kLeft, py(static_cast<double>(base)), kLeft + kPlotW);
  }
  if (f.budget_bytes) {
    out += fmt::format(
        "<line class=\"budget\" x1=\"{0}\" y1=\"{1:.1f}\" x2=\"{2}\" "
        "y2=\"{1:.1f}\" stroke=\"#d62728\" stroke-dasharray=\"8 4\"/>\n",
        kLeft, py(static_cast<double>(*f.budget_bytes)), kLeft + kPlotW);
  }
  const size_t n_conc = plan.options.concurrencies.size();
  for (size_t k = 0; k < n_conc; ++k) {
    const uint64_t n = plan.options.concurrencies[k];
    std::string points = fmt::format("{:.1f},{:.1f}", px(0), py(static_cast<double>(base)));
    for (size_t i = 0; i < curve.requests.size(); ++i) {
      const auto& cell = curve.cells[i * n_conc + k];
      const auto bytes = static_cast<double>(with_weights ? cell.total_bytes : cell.kv_bytes);
      points += fmt::format(" {:.1f},{:.1f}", px(static_cast<double>(cell.context)), py(bytes));
    }
    out += fmt::format(
        "<polyline class=\"concurrency\" data-concurrency=\"{}\" stroke=\"{}\" "
        "points=\"{}\"/>\n",
        n, kPalette[k % std::size(kPalette)], points);
  }
  out += "</g>\n";

  // Legend.
  double ly = kTop + 10;
  const double lx = kLeft + kPlotW + 20;
  out += "<g class=\"legend\">\n";
  const auto entry = [&](const std::string& style, const std::string& label) {
    out += fmt::format(
        "<line x1=\"{}\" y1=\"{:.1f}\" x2=\"{}\" y2=\"{:.1f}\" {}/>"
        "<text x=\"{}\" y=\"{:.1f}\">{}</text>\n",
        lx, ly, lx + 24, ly, style, lx + 30, ly + 4, markup_escape(label));
    ly += 20;
  };
  for (size_t k = 0; k < n_conc; ++k) {
    const uint64_t n = plan.options.concurrencies[k];
    entry(fmt::format("stroke=\"{}\" stroke-width=\"2\"", kPalette[k % std::size(kPalette)]),
          fmt::format("{} request{} at once", n, n == 1 ? "" : "s"));
  }
  if (f.budget_bytes) {
    entry("stroke=\"#d62728\" stroke-width=\"2\" stroke-dasharray=\"8 4\"",
          "budget " + format_bytes(*f.budget_bytes));
  }
  if (with_weights && base > 0) {
    entry("stroke=\"#999\" stroke-width=\"2\" stroke-dasharray=\"2 4\"",
          "weights " + format_bytes(base));
  }
  out += "</g>\n</svg>\n";
  return out;
}

void run_plan(const PlanArgs& args, std::ostream& out) {
  const Plan plan = make_plan(args);
  if (!args.plot_path.empty()) {
    std::ofstream file(args.plot_path, std::ios::binary | std::ios::trunc);
    if (!file) fail("--plot: cannot write '{}': {}", args.plot_path, std::strerror(errno));
    file << render_svg(plan);
    file.close();
    if (!file) fail("--plot: error writing '{}'", args.plot_path);
  }
  const bool tiers =
      !args.model_path.empty() && (!args.tiers.disk.empty() || !args.tiers.redis.empty());
  if (!args.tiers.disk.empty() || !args.tiers.redis.empty()) {
    if (args.model_path.empty()) fail("--kv-disk/--kv-redis: timing the tiers needs --model");
  }
  const int block_tokens = plan.options.block_tokens;
  if (args.json) {
    if (!tiers) {
      out << render_json(plan);
      return;
    }
    nlohmann::json j = nlohmann::json::parse(render_json(plan));
    j["tier_costs"] = nlohmann::json::parse(
        tier_cost_report(args.model_path, args.tiers, plan.options.k_dtype, plan.options.v_dtype,
                         block_tokens, thread_count(args.threads), true));
    out << j.dump(2) << "\n";
  } else {
    out << render_table(plan);
    if (!args.plot_path.empty()) out << "\nplot written to " << args.plot_path << "\n";
    if (tiers) {
      out << "\n"
          << tier_cost_report(args.model_path, args.tiers, plan.options.k_dtype,
                              plan.options.v_dtype, block_tokens, thread_count(args.threads),
                              false);
    }
  }
}

}  // namespace kvc::cli
