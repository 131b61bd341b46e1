// The supported JSON Schema subset: what check_json_schema refuses (with the
// path of the fault) and what validate_json, the reference semantics, says.
#include <gtest/gtest.h>

#include "grammar/constraint.h"
#include "grammar/json_schema.h"

namespace kvtier {
namespace {

using json = nlohmann::json;

// The message check_json_schema throws, or "" when it accepts.
std::string refusal(const std::string& schema) {
  try {
    check_json_schema(json::parse(schema));
  } catch (const GrammarError& e) {
    return e.what();
  }
  return "";
}

TEST(JsonSchemaCheck, AcceptsWhatClientsSend) {
  for (const char* s : {
           R"({"type": "object"})",
           R"(true)",
           R"({})",
           R"({"type": "object", "title": "Person", "description": "d", "properties": {"name": {"type": "string",
               "minLength": 1, "maxLength": 40}, "age": {"type": "integer", "minimum": 0, "maximum": 150}},
               "required": ["name"], "additionalProperties": false})",
           R"({"type": ["string", "null"]})",
           R"({"enum": ["red", "green", 3, null]})",
           R"({"type": "string", "enum": ["a", "b"]})",
           R"({"const": {"a": [1, 2]}})",
           R"({"anyOf": [{"type": "integer"}, {"type": "null"}], "default": null, "title": "X"})",
           R"({"oneOf": [{"type": "string"}, {"type": "integer"}]})",
           R"({"allOf": [{"$ref": "#/$defs/Color"}], "$defs": {"Color": {"enum": ["r", "g"]}}})",
           R"({"$defs": {"Node": {"type": "object", "properties": {"kids": {"type": "array", "items":
               {"$ref": "#/$defs/Node"}}}}}, "$ref": "#/$defs/Node"})",
           R"({"definitions": {"A": {"type": "boolean"}}, "type": "array", "items": {"$ref": "#/definitions/A"},
               "minItems": 1, "maxItems": 3})",
           R"({"type": "array", "prefixItems": [{"type": "string"}, {"type": "number"}], "items": false})",
           R"({"type": "string", "format": "email"})",
           R"({"type": "number", "exclusiveMinimum": 0, "exclusiveMaximum": 1.5})",
           R"({"type": "array", "uniqueItems": false})",
       }) {
    EXPECT_EQ(refusal(s), "") << s;
  }
}

