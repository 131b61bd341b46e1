// The JSON Schema subset that structured generation supports, in two parts:
//
// check_json_schema: refuses a schema the engine cannot honour exactly, with
// the JSON path of the fault. Supported (what OpenAI, Pydantic and
// function-calling clients send): type (one or a list) object / array /
// string / number / integer / boolean / null; properties, required,
// additionalProperties; items, prefixItems, minItems, maxItems; enum, const;
// anyOf, oneOf, allOf of one schema; $ref to "#", $defs, definitions or any
// JSON pointer in the document; minLength, maxLength; minimum, maximum,
// exclusiveMinimum, exclusiveMaximum. Annotations (title, description,
// default, examples, format, ...) are ignored. Everything else that changes
// which values are valid (not, if/then/else, uniqueItems: true, multipleOf,
// pattern, patternProperties, ...) is refused rather than silently ignored,
// since an ignored keyword would let the model emit invalid values.
//
// validate_json: the reference semantics of that subset (JSON Schema 2020-12
// validation: additional properties allowed unless additionalProperties says
// otherwise, lengths in characters, format an annotation). Tests
// check the grammar engine's output against it.
#pragma once
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

namespace kvtier {

// Throws GrammarError naming `where` + the path, e.g.
// "schema.properties.age: keyword 'multipleOf' is not supported".
void check_json_schema(const nlohmann::json& schema, std::string_view where = "schema");

// "" when `value` is valid under `schema` (already checked), else the first
// reason it is not, with the path into the value ("$.items[2]: expected an integer").
std::string validate_json(const nlohmann::json& schema, const nlohmann::json& value);

// The schema node a "$ref" names inside `root`, or nullptr.
const nlohmann::json* resolve_json_ref(const nlohmann::json& root, const std::string& ref);

}  // namespace kvtier
