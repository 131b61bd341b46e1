// check_json_schema: the supported subset of JSON Schema (json_schema.h).
#include <algorithm>
#include <set>

#include "grammar/constraint.h"
#include "grammar/json_schema.h"

namespace kvtier {
namespace {

using json = nlohmann::json;

// Keywords that never change which values are valid.
const std::set<std::string, std::less<>> k_annotations = {
    "title", "description", "default", "examples", "deprecated", "readOnly", "writeOnly", "$comment",
    "$schema", "$id", "contentMediaType", "contentEncoding", "discriminator", "format"};

// Keywords that do change the language, by the type they apply to.
const std::set<std::string, std::less<>> k_object_keys = {"properties", "required", "additionalProperties"};
const std::set<std::string, std::less<>> k_array_keys = {"items", "prefixItems", "minItems", "maxItems",
                                                         "uniqueItems"};
const std::set<std::string, std::less<>> k_string_keys = {"minLength", "maxLength"};
const std::set<std::string, std::less<>> k_number_keys = {"minimum", "maximum", "exclusiveMinimum",
                                                          "exclusiveMaximum"};
const std::set<std::string, std::less<>> k_types = {"object", "array", "string", "number",
                                                    "integer", "boolean", "null"};

// Known keywords that the engine refuses, with a hint.
const char* refusal_hint(std::string_view key) {
  if (key == "not" || key == "if" || key == "then" || key == "else") return "conditional schemas are not supported";
  if (key == "multipleOf") return "multipleOf is not supported";
  if (key == "pattern")
    return "the grammar engine (xgrammar 0.2.8) repeats regular expressions over UTF-8 bytes, not characters, "
           "so a pattern could let invalid strings through; use enum, or minLength/maxLength";
  if (key == "nullable") return "use \"type\": [..., \"null\"] instead of the OpenAPI keyword";
  if (key == "patternProperties" || key == "propertyNames" || key == "minProperties" || key == "maxProperties" ||
      key == "dependentRequired" || key == "dependentSchemas" || key == "dependencies" ||
      key == "unevaluatedProperties")
    return "only properties, required and additionalProperties constrain objects";
  if (key == "contains" || key == "minContains" || key == "maxContains" || key == "additionalItems" ||
      key == "unevaluatedItems")
    return "only items, prefixItems, minItems and maxItems constrain arrays";
  if (key == "$dynamicRef" || key == "$recursiveRef" || key == "$anchor" || key == "$dynamicAnchor")
    return "only $ref to a JSON pointer in the document (\"#\", \"#/$defs/...\") is supported";
  return "it is not a keyword of the supported subset";
}

class Checker {
 public:
  Checker(const json& root, std::string where) : root_(root), where_(std::move(where)) {}

