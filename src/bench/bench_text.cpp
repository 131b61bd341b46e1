#include "bench/bench_text.h"

namespace kvtier::bench {

char32_t next_code_point(std::string_view s, size_t& i) {
  const auto b0 = static_cast<unsigned char>(s[i]);
  int n_extra = 0;
  char32_t cp = 0;
  if (b0 < 0x80) {
    ++i;
    return b0;
  } else if ((b0 & 0xE0) == 0xC0) {
    n_extra = 1;
    cp = b0 & 0x1F;
  } else if ((b0 & 0xF0) == 0xE0) {
    n_extra = 2;
    cp = b0 & 0x0F;
  } else if ((b0 & 0xF8) == 0xF0) {
    n_extra = 3;
    cp = b0 & 0x07;
  } else {
    ++i;
    return b0;
  }
  if (i + n_extra >= s.size()) {  // truncated sequence
    ++i;
    return b0;
  }
  for (int k = 1; k <= n_extra; ++k) {
    const auto b = static_cast<unsigned char>(s[i + k]);
    if ((b & 0xC0) != 0x80) {
      ++i;
      return b0;
    }
    cp = (cp << 6) | (b & 0x3F);
  }
  i += n_extra + 1;
  return cp;
}

void append_utf8(std::string& out, char32_t cp) {
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xC0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += static_cast<char>(0xE0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (cp >> 18));
    out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

bool is_py_space(char32_t cp) {
  if (cp == ' ' || (cp >= 0x09 && cp <= 0x0D) || (cp >= 0x1C && cp <= 0x1F)) return true;
  if (cp == 0x85 || cp == 0xA0 || cp == 0x1680) return true;
  if (cp >= 0x2000 && cp <= 0x200A) return true;
  return cp == 0x2028 || cp == 0x2029 || cp == 0x202F || cp == 0x205F || cp == 0x3000;
}

std::string py_strip(std::string_view s) {
  // Find the first and last non-space code points.
  size_t begin = s.size(), end = 0;
  for (size_t i = 0; i < s.size();) {
    const size_t at = i;
    if (!is_py_space(next_code_point(s, i))) {
      if (begin == s.size()) begin = at;
      end = i;
    }
  }
  if (begin == s.size()) return {};
  return std::string(s.substr(begin, end - begin));
}

std::vector<std::string> py_split_ws(std::string_view s) {
  std::vector<std::string> out;
  std::string cur;
  bool in_word = false;
  for (size_t i = 0; i < s.size();) {
    const size_t at = i;
    const char32_t cp = next_code_point(s, i);
    if (is_py_space(cp)) {
      if (in_word) out.push_back(std::move(cur));
      cur.clear();
      in_word = false;
    } else {
      cur.append(s.substr(at, i - at));
      in_word = true;
    }
  }
  if (in_word) out.push_back(std::move(cur));
  return out;
}

static char32_t lower_cp(char32_t c) {
  if (c >= 'A' && c <= 'Z') return c + 32;
  if (c < 0x80) return c;
  if ((c >= 0xC0 && c <= 0xDE && c != 0xD7)) return c + 32;  // Latin-1
  if (c == 0x130) return 'i';  // special-cased by py_lower (two code points)
  if (c >= 0x100 && c <= 0x137 && c % 2 == 0) return c + 1;   // Latin Extended-A pairs
  if (c >= 0x139 && c <= 0x148 && c % 2 == 1) return c + 1;
  if (c >= 0x14A && c <= 0x177 && c % 2 == 0) return c + 1;
  if (c == 0x178) return 0xFF;
  if ((c == 0x179 || c == 0x17B || c == 0x17D)) return c + 1;
  if (c >= 0x391 && c <= 0x3AB && c != 0x3A2) return c + 32;  // Greek
  if (c >= 0x410 && c <= 0x42F) return c + 32;                // Cyrillic
  if (c >= 0x400 && c <= 0x40F) return c + 80;
  return c;
}

std::string py_lower(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size();) {
    const size_t at = i;
    const char32_t cp = next_code_point(s, i);
    const char32_t lo = lower_cp(cp);
    if (lo == cp) {
      out.append(s.substr(at, i - at));  // keeps malformed bytes untouched
    } else if (cp == 0x130) {
      out += "i\xCC\x87";  // Python: 'İ'.lower() == 'i̇'
    } else {
      append_utf8(out, lo);
    }
  }
  return out;
}

std::string replace_all(std::string_view s, std::string_view from, std::string_view to) {
  std::string out;
  if (from.empty()) return std::string(s);
  size_t pos = 0;
  while (true) {
    const size_t hit = s.find(from, pos);
    if (hit == std::string_view::npos) break;
    out.append(s.substr(pos, hit - pos));
    out.append(to);
    pos = hit + from.size();
  }
  out.append(s.substr(pos));
  return out;
}

size_t count_substr(std::string_view s, std::string_view needle) {
  size_t n = 0;
  for (size_t pos = s.find(needle); pos != std::string_view::npos; pos = s.find(needle, pos + needle.size())) ++n;
  return n;
}

std::vector<std::string> split_on(std::string_view s, std::string_view sep) {
  std::vector<std::string> out;
  size_t pos = 0;
  while (true) {
    const size_t hit = s.find(sep, pos);
    if (hit == std::string_view::npos) break;
    out.emplace_back(s.substr(pos, hit - pos));
    pos = hit + sep.size();
  }
  out.emplace_back(s.substr(pos));
  return out;
}

std::string join(const std::vector<std::string>& parts, std::string_view sep) {
  std::string out;
  for (size_t i = 0; i < parts.size(); ++i) {
    if (i) out.append(sep);
    out.append(parts[i]);
  }
  return out;
}

bool contains(std::string_view s, std::string_view needle) { return s.find(needle) != std::string_view::npos; }

std::string sanitize_utf8(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size();) {
    const size_t at = i;
    const char32_t cp = next_code_point(s, i);
    if (cp >= 0x80 && i - at == 1) {
      out += "\xEF\xBF\xBD";
    } else {
      out.append(s.substr(at, i - at));
    }
  }
  return out;
}

}  // namespace kvtier::bench
