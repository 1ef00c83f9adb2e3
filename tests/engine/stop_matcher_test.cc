#include "engine/stop_matcher.h"

#include <gtest/gtest.h>

namespace kvc::engine {
namespace {

std::string feed(StopMatcher& m, const std::vector<std::string>& pieces, std::string* trace) {
  std::string out;
  for (const auto& p : pieces) {
    const std::string delta = m.push(p);
    out += delta;
    if (trace) *trace += "[" + delta + "]";
    if (m.stopped()) break;
  }
  return out;
}

TEST(StopMatcher, StopsOnAStringSplitAcrossTokensWithoutEmittingAnyOfIt) {
  StopMatcher m({"</end>"});
  std::string trace;
  const std::string out = feed(m, {"Hello", " wor", "ld</", "en", "d> tail"}, &trace);
  EXPECT_EQ(out, "Hello world");
  EXPECT_TRUE(m.stopped());
  EXPECT_EQ(m.matched(), "</end>");
  EXPECT_EQ(trace, "[Hello][ wor][ld][][]");  // "</" and "en" were held back, never emitted
  EXPECT_EQ(m.push("more"), "");
}

TEST(StopMatcher, ReleasesHeldTextWhenTheStopDoesNotComplete) {
  StopMatcher m({"STOP"});
  EXPECT_EQ(m.push("ab ST"), "ab ");
  EXPECT_EQ(m.push("AR"), "STAR");
  EXPECT_FALSE(m.stopped());
  EXPECT_EQ(m.push("xS"), "x");
  EXPECT_EQ(m.flush(), "S");
}

TEST(StopMatcher, EarliestOfSeveralStopsWins) {
  StopMatcher m({"cd", "b"});
  EXPECT_EQ(m.push("abcd"), "a");
  EXPECT_EQ(m.matched(), "b");
}

TEST(StopMatcher, NeverSplitsAUtf8Character) {
  StopMatcher m({});
  EXPECT_EQ(m.push("caf\xc3"), "caf");
  EXPECT_EQ(m.push("\xa9!"), "\xc3\xa9!");
}

TEST(StopMatcher, HoldsAFourByteCharacterSplitAcrossByteLevelTokens) {
  // Byte-level BPE spells an emoji it has no merge for as four one-byte tokens.
  StopMatcher m({});
  EXPECT_EQ(m.push("\xf0"), "");
  EXPECT_EQ(m.push("\x9f"), "");
  EXPECT_EQ(m.push("\x98"), "");
  EXPECT_EQ(m.push("\x80 ok"), "\xf0\x9f\x98\x80 ok");
}

TEST(StopMatcher, NoStopsPassesEverything) {
  StopMatcher m({"", ""});
  EXPECT_EQ(m.push("a"), "a");
  EXPECT_FALSE(m.stopped());
}

}  // namespace
}  // namespace kvc::engine
