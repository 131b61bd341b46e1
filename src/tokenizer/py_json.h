// JSON text exactly as the chat templates' `tojson` filter writes it:
// Python's json.dumps(x, ensure_ascii=False, indent=indent) in Hugging Face
// transformers. Separators ", " and ": " on one line, or "," and ": " with
// newlines and `indent` spaces per level; keys in their given order;
// non-ASCII characters as they are.
#pragma once
#include <nlohmann/json.hpp>
#include <string>

namespace kvtier {

// indent < 0: one line.
std::string py_json_dumps(const nlohmann::ordered_json& value, int indent = -1);

}  // namespace kvtier
