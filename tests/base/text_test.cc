#include <gtest/gtest.h>

#include "base/byte_size.h"
#include "base/error.h"
#include "base/strings.h"
#include "base/utf8.h"

namespace kvc {
namespace {

TEST(ByteSize, ParsesUnits) {
  EXPECT_EQ(parse_byte_size("1048576"), 1048576u);
  EXPECT_EQ(parse_byte_size("512MiB"), 512u << 20);
  EXPECT_EQ(parse_byte_size("24GiB"), 24ull << 30);
  EXPECT_EQ(parse_byte_size("80GB"), 80000000000ull);
  EXPECT_EQ(parse_byte_size("1.5 kib"), 1536u);
  EXPECT_EQ(format_bytes(16 << 20), "16.0 MiB");
  EXPECT_EQ(format_bytes(100), "100 B");
}

TEST(ByteSize, RejectsBadSizes) {
  for (const char* bad : {"", "abc", "0", "-5GiB", "12XB", "GiB", "1e9"}) {
    EXPECT_THROW(parse_byte_size(bad), Error) << bad;
  }
  try {
    parse_byte_size("12XB");
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("'12XB'"), std::string::npos);
  }
}

TEST(Utf8, HoldsBackUnfinishedCharacters) {
  EXPECT_EQ(utf8_complete_prefix("abc"), 3u);
  EXPECT_EQ(utf8_complete_prefix("a\xe2\x82\xac"), 4u);  // a + euro sign
  EXPECT_EQ(utf8_complete_prefix("a\xe2"), 1u);
  EXPECT_EQ(utf8_complete_prefix("a\xe2\x82"), 1u);
  EXPECT_EQ(utf8_complete_prefix("\xf0\x9f\x98"), 0u);
  EXPECT_EQ(utf8_complete_prefix("\xf0\x9f\x98\x80"), 4u);
  EXPECT_EQ(utf8_complete_prefix("a\x80"), 2u);  // stray continuation byte passes
  EXPECT_EQ(utf8_complete_prefix("\xff"), 1u);   // invalid lead byte passes
}

TEST(Utf8, SequenceLengthFromTheLeadByte) {
  EXPECT_EQ(utf8_sequence_length("a", 0), 1u);
  EXPECT_EQ(utf8_sequence_length("\xc3\xa9", 0), 2u);
  EXPECT_EQ(utf8_sequence_length("a\xe2\x82\xac", 1), 3u);
  EXPECT_EQ(utf8_sequence_length("\xf0\x9f\x98\x80", 0), 4u);
  EXPECT_EQ(utf8_sequence_length("\xf0\x9f\x98", 0), 1u);  // would run past the end
  EXPECT_EQ(utf8_sequence_length("\xc3\xa9", 1), 1u);      // a continuation byte
  EXPECT_EQ(utf8_sequence_length("\xff\x80", 0), 1u);      // no lead byte
  EXPECT_EQ(utf8_sequence_length("\xc3"
                                 "A",
                                 0),
            2u);  // from the lead byte alone
}

TEST(MarkupEscape, EscapesTheFiveSpecialCharacters) {
  EXPECT_EQ(markup_escape("plain text"), "plain text");
  EXPECT_EQ(markup_escape("<a href=\"x\">&'"), "&lt;a href=&#34;x&#34;&gt;&amp;&#39;");
  EXPECT_EQ(markup_escape(""), "");
}

}  // namespace
}  // namespace kvc
