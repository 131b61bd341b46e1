// GPT-2 byte-level symbols and the UTF-8 helpers the tokenizer needs.
//
// Byte-level BPE vocabularies (GPT-2, Llama 3, Qwen2, SmolLM2) never store raw
// bytes: every byte is first mapped to a printable code point (bytes that are
// already printable map to themselves, the other 68 to U+0100..U+0143 in
// order), so the vocabulary is valid UTF-8 text. Reference: OpenAI's GPT-2
// encoder.py, bytes_to_unicode().
#pragma once
#include <cstdint>
#include <string>
#include <string_view>

namespace kvtier::byte_level {

uint32_t byte_to_codepoint(uint8_t b);
// -1 when `cp` is not one of the 256 byte symbols.
int codepoint_to_byte(uint32_t cp);

// Raw bytes -> byte-level symbols (UTF-8 encoded).
std::string encode(std::string_view bytes);
// Byte-level symbols -> raw bytes. A code point that is not a byte symbol is
// kept as its UTF-8 bytes, as HF's ByteLevel decoder does.
std::string decode(std::string_view symbols);

void append_utf8(std::string& out, uint32_t cp);
// Decodes the code point starting at s[pos]; returns its length in bytes, or 0
// when the bytes there are not well-formed UTF-8 (overlong forms, surrogates
// and values above U+10FFFF are rejected too).
size_t utf8_decode(std::string_view s, size_t pos, uint32_t* cp);
bool is_valid_utf8(std::string_view s);
// Replaces every byte that does not start a well-formed sequence by U+FFFD,
// which is what llama.cpp does with such input before pre-tokenizing.
std::string sanitize_utf8(std::string_view s);

// Python's str.strip() set: the Unicode White_Space characters. Jinja's
// `trim` filter (used by the Llama 3 chat templates) strips exactly these.
bool is_unicode_space(uint32_t cp);
std::string trim_unicode_space(std::string_view s);

}  // namespace kvtier::byte_level
