#include "trainer_ref/hf/json.h"

#include <gtest/gtest.h>

namespace tierd::trainer::hf {
namespace {

TEST(JsonTest, ReadsEveryKindOfValue) {
  auto v = ParseJson(R"( {"a": [1, -2.5e3, true, false, null], "s": "x\"\\\n\u00e9\ud83d\ude00", "big": 18446744073709551615} )");
  ASSERT_TRUE(v.ok()) << v.status();
  const JsonValue* a = v->Find("a");
  ASSERT_NE(a, nullptr);
  ASSERT_EQ(a->items.size(), 5u);
  EXPECT_EQ(a->items[0].number, 1);
  EXPECT_EQ(a->items[1].number, -2500);
  EXPECT_TRUE(a->items[2].boolean);
  EXPECT_EQ(a->items[3].kind, JsonValue::Kind::kBool);
  EXPECT_EQ(a->items[4].kind, JsonValue::Kind::kNull);
  EXPECT_EQ(v->Find("s")->text, "x\"\\\n\xc3\xa9\xf0\x9f\x98\x80");
  uint64_t big = 0;
  EXPECT_TRUE(v->Find("big")->AsUint64(&big));
  EXPECT_EQ(big, ~uint64_t{0});
  EXPECT_FALSE(a->items[1].AsUint64(&big)) << "negative and fractional numbers are not offsets";
  EXPECT_EQ(v->Find("missing"), nullptr);
}

TEST(JsonTest, MalformedTextIsRefusedWithItsByteOffset) {
  struct Case {
    const char* text;
    const char* says;
  };
  for (const Case& c : {Case{"{\"a\": 1,}", "at byte 8: an object's key"}, Case{"[1 2]", "at byte 3: ',' or ']'"},
                        Case{"{\"a\": 1} x", "at byte 9: the value ends, but the text goes on"},
                        Case{"\"open", "a string is not closed"}, Case{"{\"k\": 1, \"k\": 2}", "appears twice"},
                        Case{"01", "the text goes on"}, Case{"nul", "cannot start a value"},
                        Case{"18446744073709551616", ""}}) {
    auto v = ParseJson(c.text);
    if (std::string(c.says).empty()) {  // valid JSON, but not an offset: too large
      ASSERT_TRUE(v.ok());
      uint64_t x = 0;
      EXPECT_FALSE(v->AsUint64(&x));
      continue;
    }
    ASSERT_FALSE(v.ok()) << c.text;
    EXPECT_EQ(v.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(v.status().message().find(c.says), absl::string_view::npos) << v.status();
  }
  std::string deep(100, '[');
  EXPECT_NE(ParseJson(deep).status().message().find("deeper than 64"), absl::string_view::npos);
}

TEST(JsonTest, QuotedStringsReadBack) {
  const std::string s = "tab\there \"quoted\" back\\slash \x01";
  auto v = ParseJson(JsonQuote(s));
  ASSERT_TRUE(v.ok()) << v.status();
  EXPECT_EQ(v->text, s);
}

}  // namespace
}  // namespace tierd::trainer::hf
