#include "bench/jsonl.h"

#include <lzma.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "core/status.h"

namespace kvtier::bench {

namespace {

std::string read_raw(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  KVT_CHECK(f.good(), "cannot open '{}' for reading", path);
  std::ostringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

// The whole .xz stream `in`, decompressed (liblzma), with a memory limit far
// above what the repository's data needs.
std::string xz_decompress(const std::string& in, const std::string& path) {
  lzma_stream z = LZMA_STREAM_INIT;
  KVT_CHECK(lzma_stream_decoder(&z, uint64_t(1) << 30, LZMA_CONCATENATED) == LZMA_OK,
            "{}: cannot start the xz decoder", path);
  std::string out;
  char buf[1 << 16];
  z.next_in = reinterpret_cast<const uint8_t*>(in.data());
  z.avail_in = in.size();
  lzma_ret rc = LZMA_OK;
  while (rc == LZMA_OK) {
    z.next_out = reinterpret_cast<uint8_t*>(buf);
    z.avail_out = sizeof(buf);
    rc = lzma_code(&z, LZMA_FINISH);
    out.append(buf, sizeof(buf) - z.avail_out);
  }
  lzma_end(&z);
  KVT_CHECK(rc == LZMA_STREAM_END, "{}: not a valid .xz file (liblzma error {})", path, int(rc));
  return out;
}

}  // namespace

std::string read_text_file(const std::string& path) {
  // The repository's data files are stored xz-compressed (data/README.md):
  // X is read from X.xz when only that exists.
  if (!std::filesystem::exists(path) && std::filesystem::exists(path + ".xz"))
    return xz_decompress(read_raw(path + ".xz"), path + ".xz");
  if (path.size() > 3 && path.compare(path.size() - 3, 3, ".xz") == 0) return xz_decompress(read_raw(path), path);
  return read_raw(path);
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
