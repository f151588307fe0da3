// Internal: a minimal JSON reader/writer for the tuning cache. Enough of RFC 8259 to read back
// what we write and to reject (never crash on) anything else: objects keep their key order,
// numbers are doubles (exact for the integers we store, all < 2^53), nesting depth is bounded.
#pragma once
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace sparsek::json {

struct Value {
  enum class Type { null, boolean, number, string, array, object };
  Type type = Type::null;
  bool boolean = false;
  double number = 0;
  std::string string;
  std::vector<Value> array;
  std::vector<std::pair<std::string, Value>> object;  // in file order; duplicate keys: first wins

  Value() = default;
  static Value make_object() { Value v; v.type = Type::object; return v; }
  static Value make_array() { Value v; v.type = Type::array; return v; }
  Value(const std::string& s) : type(Type::string), string(s) {}
  Value(const char* s) : type(Type::string), string(s) {}
  Value(double d) : type(Type::number), number(d) {}
  Value(int64_t i) : type(Type::number), number(double(i)) {}
  Value(int i) : type(Type::number), number(double(i)) {}
  Value(bool b) : type(Type::boolean), boolean(b) {}

  bool is_object() const { return type == Type::object; }
  bool is_array() const { return type == Type::array; }
  bool is_string() const { return type == Type::string; }
  bool is_number() const { return type == Type::number; }

  // Object access: nullptr when this is not an object or the key is absent.
  const Value* find(const std::string& key) const;
  // Appends (or replaces) key in an object.
  Value& set(const std::string& key, Value v);
};

// Throws std::runtime_error("json: <what> at byte <offset>") on malformed text.
Value parse(const std::string& text);
// Pretty-printed with 2-space indent; non-finite numbers are written as null.
std::string dump(const Value& v);

}  // namespace sparsek::json
