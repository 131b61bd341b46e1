// Chat templates rendered natively for the two families the engine serves.
// The template text (GGUF tokenizer.chat_template or tokenizer_config.json's
// chat_template) is not executed; it is read for the family and for the
// details that change the output (a default system message, Llama 3.1's
// date header).
#pragma once
#include <string>
#include <string_view>
#include <vector>

#include "tokenizer/tokenizer.h"

namespace kvtier {

struct ChatFormat {
  ChatTemplate family = ChatTemplate::none;
  // ChatML: inserted as a system turn when the first message is not one
  // (SmolLM2's and Qwen2.5's templates do this). Empty: nothing inserted.
  std::string default_system;
  // Llama 3: the text that opens the conversation (the BOS token's text).
  std::string bos_text = "<|begin_of_text|>";
  // Llama 3.1+: a system turn always comes first, opening with the
  // knowledge-cutoff and date lines.
  bool llama31_system_header = false;
  std::string date_string = "26 Jul 2024";
  // How the template offers tools (tokenizer.h): Qwen2.5's has <tool_call>,
  // Llama 3.1's "Environment: ipython" (its tools_in_user_message default).
  ToolFormat tools = ToolFormat::none;
};

// Family from the template text; with no template, from the special tokens
// the vocabulary has (has_im_start: "<|im_start|>", has_header:
// "<|start_header_id|>").
ChatFormat detect_chat_format(std::string_view template_text, bool has_im_start, bool has_header);

// Throws kvtier::Error for family none, and for tools (tools_json: OpenAI's
// `tools` array, or empty) or tool calls in the messages when the template
// has no tool support.
std::string render_chat(const ChatFormat& format, const std::vector<ChatMessage>& messages,
                        bool add_generation_prompt, std::string_view tools_json = {});

}  // namespace kvtier
