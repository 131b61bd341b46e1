#include "tokenizer/py_json.h"

#include <fmt/format.h>

namespace kvtier {
namespace {

// Python's json string encoder with ensure_ascii=False (json.encoder.ESCAPE).
void dump_string(const std::string& s, std::string& out) {
  out += '"';
  for (unsigned char c : s) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      case '\b': out += "\\b"; break;
      case '\f': out += "\\f"; break;
      default:
        if (c < 0x20) out += fmt::format("\\u{:04x}", c);
        else out += char(c);
    }
  }
  out += '"';
}

void dump(const nlohmann::ordered_json& v, int indent, int level, std::string& out) {
  const bool pretty = indent >= 0;
  auto newline = [&](int lvl) {
    out += '\n';
    out.append(size_t(indent * lvl), ' ');
  };
  switch (v.type()) {
    case nlohmann::json::value_t::object: {
      if (v.empty()) {
        out += "{}";
        return;
      }
      out += '{';
      bool first = true;
      for (const auto& [key, item] : v.items()) {
        if (!first) out += pretty ? "," : ", ";
        first = false;
        if (pretty) newline(level + 1);
        dump_string(key, out);
        out += ": ";
        dump(item, indent, level + 1, out);
      }
      if (pretty) newline(level);
      out += '}';
      return;
    }
    case nlohmann::json::value_t::array: {
      if (v.empty()) {
        out += "[]";
        return;
      }
      out += '[';
      bool first = true;
      for (const auto& item : v) {
        if (!first) out += pretty ? "," : ", ";
        first = false;
        if (pretty) newline(level + 1);
        dump(item, indent, level + 1, out);
      }
      if (pretty) newline(level);
      out += ']';
      return;
    }
    case nlohmann::json::value_t::string:
      dump_string(v.get_ref<const std::string&>(), out);
      return;
    default:  // numbers, booleans, null: the same text as Python's (floats: shortest round trip)
      out += v.dump();
      return;
  }
}

}  // namespace

std::string py_json_dumps(const nlohmann::ordered_json& value, int indent) {
  std::string out;
  dump(value, indent, 0, out);
  return out;
}

}  // namespace kvtier
