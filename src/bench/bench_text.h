// Small text helpers shared by the scorers and generators. Several published
// metrics were written in Python; these reproduce the Python string semantics
// they depend on (str.strip / str.split whitespace, str.lower) on UTF-8 bytes.
#pragma once
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace kvtier::bench {

// Decodes one UTF-8 code point at s[i], advancing i; malformed bytes come back
// as themselves (0x80..0xFF) so that nothing is lost.
char32_t next_code_point(std::string_view s, size_t& i);
void append_utf8(std::string& out, char32_t cp);

// Python's str.isspace() set (ASCII whitespace, \x1c-\x1f, U+0085, U+00A0,
// U+1680, U+2000-U+200A, U+2028, U+2029, U+202F, U+205F, U+3000).
bool is_py_space(char32_t cp);

// Python's str.strip() with no argument.
std::string py_strip(std::string_view s);
// Python's str.split() with no argument.
std::vector<std::string> py_split_ws(std::string_view s);
// Python's str.lower() for ASCII, Latin-1, Latin Extended-A, Greek and Cyrillic;
// other scripts are left as they are.
std::string py_lower(std::string_view s);

std::string replace_all(std::string_view s, std::string_view from, std::string_view to);
size_t count_substr(std::string_view s, std::string_view needle);
std::vector<std::string> split_on(std::string_view s, std::string_view sep);
std::string join(const std::vector<std::string>& parts, std::string_view sep);
bool contains(std::string_view s, std::string_view needle);

// Replaces invalid UTF-8 sequences by U+FFFD (model output may end mid-character).
std::string sanitize_utf8(std::string_view s);

}  // namespace kvtier::bench
