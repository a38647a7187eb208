#include "trainer_ref/hf/json.h"

#include <cstdlib>

#include "absl/strings/str_format.h"

namespace tierd::trainer::hf {
namespace {

constexpr int kMaxDepth = 64;

class Parser {
 public:
  explicit Parser(std::string_view text) : text_(text) {}

  absl::StatusOr<JsonValue> Document() {
    JsonValue value;
    if (absl::Status s = Value(&value, 0); !s.ok()) return s;
    Space();
    if (at_ != text_.size()) return Error("the value ends, but the text goes on");
    return value;
  }

 private:
  absl::Status Error(const std::string& what) const {
    return absl::InvalidArgumentError(absl::StrFormat("at byte %d: %s", at_, what));
  }
  void Space() {
    while (at_ < text_.size() && (text_[at_] == ' ' || text_[at_] == '\n' || text_[at_] == '\r' || text_[at_] == '\t')) {
      ++at_;
    }
  }
  bool Literal(std::string_view word) {
    if (text_.substr(at_, word.size()) != word) return false;
    at_ += word.size();
    return true;
  }

  absl::Status Value(JsonValue* out, int depth) {
    if (depth > kMaxDepth) return Error("nested deeper than 64");
    Space();
    if (at_ >= text_.size()) return Error("a value was expected, the text ended");
    const char c = text_[at_];
    if (c == '{') return Object(out, depth);
    if (c == '[') return Array(out, depth);
    if (c == '"') {
      out->kind = JsonValue::Kind::kString;
      return String(&out->text);
    }
    if (c == '-' || (c >= '0' && c <= '9')) return Number(out);
    if (Literal("true")) {
      out->kind = JsonValue::Kind::kBool;
      out->boolean = true;
      return absl::OkStatus();
    }
    if (Literal("false")) {
      out->kind = JsonValue::Kind::kBool;
      return absl::OkStatus();
    }
    if (Literal("null")) return absl::OkStatus();
    return Error(absl::StrFormat("'%c' cannot start a value", c));
  }

  absl::Status Object(JsonValue* out, int depth) {
    out->kind = JsonValue::Kind::kObject;
    ++at_;  // {
    Space();
    if (at_ < text_.size() && text_[at_] == '}') {
      ++at_;
      return absl::OkStatus();
    }
    while (true) {
      Space();
      if (at_ >= text_.size() || text_[at_] != '"') return Error("an object's key (a string) was expected");
      std::string key;
      if (absl::Status s = String(&key); !s.ok()) return s;
      if (out->Find(key) != nullptr) return Error(absl::StrFormat("the key \"%s\" appears twice", key));
      Space();
      if (at_ >= text_.size() || text_[at_] != ':') return Error("':' was expected after a key");
      ++at_;
      JsonValue value;
      if (absl::Status s = Value(&value, depth + 1); !s.ok()) return s;
      out->members.emplace_back(std::move(key), std::move(value));
      Space();
      if (at_ < text_.size() && text_[at_] == ',') {
        ++at_;
        continue;
      }
      if (at_ < text_.size() && text_[at_] == '}') {
        ++at_;
        return absl::OkStatus();
      }
      return Error("',' or '}' was expected in an object");
    }
  }

  absl::Status Array(JsonValue* out, int depth) {
    out->kind = JsonValue::Kind::kArray;
    ++at_;  // [
    Space();
    if (at_ < text_.size() && text_[at_] == ']') {
      ++at_;
      return absl::OkStatus();
    }
    while (true) {
      JsonValue value;
      if (absl::Status s = Value(&value, depth + 1); !s.ok()) return s;
      out->items.push_back(std::move(value));
      Space();
      if (at_ < text_.size() && text_[at_] == ',') {
        ++at_;
        continue;
      }
      if (at_ < text_.size() && text_[at_] == ']') {
        ++at_;
        return absl::OkStatus();
      }
      return Error("',' or ']' was expected in an array");
    }
  }

  absl::Status Hex4(uint32_t* out) {
    if (at_ + 4 > text_.size()) return Error("a \\u escape needs four hex digits");
    uint32_t v = 0;
    for (int i = 0; i < 4; ++i) {
      const char c = text_[at_++];
      v <<= 4;
      if (c >= '0' && c <= '9') v |= c - '0';
      else if (c >= 'a' && c <= 'f') v |= c - 'a' + 10;
      else if (c >= 'A' && c <= 'F') v |= c - 'A' + 10;
      else return Error("a \\u escape needs four hex digits");
    }
    *out = v;
    return absl::OkStatus();
  }

