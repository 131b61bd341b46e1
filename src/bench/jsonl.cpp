#include "bench/jsonl.h"

#include <fstream>
#include <sstream>

#include "core/status.h"

namespace kvtier::bench {

std::string read_text_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  KVT_CHECK(f.good(), "cannot open '{}' for reading", path);
  std::ostringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

std::vector<JsonlRecord> parse_jsonl(const std::string& text, const std::string& name) {
  std::vector<JsonlRecord> out;
  size_t pos = 0;
  int64_t line_no = 0;
  while (pos < text.size()) {
    size_t end = text.find('\n', pos);
    if (end == std::string::npos) end = text.size();
    std::string_view line(text.data() + pos, end - pos);
    ++line_no;
    pos = end + 1;
    if (line.find_first_not_of(" \t\r") == std::string_view::npos) continue;
    json obj;
    try {
      obj = json::parse(line);
    } catch (const json::parse_error& e) {
      fail("{}:{}: not valid JSON ({})", name, line_no, e.what());
    }
    KVT_CHECK(obj.is_object(), "{}:{}: expected a JSON object, got {}", name, line_no, obj.type_name());
    out.push_back({line_no, std::move(obj)});
  }
  return out;
}

std::vector<JsonlRecord> read_jsonl(const std::string& path) { return parse_jsonl(read_text_file(path), path); }

std::string get_string_field(const json& obj, const char* field, const std::string& where) {
  auto it = obj.find(field);
  KVT_CHECK(it != obj.end(), "{}: missing field '{}'", where, field);
  KVT_CHECK(it->is_string(), "{}: field '{}' must be a string, got {}", where, field, it->type_name());
  return it->get<std::string>();
}

std::string dump_line(const json& obj) {
  return obj.dump(-1, ' ', false, json::error_handler_t::replace);
}

}  // namespace kvtier::bench
