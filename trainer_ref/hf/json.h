// A small, strict JSON reader for safetensors headers and Hugging Face's index and config
// files (RFC 8259: objects, arrays, strings with escapes, numbers, true, false, null), errors
// naming the byte offset. Not a general-purpose library: the whole text is parsed into a tree.
#ifndef TIERD_TRAINER_REF_HF_JSON_H_
#define TIERD_TRAINER_REF_HF_JSON_H_

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"

namespace tierd::trainer::hf {

struct JsonValue {
  enum class Kind { kNull, kBool, kNumber, kString, kArray, kObject };
  Kind kind = Kind::kNull;
  bool boolean = false;
  double number = 0;
  std::string text;  // a string's value, or a number's text (exact integers up to 2^64)
  std::vector<JsonValue> items;                             // an array's
  std::vector<std::pair<std::string, JsonValue>> members;  // an object's, in the text's order
  // The member named `key`, or null.
  const JsonValue* Find(std::string_view key) const;
  // A number that is a whole number in [0, 2^64): its value; false otherwise.
  bool AsUint64(uint64_t* out) const;
};

// INVALID_ARGUMENT "at byte N: what was expected" for text that is not one JSON value (with
// nothing but white space after it), nesting deeper than 64, or an object key given twice.
absl::StatusOr<JsonValue> ParseJson(std::string_view text);

// `s` as a JSON string literal, quotes included.
std::string JsonQuote(std::string_view s);

}  // namespace tierd::trainer::hf

#endif  // TIERD_TRAINER_REF_HF_JSON_H_