  static void AppendUtf8(uint32_t cp, std::string* out) {
    if (cp < 0x80) {
      out->push_back(static_cast<char>(cp));
    } else if (cp < 0x800) {
      out->push_back(static_cast<char>(0xc0 | (cp >> 6)));
      out->push_back(static_cast<char>(0x80 | (cp & 0x3f)));
    } else if (cp < 0x10000) {
      out->push_back(static_cast<char>(0xe0 | (cp >> 12)));
      out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3f)));
      out->push_back(static_cast<char>(0x80 | (cp & 0x3f)));
    } else {
      out->push_back(static_cast<char>(0xf0 | (cp >> 18)));
      out->push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3f)));
      out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3f)));
      out->push_back(static_cast<char>(0x80 | (cp & 0x3f)));
    }
  }

  absl::Status String(std::string* out) {
    ++at_;  // "
    while (true) {
      if (at_ >= text_.size()) return Error("a string is not closed");
      const char c = text_[at_++];
      if (c == '"') return absl::OkStatus();
      if (static_cast<unsigned char>(c) < 0x20) return Error("a control character inside a string");
      if (c != '\\') {
        out->push_back(c);
        continue;
      }
      if (at_ >= text_.size()) return Error("a string is not closed");
      const char e = text_[at_++];
      switch (e) {
        case '"': case '\\': case '/': out->push_back(e); break;
        case 'b': out->push_back('\b'); break;
        case 'f': out->push_back('\f'); break;
        case 'n': out->push_back('\n'); break;
        case 'r': out->push_back('\r'); break;
        case 't': out->push_back('\t'); break;
        case 'u': {
          uint32_t cp = 0;
          if (absl::Status s = Hex4(&cp); !s.ok()) return s;
          if (cp >= 0xd800 && cp < 0xdc00 && text_.substr(at_, 2) == "\\u") {  // a surrogate pair
            at_ += 2;
            uint32_t low = 0;
            if (absl::Status s = Hex4(&low); !s.ok()) return s;
            if (low < 0xdc00 || low >= 0xe000) return Error("a high surrogate without its low one");
            cp = 0x10000 + ((cp - 0xd800) << 10) + (low - 0xdc00);
          }
          AppendUtf8(cp, out);
          break;
        }
        default:
          return Error(absl::StrFormat("'\\%c' is not an escape", e));
      }
    }
  }

  absl::Status Number(JsonValue* out) {
    const size_t start = at_;
    if (text_[at_] == '-') ++at_;
    auto digits = [&] {
      const size_t from = at_;
      while (at_ < text_.size() && text_[at_] >= '0' && text_[at_] <= '9') ++at_;
      return at_ > from;
    };
    if (at_ < text_.size() && text_[at_] == '0') {
      ++at_;
    } else if (!digits()) {
      return Error("a number needs digits");
    }
    if (at_ < text_.size() && text_[at_] == '.') {
      ++at_;
      if (!digits()) return Error("a number's fraction needs digits");
    }
    if (at_ < text_.size() && (text_[at_] == 'e' || text_[at_] == 'E')) {
      ++at_;
      if (at_ < text_.size() && (text_[at_] == '+' || text_[at_] == '-')) ++at_;
      if (!digits()) return Error("a number's exponent needs digits");
    }
    out->kind = JsonValue::Kind::kNumber;
    out->text = std::string(text_.substr(start, at_ - start));
    out->number = std::strtod(out->text.c_str(), nullptr);
    return absl::OkStatus();
  }

  std::string_view text_;
  size_t at_ = 0;
};

}  // namespace

const JsonValue* JsonValue::Find(std::string_view key) const {
  for (const auto& [name, value] : members) {
    if (name == key) return &value;
  }
  return nullptr;
}

bool JsonValue::AsUint64(uint64_t* out) const {
  if (kind != Kind::kNumber || text.empty() || text.size() > 20) return false;
  uint64_t v = 0;
  for (char c : text) {
    if (c < '0' || c > '9') return false;
    const auto digit = static_cast<uint64_t>(c - '0');
    if (v > (~uint64_t{0} - digit) / 10) return false;  // beyond 2^64
    v = v * 10 + digit;
  }
  *out = v;
  return true;
}

absl::StatusOr<JsonValue> ParseJson(std::string_view text) { return Parser(text).Document(); }

std::string JsonQuote(std::string_view s) {
  std::string out = "\"";
  for (char c : s) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          out += absl::StrFormat("\\u%04x", c);
        } else {
          out.push_back(c);
        }
    }
  }
  return out + "\"";
}

}  // namespace tierd::trainer::hf
