// validate_json: the reference semantics of the supported JSON Schema subset
// (JSON Schema 2020-12, validation vocabulary; json_schema.h). Written for
// clarity, not speed: tests validate generated values with it.
#include <cmath>

#include "grammar/json_schema.h"
#include "core/status.h"

namespace kvtier {
namespace {

using json = nlohmann::json;

size_t utf8_length(const std::string& s) {
  size_t n = 0;
  for (unsigned char c : s) n += (c & 0xC0) != 0x80;
  return n;
}

bool has_type(const json& v, const std::string& type) {
  if (type == "object") return v.is_object();
  if (type == "array") return v.is_array();
  if (type == "string") return v.is_string();
  if (type == "boolean") return v.is_boolean();
  if (type == "null") return v.is_null();
  if (type == "number") return v.is_number();
  if (type == "integer") {  // 1.0 is an integer (JSON Schema draft 6 and later)
    return v.is_number_integer() || (v.is_number_float() && std::isfinite(v.get<double>()) &&
                                     v.get<double>() == std::floor(v.get<double>()));
  }
  return false;
}

class Validator {
 public:
  explicit Validator(const json& root) : root_(root) {}

  // "" when valid.
  std::string valid(const json& s, const json& v, const std::string& at, int depth) {
    if (depth > 256) return at + ": schema recursion deeper than 256 levels";
    if (s.is_boolean()) return s.get<bool>() ? "" : at + ": the schema false accepts nothing";
    if (s.contains("$ref")) {
      const json* target = resolve_json_ref(root_, s.at("$ref").get<std::string>());
      if (!target) return at + ": unresolved $ref";
      if (std::string e = valid(*target, v, at, depth + 1); !e.empty()) return e;
    }
    if (s.contains("type")) {
      const json& t = s.at("type");
      bool ok = false;
      if (t.is_array()) {
        for (const json& one : t) ok = ok || has_type(v, one.get<std::string>());
      } else {
        ok = has_type(v, t.get<std::string>());
      }
      if (!ok) return fmt::format("{}: expected type {}, got {}", at, t.dump(), v.dump());
    }
    if (s.contains("const") && s.at("const") != v)
      return fmt::format("{}: expected {}, got {}", at, s.at("const").dump(), v.dump());
    if (s.contains("enum")) {
      const json& e = s.at("enum");
      if (std::find(e.begin(), e.end(), v) == e.end())
        return fmt::format("{}: {} is not one of {}", at, v.dump(), e.dump());
    }
    if (s.contains("anyOf")) {
      bool any = false;
      for (const json& alt : s.at("anyOf")) any = any || valid(alt, v, at, depth + 1).empty();
      if (!any) return at + ": matches none of anyOf";
    }
    if (s.contains("oneOf")) {
      int n = 0;
      for (const json& alt : s.at("oneOf")) n += valid(alt, v, at, depth + 1).empty() ? 1 : 0;
      if (n != 1) return fmt::format("{}: matches {} of oneOf's schemas, not exactly one", at, n);
    }
    if (s.contains("allOf")) {
      for (const json& all : s.at("allOf"))
        if (std::string e = valid(all, v, at, depth + 1); !e.empty()) return e;
    }
    if (v.is_object()) return valid_object(s, v, at, depth);
    if (v.is_array()) return valid_array(s, v, at, depth);
    if (v.is_string()) return valid_string(s, v, at);
    if (v.is_number()) return valid_number(s, v, at);
    return "";
  }

 private:
  std::string valid_object(const json& s, const json& v, const std::string& at, int depth) {
    if (s.contains("required")) {
      for (const json& name : s.at("required"))
        if (!v.contains(name.get<std::string>()))
          return fmt::format("{}: missing required property '{}'", at, name.get<std::string>());
    }
    const json* props = s.contains("properties") ? &s.at("properties") : nullptr;
    for (const auto& [key, value] : v.items()) {
      const std::string where = at + "." + key;
      if (props && props->contains(key)) {
        if (std::string e = valid(props->at(key), value, where, depth + 1); !e.empty()) return e;
      } else if (s.contains("additionalProperties")) {
        if (std::string e = valid(s.at("additionalProperties"), value, where, depth + 1); !e.empty())
          return s.at("additionalProperties") == false ? fmt::format("{}: property not allowed", where) : e;
      }
    }
    return "";
  }

  std::string valid_array(const json& s, const json& v, const std::string& at, int depth) {
    const size_t n = v.size();
    if (s.contains("minItems") && n < s.at("minItems").get<size_t>())
      return fmt::format("{}: {} items, fewer than minItems {}", at, n, s.at("minItems").get<size_t>());
    if (s.contains("maxItems") && n > s.at("maxItems").get<size_t>())
      return fmt::format("{}: {} items, more than maxItems {}", at, n, s.at("maxItems").get<size_t>());
    size_t n_prefix = 0;
    if (s.contains("prefixItems")) {
      const json& pre = s.at("prefixItems");
      n_prefix = pre.size();
      for (size_t i = 0; i < std::min(n, n_prefix); ++i)
        if (std::string e = valid(pre[i], v[i], fmt::format("{}[{}]", at, i), depth + 1); !e.empty()) return e;
    }
    if (s.contains("items")) {
      for (size_t i = n_prefix; i < n; ++i)
        if (std::string e = valid(s.at("items"), v[i], fmt::format("{}[{}]", at, i), depth + 1); !e.empty())
          return e;
    }
    return "";
  }

  std::string valid_string(const json& s, const json& v, const std::string& at) {
    const std::string& str = v.get_ref<const std::string&>();
    const size_t n = utf8_length(str);
    if (s.contains("minLength") && n < s.at("minLength").get<size_t>())
      return fmt::format("{}: {} characters, fewer than minLength {}", at, n, s.at("minLength").get<size_t>());
    if (s.contains("maxLength") && n > s.at("maxLength").get<size_t>())
      return fmt::format("{}: {} characters, more than maxLength {}", at, n, s.at("maxLength").get<size_t>());
    return "";
  }

  std::string valid_number(const json& s, const json& v, const std::string& at) {
    const double x = v.get<double>();
    auto bound = [&](const char* k) { return s.at(k).get<double>(); };
    if (s.contains("minimum") && x < bound("minimum")) return fmt::format("{}: {} < minimum", at, v.dump());
    if (s.contains("maximum") && x > bound("maximum")) return fmt::format("{}: {} > maximum", at, v.dump());
    if (s.contains("exclusiveMinimum") && x <= bound("exclusiveMinimum"))
      return fmt::format("{}: {} <= exclusiveMinimum", at, v.dump());
    if (s.contains("exclusiveMaximum") && x >= bound("exclusiveMaximum"))
      return fmt::format("{}: {} >= exclusiveMaximum", at, v.dump());
    return "";
  }

  const json& root_;
};

}  // namespace

std::string validate_json(const nlohmann::json& schema, const nlohmann::json& value) {
  return Validator(schema).valid(schema, value, "$", 0);
}

}  // namespace kvtier
