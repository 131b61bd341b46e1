#include "tokenizer/chat_format.h"

#include "core/status.h"
#include "tokenizer/byte_level.h"

namespace kvtier {
namespace {

// Undoes the escapes of a Jinja string literal (\n, \t, \', \", \\).
std::string unescape_jinja(std::string_view s) {
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '\\' && i + 1 < s.size()) {
      const char n = s[++i];
      switch (n) {
        case 'n': out += '\n'; break;
        case 't': out += '\t'; break;
        case 'r': out += '\r'; break;
        default: out += n; break;
      }
    } else {
      out += s[i];
    }
  }
  return out;
}

// Finds a literal system turn in a ChatML template: "<|im_start|>system" + a
// newline (real, or the two characters \n inside a Jinja string) + text with
// no quotes or expression syntax + "<|im_end|>". A turn built from
// messages[0]['content'] never qualifies, since it leaves the string literal.
std::string find_default_system(std::string_view t) {
  constexpr std::string_view open = "<|im_start|>system";
  constexpr std::string_view close = "<|im_end|>";
  size_t pos = 0;
  while ((pos = t.find(open, pos)) != std::string_view::npos) {
    size_t body = pos + open.size();
    pos = body;
    if (t.substr(body, 1) == "\n") {
      body += 1;
    } else if (t.substr(body, 2) == "\\n") {
      body += 2;
    } else {
      continue;
    }
    const size_t end = t.find(close, body);
    if (end == std::string_view::npos) break;
    const std::string_view text = t.substr(body, end - body);
    if (text.find_first_of("'\"{}+") != std::string_view::npos) continue;
    return unescape_jinja(text);
  }
  return {};
}

// Llama 3.1's template sets `date_string = "26 Jul 2024"` unless the caller
// passes one; take the literal from the template when it has one.
std::string find_date_string(std::string_view t, const std::string& fallback) {
  const size_t at = t.find("date_string = \"");
  if (at == std::string_view::npos) return fallback;
  const size_t begin = at + 15;
  const size_t end = t.find('"', begin);
  if (end == std::string_view::npos || end - begin > 40) return fallback;
  return std::string(t.substr(begin, end - begin));
}

}  // namespace

ChatFormat detect_chat_format(std::string_view t, bool has_im_start, bool has_header) {
  ChatFormat f;
  if (t.find("<|im_start|>") != std::string_view::npos) {
    f.family = ChatTemplate::chatml;
    f.default_system = find_default_system(t);
  } else if (t.find("<|start_header_id|>") != std::string_view::npos) {
    f.family = ChatTemplate::llama3;
    f.llama31_system_header = t.find("Cutting Knowledge Date") != std::string_view::npos;
    f.date_string = find_date_string(t, f.date_string);
  } else if (t.empty() && has_header) {  // the rarer marker decides when a vocabulary has both
    f.family = ChatTemplate::llama3;
  } else if (t.empty() && has_im_start) {
    f.family = ChatTemplate::chatml;
  }
  return f;
}

std::string render_chat(const ChatFormat& f, const std::vector<ChatMessage>& messages,
                        bool add_generation_prompt) {
  KVT_CHECK(f.family != ChatTemplate::none,
            "chat template: this tokenizer has no supported chat template (ChatML or Llama 3)");
  std::string out;
  if (f.family == ChatTemplate::chatml) {
    if (!f.default_system.empty() && (messages.empty() || messages[0].role != "system")) {
      out += "<|im_start|>system\n" + f.default_system + "<|im_end|>\n";
    }
    for (const ChatMessage& m : messages) {
      out += "<|im_start|>" + m.role + "\n" + m.content + "<|im_end|>\n";
    }
    if (add_generation_prompt) out += "<|im_start|>assistant\n";
    return out;
  }
  // Llama 3: contents are trimmed by the template (`| trim`).
  out += f.bos_text;
  size_t first = 0;
  if (f.llama31_system_header) {
    std::string system;
    if (!messages.empty() && messages[0].role == "system") {
      system = byte_level::trim_unicode_space(messages[0].content);
      first = 1;
    }
    out += "<|start_header_id|>system<|end_header_id|>\n\n";
    out += "Cutting Knowledge Date: December 2023\nToday Date: " + f.date_string + "\n\n";
    out += system + "<|eot_id|>";
  }
  for (size_t i = first; i < messages.size(); ++i) {
    out += "<|start_header_id|>" + messages[i].role + "<|end_header_id|>\n\n" +
           byte_level::trim_unicode_space(messages[i].content) + "<|eot_id|>";
  }
  if (add_generation_prompt) out += "<|start_header_id|>assistant<|end_header_id|>\n\n";
  return out;
}

}  // namespace kvtier
