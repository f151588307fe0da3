#include "tune/json.hpp"

#include <cmath>
#include <locale>
#include <sstream>
#include <stdexcept>

namespace sparsek::json {

const Value* Value::find(const std::string& key) const {
  if (type != Type::object) return nullptr;
  for (const auto& kv : object)
    if (kv.first == key) return &kv.second;
  return nullptr;
}

Value& Value::set(const std::string& key, Value v) {
  type = Type::object;
  for (auto& kv : object)
    if (kv.first == key) return kv.second = std::move(v);
  object.emplace_back(key, std::move(v));
  return object.back().second;
}

namespace {

constexpr int kMaxDepth = 64;  // our files nest 4 deep; a bound keeps hostile input off the stack

class Parser {
 public:
  explicit Parser(const std::string& s) : s_(s) {}

  Value document() {
    Value v = value(0);
    skip_ws();
    if (i_ != s_.size()) fail("trailing characters");
    return v;
  }

 private:
  const std::string& s_;
  size_t i_ = 0;

  [[noreturn]] void fail(const std::string& what) const {
    throw std::runtime_error("json: " + what + " at byte " + std::to_string(i_));
  }
  void skip_ws() {
    while (i_ < s_.size() && (s_[i_] == ' ' || s_[i_] == '\t' || s_[i_] == '\n' || s_[i_] == '\r')) ++i_;
  }
  bool eat(char c) {
    skip_ws();
    if (i_ < s_.size() && s_[i_] == c) {
      ++i_;
      return true;
    }
    return false;
  }
  void expect(char c) {
    if (!eat(c)) fail(std::string("expected '") + c + "'");
  }
  bool literal(const char* word) {
    size_t n = std::char_traits<char>::length(word);
    if (s_.compare(i_, n, word) != 0) return false;
    i_ += n;
    return true;
  }

  Value value(int depth) {
    if (depth > kMaxDepth) fail("nesting deeper than " + std::to_string(kMaxDepth));
    skip_ws();
    if (i_ >= s_.size()) fail("unexpected end of input");
    char c = s_[i_];
    if (c == '{') return object(depth);
    if (c == '[') return array(depth);
    if (c == '"') return Value(string());
    if (c == '-' || (c >= '0' && c <= '9')) return number();
    if (literal("true")) return Value(true);
    if (literal("false")) return Value(false);
    if (literal("null")) return Value();
    fail(std::string("unexpected character '") + c + "'");
  }

  Value object(int depth) {
    ++i_;  // '{'
    Value v = Value::make_object();
    if (eat('}')) return v;
    do {
      skip_ws();
      if (i_ >= s_.size() || s_[i_] != '"') fail("expected a string key");
      std::string key = string();
      expect(':');
      Value item = value(depth + 1);
      if (!v.find(key)) v.object.emplace_back(std::move(key), std::move(item));
    } while (eat(','));
    expect('}');
    return v;
  }

  Value array(int depth) {
    ++i_;  // '['
    Value v = Value::make_array();
    if (eat(']')) return v;
    do v.array.push_back(value(depth + 1));
    while (eat(','));
    expect(']');
    return v;
  }

  unsigned hex4() {
    if (i_ + 4 > s_.size()) fail("truncated \\u escape");
    unsigned u = 0;
    for (int k = 0; k < 4; ++k) {
      char c = s_[i_++];
      u <<= 4;
      if (c >= '0' && c <= '9') u |= unsigned(c - '0');
      else if (c >= 'a' && c <= 'f') u |= unsigned(c - 'a' + 10);
      else if (c >= 'A' && c <= 'F') u |= unsigned(c - 'A' + 10);
      else fail("bad hex digit in \\u escape");
    }
    return u;
  }

  static void put_utf8(std::string& out, unsigned cp) {
    if (cp < 0x80) {
      out += char(cp);
    } else if (cp < 0x800) {
      out += char(0xc0 | (cp >> 6));
      out += char(0x80 | (cp & 0x3f));
    } else if (cp < 0x10000) {
      out += char(0xe0 | (cp >> 12));
      out += char(0x80 | ((cp >> 6) & 0x3f));
      out += char(0x80 | (cp & 0x3f));
    } else {
      out += char(0xf0 | (cp >> 18));
      out += char(0x80 | ((cp >> 12) & 0x3f));
      out += char(0x80 | ((cp >> 6) & 0x3f));
      out += char(0x80 | (cp & 0x3f));
    }
  }