  void check(const json& s, const std::string& path, int depth) {
    if (depth > k_max_depth) error(path, "schema nested deeper than {} levels", k_max_depth);
    if (s.is_boolean()) {
      if (!s.get<bool>()) error(path, "the schema false accepts no value");
      return;
    }
    if (!s.is_object()) error(path, "a schema must be an object or a boolean, got {}", type_name(s));

    for (const auto& [key, value] : s.items()) {
      if (k_annotations.count(key)) {
        if (key == "format" && !value.is_string()) error(path + "." + key, "expected a string");
        continue;
      }
      if (key == "$defs" || key == "definitions") {
        if (!value.is_object()) error(path + "." + key, "expected an object of schemas");
        for (const auto& [name, sub] : value.items()) check(sub, path + "." + key + "." + name, depth + 1);
        continue;
      }
      if (key == "$ref" || key == "type" || key == "enum" || key == "const" || key == "anyOf" || key == "oneOf" ||
          key == "allOf" || k_object_keys.count(key) || k_array_keys.count(key) || k_string_keys.count(key) ||
          k_number_keys.count(key))
        continue;
      error(path, "keyword '{}' is not supported: {}", key, refusal_hint(key));
    }

    // The combinators and $ref stand alone: the grammar engine would ignore
    // keywords beside them, so a sibling that narrows the language is refused.
    int n_kinds = 0;
    for (const char* k : {"$ref", "enum", "const", "anyOf", "oneOf", "allOf"}) n_kinds += s.contains(k) ? 1 : 0;
    if (n_kinds > 1 && !(n_kinds == 2 && s.contains("enum") && s.contains("const")))
      error(path, "combine $ref, enum, const, anyOf, oneOf and allOf through anyOf/allOf, not side by side");
    if (n_kinds == 1) {
      for (const auto& [key, value] : s.items()) {
        const bool sibling_ok = k_annotations.count(key) || key == "$defs" || key == "definitions" ||
                                key == "$ref" || key == "enum" || key == "const" || key == "anyOf" ||
                                key == "oneOf" || key == "allOf" ||
                                (key == "type" && (s.contains("enum") || s.contains("const")));
        if (!sibling_ok)
          error(path, "keyword '{}' beside {} is not supported: move it into the alternatives", key,
                s.contains("$ref") ? "$ref" : s.contains("anyOf") ? "anyOf" : s.contains("oneOf") ? "oneOf"
                                            : s.contains("allOf") ? "allOf" : "enum/const");
      }
    }

    if (s.contains("$ref")) check_ref(s, path);
    std::set<std::string> types;
    if (s.contains("type")) types = check_type(s.at("type"), path + ".type");
    if (s.contains("enum")) check_enum(s, types, path);
    if (s.contains("const")) check_values({s.at("const")}, types, path + ".const");
    for (const char* k : {"anyOf", "oneOf", "allOf"}) {
      if (!s.contains(k)) continue;
      const json& list = s.at(k);
      const std::string p = path + "." + k;
      if (!list.is_array() || list.empty()) error(p, "expected a non-empty array of schemas");
      if (std::string_view(k) == "allOf" && list.size() != 1)
        error(p, "allOf with {} schemas is not supported (only one)", list.size());
      for (size_t i = 0; i < list.size(); ++i) check(list[i], fmt::format("{}[{}]", p, i), depth + 1);
    }

    // Type-specific keywords need a type: without one the grammar engine
    // would generate any value and ignore them.
    for (const auto& [key, value] : s.items()) {
      const bool specific =
          k_object_keys.count(key) || k_array_keys.count(key) || k_string_keys.count(key) || k_number_keys.count(key);
      if (specific && types.empty()) error(path, "keyword '{}' needs a \"type\" beside it", key);
    }
    check_object(s, path, depth);
    check_array(s, path, depth);
    check_string(s, path);
    check_number(s, path);
  }

 private:
  static constexpr int k_max_depth = 64;

  template <class... Args>
  [[noreturn]] void error(const std::string& path, fmt::format_string<Args...> f, Args&&... args) const {
    throw GrammarError(fmt::format("{}{}: {}", where_, path, fmt::format(f, std::forward<Args>(args)...)));
  }

  static std::string type_name(const json& v) { return v.type_name(); }

  void check_ref(const json& s, const std::string& path) {
    const json& ref = s.at("$ref");
    if (!ref.is_string()) error(path + ".$ref", "expected a string");
    // Follow a chain of $refs: one that never reaches a real schema is a cycle.
    const json* node = &s;
    for (int hop = 0; node->is_object() && node->contains("$ref"); ++hop) {
      const json& r = node->at("$ref");
      if (!r.is_string()) error(path + ".$ref", "expected a string");
      const std::string target = r.get<std::string>();
      node = resolve_json_ref(root_, target);
      if (!node)
        error(path + ".$ref", "'{}' does not name a schema in this document (expected \"#\", \"#/$defs/NAME\" "
              "or another JSON pointer starting with \"#/\")", target);
      if (hop > 64) error(path + ".$ref", "'{}' is a cycle of $refs", ref.get<std::string>());
    }
  }

  std::set<std::string> check_type(const json& t, const std::string& path) {
    std::set<std::string> types;
    auto add = [&](const json& v) {
      if (!v.is_string() || !k_types.count(v.get<std::string>()))
        error(path, "expected one of object, array, string, number, integer, boolean, null, got {}", v.dump());
      if (!types.insert(v.get<std::string>()).second) error(path, "type {} listed twice", v.dump());
    };
    if (t.is_array()) {
      if (t.empty()) error(path, "expected a non-empty list of types");
      for (const json& v : t) add(v);
    } else {
      add(t);
    }
    return types;
  }

  void check_enum(const json& s, const std::set<std::string>& types, const std::string& path) {
    const json& e = s.at("enum");
    if (!e.is_array() || e.empty()) error(path + ".enum", "expected a non-empty array of values");
    check_values(std::vector<json>(e.begin(), e.end()), types, path + ".enum");
    if (s.contains("const") && std::find(e.begin(), e.end(), s.at("const")) == e.end())
      error(path, "const is not one of the enum values");
  }

  // enum/const values beside a "type" must have that type (the grammar
  // engine emits the values and ignores the type).
  void check_values(const std::vector<json>& values, const std::set<std::string>& types, const std::string& path) {
    if (types.empty()) return;
    const json type_only = {{"type", std::vector<std::string>(types.begin(), types.end())}};
    for (const json& v : values) {
      if (!validate_json(type_only, v).empty())
        error(path, "value {} does not have the schema's type", v.dump());
    }
  }