TEST(JsonSchemaCheck, RefusesWithThePathAndAReason) {
  const std::pair<const char*, const char*> cases[] = {
      {R"({"type": "object", "properties": {"n": {"type": "number", "multipleOf": 2}}})",
       "schema.properties.n: keyword 'multipleOf' is not supported"},
      {R"({"not": {"type": "string"}})", "schema: keyword 'not' is not supported: conditional"},
      {R"({"if": {}, "then": {}})", "keyword 'if' is not supported"},
      {R"({"type": "array", "uniqueItems": true})", "schema.uniqueItems: uniqueItems: true is not supported"},
      {R"({"type": "array", "contains": {"type": "string"}})", "keyword 'contains' is not supported"},
      {R"({"type": "object", "patternProperties": {"^a": {}}})", "keyword 'patternProperties' is not supported"},
      {R"({"type": "string", "nullable": true})", "use \"type\": [..., \"null\"]"},
      {R"({"typo": 1})", "keyword 'typo' is not supported"},
      {R"({"type": "strnig"})", "schema.type: expected one of object, array"},
      {R"({"type": []})", "schema.type: expected a non-empty list"},
      {R"(false)", "the schema false accepts no value"},
      {R"(3)", "a schema must be an object or a boolean"},
      {R"({"$ref": "#/$defs/Missing"})", "schema.$ref: '#/$defs/Missing' does not name a schema"},
      {R"({"$ref": "http://example.com/s.json"})", "does not name a schema in this document"},
      {R"({"$defs": {"A": {"$ref": "#/$defs/B"}, "B": {"$ref": "#/$defs/A"}}, "$ref": "#/$defs/A"})",
       "is a cycle of $refs"},
      {R"({"minLength": 3})", "schema: keyword 'minLength' needs a \"type\""},
      {R"({"anyOf": [{"type": "string"}], "minLength": 2})", "keyword 'minLength' beside anyOf"},
      {R"({"$ref": "#", "type": "object"})", "keyword 'type' beside $ref"},
      {R"({"anyOf": []})", "schema.anyOf: expected a non-empty array"},
      {R"({"allOf": [{"type": "string"}, {"minLength": 1}]})", "allOf with 2 schemas is not supported"},
      {R"({"type": "string", "enum": ["a", 1]})", "schema.enum: value 1 does not have the schema's type"},
      {R"({"type": "object", "properties": {"a": {}}, "required": ["b"]})",
       "schema.required: 'b' is required but not described in properties"},
      {R"({"type": "array", "minItems": 3, "maxItems": 2})", "minItems 3 is above maxItems 2"},
      {R"({"type": "array", "minItems": -1})", "schema.minItems: expected an integer"},
      {R"({"type": "string", "pattern": "^[a-z]+$"})", "keyword 'pattern' is not supported"},
      {R"({"type": "string", "format": "date", "maxLength": 3})", "format together with minLength/maxLength"},
      {R"({"type": ["string", "null"], "minLength": 1})", "minLength with a list of types"},
      {R"({"type": "array", "items": [{"type": "string"}]})", "use prefixItems"},
      {R"({"type": "integer", "minimum": "0"})", "schema.minimum: expected a number"},
      {R"({"type": "object", "properties": {"a": {"type": "object", "properties": {"b": {"type": "bogus"}}}}})",
       "schema.properties.a.properties.b.type"},
  };
  for (const auto& [schema, expected] : cases) {
    const std::string msg = refusal(schema);
    EXPECT_NE(msg.find(expected), std::string::npos) << schema << "\n  gave: " << msg;
  }
}

TEST(JsonSchemaCheck, DeepNestingIsRefusedNotAStackOverflow) {
  std::string s;
  for (int i = 0; i < 200; ++i) s += R"({"type": "array", "items": )";
  s += "{}";
  for (int i = 0; i < 200; ++i) s += "}";
  EXPECT_NE(refusal(s).find("nested deeper than"), std::string::npos);
}

// validate_json on a schema with every supported keyword.
const char* const k_person = R"({
  "type": "object",
  "properties": {
    "name": {"type": "string", "minLength": 2, "maxLength": 5},
    "age": {"type": "integer", "minimum": 0, "exclusiveMaximum": 150},
    "tags": {"type": "array", "items": {"enum": ["a", "b"]}, "minItems": 1, "maxItems": 2},
    "pet": {"anyOf": [{"$ref": "#/$defs/Pet"}, {"type": "null"}]},
    "kind": {"oneOf": [{"type": "integer"}, {"type": "number", "minimum": 10}]},
    "pair": {"type": "array", "prefixItems": [{"type": "string"}, {"type": "boolean"}], "items": false}
  },
  "required": ["name", "age"],
  "additionalProperties": false,
  "$defs": {"Pet": {"type": "object", "properties": {"legs": {"const": 4}}, "required": ["legs"]}}
})";

TEST(JsonSchemaValidate, AcceptsValidValues) {
  const json schema = json::parse(k_person);
  ASSERT_EQ(refusal(k_person), "");
  for (const char* v : {
           R"({"name": "Al", "age": 0})",
           R"({"name": "ééééé", "age": 0})",  // 5 characters (10 bytes)
           R"({"name": "Alice", "age": 149.0, "tags": ["a"], "pet": null})",
           R"({"name": "éèêëà", "age": 3, "pet": {"legs": 4}, "kind": 1.25e1})",
           R"({"name": "Bo", "age": 1, "kind": 3, "pair": ["x", true]})",
           R"({"name": "Bo", "age": 1, "pair": ["x"]})",
       }) {
    EXPECT_EQ(validate_json(schema, json::parse(v)), "") << v;
  }
}

TEST(JsonSchemaValidate, RejectsInvalidValuesWithTheReason) {
  const json schema = json::parse(k_person);
  const std::pair<const char*, const char*> cases[] = {
      {R"({"age": 3})", "$: missing required property 'name'"},
      {R"({"name": "A", "age": 3})", "$.name: 1 characters, fewer than minLength 2"},
      {R"({"name": "Alexandra", "age": 3})", "more than maxLength 5"},
      {R"({"name": "Al", "age": 3.5})", "$.age: expected type \"integer\""},
      {R"({"name": "Al", "age": -1})", "$.age: -1 < minimum"},
      {R"({"name": "Al", "age": 150})", "$.age: 150 >= exclusiveMaximum"},
      {R"({"name": "Al", "age": 3, "x": 1})", "$.x: property not allowed"},
      {R"({"name": "Al", "age": 3, "tags": []})", "fewer than minItems 1"},
      {R"({"name": "Al", "age": 3, "tags": ["a", "b", "a"]})", "more than maxItems 2"},
      {R"({"name": "Al", "age": 3, "tags": ["c"]})", "$.tags[0]: \"c\" is not one of"},
      {R"({"name": "Al", "age": 3, "pet": {"legs": 3}})", "$.pet: matches none of anyOf"},
      {R"({"name": "éééééé", "age": 3})", "$.name: 6 characters, more than maxLength 5"},
      {R"({"name": "Al", "age": 3, "kind": 12})", "matches 2 of oneOf's schemas"},
      {R"({"name": "Al", "age": 3, "kind": "s"})", "matches 0 of oneOf's schemas"},
      {R"({"name": "Al", "age": 3, "pair": ["x", true, 1]})", "$.pair[2]: the schema false accepts nothing"},
      {R"({"name": "Al", "age": 3, "pair": [1]})", "$.pair[0]: expected type \"string\""},
      {R"([1])", "$: expected type \"object\""},
  };
  for (const auto& [value, expected] : cases) {
    const std::string why = validate_json(schema, json::parse(value));
    EXPECT_NE(why.find(expected), std::string::npos) << value << "\n  gave: " << why;
  }
}

TEST(JsonSchemaValidate, RecursiveRefs) {
  const json schema = json::parse(R"({"type": "object", "properties": {"v": {"type": "integer"},
      "next": {"anyOf": [{"$ref": "#"}, {"type": "null"}]}}, "required": ["v", "next"]})");
  EXPECT_EQ(validate_json(schema, json::parse(R"({"v": 1, "next": {"v": 2, "next": null}})")), "");
  EXPECT_NE(validate_json(schema, json::parse(R"({"v": 1, "next": {"v": "2", "next": null}})")), "");
}

}  // namespace
}  // namespace kvtier
