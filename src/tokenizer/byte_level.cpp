#include "tokenizer/byte_level.h"

#include <array>

namespace kvtier::byte_level {
namespace {

struct Tables {
  std::array<uint32_t, 256> to_cp{};
  std::array<std::string, 256> to_utf8;
  Tables() {
    uint32_t next_extra = 256;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174);
      to_cp[b] = printable ? uint32_t(b) : next_extra++;
      append_utf8(to_utf8[b], to_cp[b]);
    }
  }
};

const Tables& tables() {
  static const Tables t;
  return t;
}

}  // namespace

uint32_t byte_to_codepoint(uint8_t b) { return tables().to_cp[b]; }

int codepoint_to_byte(uint32_t cp) {
  // The map is the identity on printable Latin-1 and sends the rest, in byte
  // order, to U+0100..U+0143.
  if ((cp >= 33 && cp <= 126) || (cp >= 161 && cp <= 172) || (cp >= 174 && cp <= 255)) return int(cp);
  if (cp >= 256 && cp < 256 + 68) {
    static const std::array<int16_t, 68> extra = [] {
      std::array<int16_t, 68> e{};
      for (int b = 0; b < 256; ++b) {
        const uint32_t c = byte_to_codepoint(uint8_t(b));
        if (c >= 256) e[c - 256] = int16_t(b);
      }
      return e;
    }();
    return extra[cp - 256];
  }
  return -1;
}

std::string encode(std::string_view bytes) {
  const Tables& t = tables();
  std::string out;
  out.reserve(bytes.size() * 2);
  for (unsigned char b : bytes) out += t.to_utf8[b];
  return out;
}

std::string decode(std::string_view symbols) {
  std::string out;
  out.reserve(symbols.size());
  size_t pos = 0;
  while (pos < symbols.size()) {
    uint32_t cp = 0;
    const size_t len = utf8_decode(symbols, pos, &cp);
    if (len == 0) {  // not UTF-8: pass the byte through unchanged
      out += symbols[pos++];
      continue;
    }
    const int b = codepoint_to_byte(cp);
    if (b >= 0) {
      out += char(b);
    } else {
      out.append(symbols.substr(pos, len));
    }
    pos += len;
  }
  return out;
}

void append_utf8(std::string& out, uint32_t cp) {
  if (cp < 0x80) {
    out += char(cp);
  } else if (cp < 0x800) {
    out += char(0xC0 | (cp >> 6));
    out += char(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += char(0xE0 | (cp >> 12));
    out += char(0x80 | ((cp >> 6) & 0x3F));
    out += char(0x80 | (cp & 0x3F));
  } else {
    out += char(0xF0 | (cp >> 18));
    out += char(0x80 | ((cp >> 12) & 0x3F));
    out += char(0x80 | ((cp >> 6) & 0x3F));
    out += char(0x80 | (cp & 0x3F));
  }
}

size_t utf8_decode(std::string_view s, size_t pos, uint32_t* cp) {
  const auto at = [&](size_t i) { return uint8_t(s[i]); };
  const uint8_t b0 = at(pos);
  if (b0 < 0x80) {
    *cp = b0;
    return 1;
  }
  size_t len = 0;
  uint32_t min = 0;
  uint32_t v = 0;
  if ((b0 & 0xE0) == 0xC0) {
    len = 2, min = 0x80, v = b0 & 0x1F;
  } else if ((b0 & 0xF0) == 0xE0) {
    len = 3, min = 0x800, v = b0 & 0x0F;
  } else if ((b0 & 0xF8) == 0xF0) {
    len = 4, min = 0x10000, v = b0 & 0x07;
  } else {
    return 0;
  }
  if (pos + len > s.size()) return 0;
  for (size_t i = 1; i < len; ++i) {
    const uint8_t b = at(pos + i);
    if ((b & 0xC0) != 0x80) return 0;
    v = (v << 6) | (b & 0x3F);
  }
  if (v < min || v > 0x10FFFF || (v >= 0xD800 && v <= 0xDFFF)) return 0;
  *cp = v;
  return len;
}

bool is_valid_utf8(std::string_view s) {
  size_t pos = 0;
  uint32_t cp = 0;
  while (pos < s.size()) {
    const size_t len = utf8_decode(s, pos, &cp);
    if (len == 0) return false;
    pos += len;
  }
  return true;
}

std::string sanitize_utf8(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  size_t pos = 0;
  uint32_t cp = 0;
  while (pos < s.size()) {
    const size_t len = utf8_decode(s, pos, &cp);
    if (len == 0) {
      out += "\xEF\xBF\xBD";
      ++pos;
    } else {
      out.append(s.substr(pos, len));
      pos += len;
    }
  }
  return out;
}

bool is_unicode_space(uint32_t cp) {
  return (cp >= 0x09 && cp <= 0x0D) || cp == 0x20 || cp == 0x85 || cp == 0xA0 || cp == 0x1680 ||
         (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 || cp == 0x2029 || cp == 0x202F ||
         cp == 0x205F || cp == 0x3000 || (cp >= 0x1C && cp <= 0x1F);  // Python also strips FS..US
}

std::string trim_unicode_space(std::string_view s) {
  size_t begin = 0;
  size_t end = s.size();
  uint32_t cp = 0;
  while (begin < end) {
    const size_t len = utf8_decode(s, begin, &cp);
    if (len == 0 || !is_unicode_space(cp)) break;
    begin += len;
  }
  while (end > begin) {
    size_t start = end - 1;
    while (start > begin && (uint8_t(s[start]) & 0xC0) == 0x80) --start;
    const size_t len = utf8_decode(s, start, &cp);
    if (len != end - start || !is_unicode_space(cp)) break;
    end = start;
  }
  return std::string(s.substr(begin, end - begin));
}

}  // namespace kvtier::byte_level
