// JSONL reading and writing with errors that name the file and line.
#pragma once
#include <nlohmann/json.hpp>

#include <string>
#include <vector>

namespace kvtier::bench {

using nlohmann::json;

struct JsonlRecord {
  int64_t line = 0;  // 1-based line number in the file
  json value;        // an object
};

// One object per non-blank line. Throws kvtier::Error "<path>:<line>: ..." for
// a line that is not JSON or not an object.
// Same, from text already in memory; `name` is used in messages.
std::vector<JsonlRecord> parse_jsonl(const std::string& text, const std::string& name);
std::vector<JsonlRecord> read_jsonl(const std::string& path);

// Reads a whole file; throws kvtier::Error naming the path when it cannot.
// A path ending in .xz, or a path X that is absent while X.xz exists, is
// decompressed (the repository's data/ is stored that way).
std::string read_text_file(const std::string& path);

// Field access with errors naming the source, line and field.
std::string get_string_field(const json& obj, const char* field, const std::string& where);

// Serializes one line; invalid UTF-8 (a model output cut mid-character) is
// replaced rather than thrown on.
std::string dump_line(const json& obj);

}  // namespace kvtier::bench