  void check_object(const json& s, const std::string& path, int depth) {
    if (s.contains("properties")) {
      const json& props = s.at("properties");
      if (!props.is_object()) error(path + ".properties", "expected an object of schemas");
      for (const auto& [name, sub] : props.items()) check(sub, path + ".properties." + name, depth + 1);
    }
    if (s.contains("required")) {
      const json& req = s.at("required");
      if (!req.is_array()) error(path + ".required", "expected an array of property names");
      std::set<std::string> seen;
      for (const json& name : req) {
        if (!name.is_string()) error(path + ".required", "expected property names, got {}", name.dump());
        if (!seen.insert(name.get<std::string>()).second)
          error(path + ".required", "'{}' listed twice", name.get<std::string>());
        if (!s.contains("properties") || !s.at("properties").contains(name.get<std::string>()))
          error(path + ".required", "'{}' is required but not described in properties", name.get<std::string>());
      }
    }
    if (s.contains("additionalProperties")) {
      const json& ap = s.at("additionalProperties");
      if (!ap.is_boolean()) check(ap, path + ".additionalProperties", depth + 1);
    }
  }

  int64_t count(const json& s, const char* key, const std::string& path) {
    const json& v = s.at(key);
    if (!v.is_number_integer() || v.get<int64_t>() < 0 || v.get<int64_t>() > (int64_t(1) << 31))
      error(path + "." + key, "expected an integer in [0, 2^31], got {}", v.dump());
    return v.get<int64_t>();
  }

  void check_array(const json& s, const std::string& path, int depth) {
    if (s.contains("items")) {
      const json& items = s.at("items");
      if (items.is_array()) error(path + ".items", "items as a list (draft 4 tuples) is not supported: use prefixItems");
      if (!items.is_boolean()) check(items, path + ".items", depth + 1);
    }
    if (s.contains("prefixItems")) {
      const json& pre = s.at("prefixItems");
      if (!pre.is_array()) error(path + ".prefixItems", "expected an array of schemas");
      for (size_t i = 0; i < pre.size(); ++i) check(pre[i], fmt::format("{}.prefixItems[{}]", path, i), depth + 1);
    }
    int64_t lo = 0, hi = -1;
    if (s.contains("minItems")) lo = count(s, "minItems", path);
    if (s.contains("maxItems")) hi = count(s, "maxItems", path);
    if (hi >= 0 && lo > hi) error(path, "minItems {} is above maxItems {}", lo, hi);
    if (s.contains("uniqueItems")) {
      const json& u = s.at("uniqueItems");
      if (!u.is_boolean()) error(path + ".uniqueItems", "expected a boolean");
      if (u.get<bool>()) error(path + ".uniqueItems", "uniqueItems: true is not supported");
    }
  }

  void check_string(const json& s, const std::string& path) {
    int64_t lo = 0, hi = -1;
    if (s.contains("minLength")) lo = count(s, "minLength", path);
    if (s.contains("maxLength")) hi = count(s, "maxLength", path);
    if (hi >= 0 && lo > hi) error(path, "minLength {} is above maxLength {}", lo, hi);
    // minLength is generated as a pattern of printable ASCII (xgrammar_vocab.cpp),
    // which a format or a list of types would defeat.
    if ((s.contains("minLength") || s.contains("maxLength")) && s.contains("format"))
      error(path, "format together with minLength/maxLength is not supported");
    if (lo > 0 && s.contains("type") && s.at("type").is_array() && s.at("type").size() > 1)
      error(path, "minLength with a list of types is not supported: use anyOf with a string schema");
  }

  void check_number(const json& s, const std::string& path) {
    for (const char* k : {"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"}) {
      if (s.contains(k) && !s.at(k).is_number())
        error(path + "." + k, "expected a number, got {}", s.at(k).dump());
    }
  }

  const json& root_;
  std::string where_;
};

}  // namespace

const nlohmann::json* resolve_json_ref(const nlohmann::json& root, const std::string& ref) {
  if (ref == "#") return &root;
  if (ref.size() < 2 || ref[0] != '#' || ref[1] != '/') return nullptr;
  try {
    const json::json_pointer ptr(ref.substr(1));
    if (!root.contains(ptr)) return nullptr;
    return &root.at(ptr);
  } catch (const json::exception&) {
    return nullptr;
  }
}

void check_json_schema(const nlohmann::json& schema, std::string_view where) {
  Checker(schema, std::string(where)).check(schema, "", 0);
}

}  // namespace kvtier