  std::string string() {
    ++i_;  // opening quote
    std::string out;
    while (true) {
      if (i_ >= s_.size()) fail("unterminated string");
      char c = s_[i_++];
      if (c == '"') return out;
      if (static_cast<unsigned char>(c) < 0x20) fail("control character in string");
      if (c != '\\') {
        out += c;
        continue;
      }
      if (i_ >= s_.size()) fail("unterminated escape");
      char e = s_[i_++];
      switch (e) {
        case '"': out += '"'; break;
        case '\\': out += '\\'; break;
        case '/': out += '/'; break;
        case 'b': out += '\b'; break;
        case 'f': out += '\f'; break;
        case 'n': out += '\n'; break;
        case 'r': out += '\r'; break;
        case 't': out += '\t'; break;
        case 'u': {
          unsigned cp = hex4();
          if (cp >= 0xd800 && cp < 0xdc00) {  // high surrogate: needs its low half
            if (!literal("\\u")) fail("unpaired surrogate");
            unsigned lo = hex4();
            if (lo < 0xdc00 || lo >= 0xe000) fail("bad low surrogate");
            cp = 0x10000 + ((cp - 0xd800) << 10) + (lo - 0xdc00);
          } else if (cp >= 0xdc00 && cp < 0xe000) {
            fail("unpaired surrogate");
          }
          put_utf8(out, cp);
          break;
        }
        default: fail(std::string("bad escape '\\") + e + "'");
      }
    }
  }

  Value number() {
    // Check the JSON grammar ourselves, then convert with the classic locale (strtod would
    // follow LC_NUMERIC and read "1.5" wrongly under a comma locale).
    size_t start = i_;
    if (s_[i_] == '-') ++i_;
    auto digits = [&] {
      size_t d = i_;
      while (i_ < s_.size() && s_[i_] >= '0' && s_[i_] <= '9') ++i_;
      return i_ - d;
    };
    if (i_ < s_.size() && s_[i_] == '0') ++i_;
    else if (digits() == 0) fail("bad number");
    if (i_ < s_.size() && s_[i_] == '.') {
      ++i_;
      if (digits() == 0) fail("bad number fraction");
    }
    if (i_ < s_.size() && (s_[i_] == 'e' || s_[i_] == 'E')) {
      ++i_;
      if (i_ < s_.size() && (s_[i_] == '+' || s_[i_] == '-')) ++i_;
      if (digits() == 0) fail("bad number exponent");
    }
    std::istringstream in(s_.substr(start, i_ - start));
    in.imbue(std::locale::classic());
    double d = 0;
    in >> d;
    if (in.fail()) d = s_[start] == '-' ? -HUGE_VAL : HUGE_VAL;  // out of range: keep the sign
    return Value(d);
  }
};

void write_string(std::ostream& out, const std::string& s) {
  out << '"';
  for (char ch : s) {
    auto c = static_cast<unsigned char>(ch);
    switch (c) {
      case '"': out << "\\\""; break;
      case '\\': out << "\\\\"; break;
      case '\n': out << "\\n"; break;
      case '\r': out << "\\r"; break;
      case '\t': out << "\\t"; break;
      default:
        if (c < 0x20) {
          const char* hex = "0123456789abcdef";
          out << "\\u00" << hex[c >> 4] << hex[c & 15];
        } else {
          out << ch;
        }
    }
  }
  out << '"';
}

void write(std::ostream& out, const Value& v, int indent) {
  auto newline = [&](int n) {
    out << '\n';
    for (int k = 0; k < n; ++k) out << "  ";
  };
  switch (v.type) {
    case Value::Type::null: out << "null"; break;
    case Value::Type::boolean: out << (v.boolean ? "true" : "false"); break;
    case Value::Type::number:
      if (!std::isfinite(v.number)) out << "null";
      else if (v.number == std::floor(v.number) && std::fabs(v.number) < 9007199254740992.0)
        out << static_cast<int64_t>(v.number);
      else
        out << v.number;  // precision 17 set by dump(): round-trips exactly
      break;
    case Value::Type::string: write_string(out, v.string); break;
    case Value::Type::array:
      if (v.array.empty()) {
        out << "[]";
        break;
      }
      out << '[';
      for (size_t k = 0; k < v.array.size(); ++k) {
        if (k) out << ',';
        newline(indent + 1);
        write(out, v.array[k], indent + 1);
      }
      newline(indent);
      out << ']';
      break;
    case Value::Type::object:
      if (v.object.empty()) {
        out << "{}";
        break;
      }
      out << '{';
      for (size_t k = 0; k < v.object.size(); ++k) {
        if (k) out << ',';
        newline(indent + 1);
        write_string(out, v.object[k].first);
        out << ": ";
        write(out, v.object[k].second, indent + 1);
      }
      newline(indent);
      out << '}';
      break;
  }
}

}  // namespace

Value parse(const std::string& text) { return Parser(text).document(); }

std::string dump(const Value& v) {
  std::ostringstream out;
  out.imbue(std::locale::classic());
  out.precision(17);
  write(out, v, 0);
  out << '\n';
  return out.str();
}

}  // namespace sparsek::json
