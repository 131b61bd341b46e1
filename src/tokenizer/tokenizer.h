// Byte-level BPE tokenizer (GPT-2 family: Llama 3, Qwen2/3, SmolLM2), built
// from GGUF metadata or from a Hugging Face tokenizer.json, with the
// pre-tokenizer splits of each family and its special tokens, plus chat
// templates (ChatML, Llama 3).
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace kvtier {

class GgufFile;

// A call of a tool (function) by the assistant, as OpenAI's API carries it.
struct ToolCall {
  std::string id;
  std::string name;
  std::string arguments;  // a JSON object, as text
};

struct ChatMessage {
  std::string role;  // "system", "user", "assistant", "tool"
  std::string content;
  std::vector<ToolCall> tool_calls;  // an assistant turn that called tools
  std::string tool_call_id;          // role "tool": the call this answers
};

enum class ChatTemplate { chatml, llama3, none };

// How a chat template offers tools to the model and how the model calls one
// (chat_format.h): none (the template has no tools, e.g. SmolLM2's), hermes
// (Qwen2.5: <tools> in the system turn, <tool_call>{"name", "arguments"}</tool_call>),
// llama31_json (Llama 3.1/3.2/3.3: tools in the first user turn, {"name", "parameters"}).
enum class ToolFormat { none, hermes, llama31_json };

class Tokenizer {
 public:
  static std::unique_ptr<Tokenizer> from_gguf(const GgufFile& gguf);
  // tokenizer_config_json may be empty (then the defaults of the family apply).
  static std::unique_ptr<Tokenizer> from_hf(const std::string& tokenizer_json_path,
                                            const std::string& tokenizer_config_json_path);
  // From the text of a tokenizer.json (used by the fuzzer and tests).
  static std::unique_ptr<Tokenizer> from_hf_text(std::string_view tokenizer_json,
                                                 std::string_view tokenizer_config_json);
  virtual ~Tokenizer() = default;

  // parse_special: text like "<|im_start|>" becomes the special token.
  virtual std::vector<int32_t> encode(std::string_view text, bool add_bos,
                                      bool parse_special) const = 0;
  // The raw bytes of a token (may be an incomplete UTF-8 sequence).
  virtual std::string token_to_piece(int32_t id) const = 0;
  // Concatenated pieces; special tokens rendered as their text unless skip_special.
  virtual std::string decode(const std::vector<int32_t>& ids, bool skip_special = false) const = 0;

  virtual int32_t n_vocab() const = 0;
  virtual int32_t bos_id() const = 0;  // -1 when none
  virtual int32_t eos_id() const = 0;
  // End-of-generation tokens (eos, eot, <|im_end|>, <|eot_id|>...).
  virtual bool is_eog(int32_t id) const = 0;
  virtual bool is_special(int32_t id) const = 0;
  virtual bool add_bos_default() const = 0;

  virtual ChatTemplate chat_template() const = 0;
  virtual ToolFormat tool_format() const = 0;
  // Renders messages in the model's chat format; with add_generation_prompt
  // the text ends with the assistant header. tools_json: OpenAI's `tools`
  // array as JSON text, or empty; tools on a template without tool support
  // are an error.
  virtual std::string apply_chat_template(const std::vector<ChatMessage>& messages, bool add_generation_prompt,
                                          std::string_view tools_json) const = 0;
  std::string apply_chat_template(const std::vector<ChatMessage>& messages, bool add_generation_prompt) const {
    return apply_chat_template(messages, add_generation_prompt, {});
  }
};

}  // namespace kvtier
