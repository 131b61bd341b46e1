// kvtier run: generate from a prompt, a prompt file or an interactive chat,
// streaming text to stdout and timing to stderr.
#include <fmt/format.h>

#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iostream>
#include <memory>
#include <sstream>

#include "command.h"
#include "grammar/constraint.h"
#include "options.h"

namespace kvtier::tools {
namespace {

struct RunArgs {
  EngineOptions engine;
  SamplingParams sampling;
  std::string kv = "full";
  std::string prompt;
  std::string prompt_file;
  std::string system;
  bool raw = false;
  bool interactive = false;
  bool quiet = false;
  bool json = false;            // output constrained to a JSON object
  std::string json_schema_file;  // output constrained to a value of this JSON Schema
};

std::string read_file(const std::string& path) {
  KVT_CHECK(std::filesystem::exists(path), "prompt file {} does not exist", path);
  KVT_CHECK(!std::filesystem::is_directory(path), "prompt file {} is a directory, not a file", path);
  std::ifstream in(path, std::ios::binary);
  KVT_CHECK(in.good(), "cannot read prompt file {}", path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

void print_stats(const GenerationResult& r, bool quiet) {
  if (quiet) return;
  const double prefill_tps = r.prefill_seconds > 0 ? double(r.n_prompt_tokens) / r.prefill_seconds : 0;
  const size_t n_gen = r.tokens.size();
  // The first generated token comes out of the prefill's logits; the other
  // n_gen - 1 (plus a final EOS) each cost one decode forward.
  const size_t n_decode = r.finish_reason == "stop" ? n_gen : (n_gen > 0 ? n_gen - 1 : 0);
  const double decode_tps = r.decode_seconds > 0 ? double(n_decode) / r.decode_seconds : 0;
  fmt::print(stderr,
             "\n[kvtier] prompt {} tok, prefill {:.2f} s ({:.1f} tok/s) | generated {} tok, decode "
             "{:.2f} s ({:.1f} tok/s) | finish: {} | kv: {} (GPU tier {:.0f} B/tok, host {:.0f} B/tok)\n",
             r.n_prompt_tokens, r.prefill_seconds, prefill_tps, n_gen, r.decode_seconds, decode_tps,
             r.finish_reason, r.kv_policy, r.kv_memory.gpu_bytes_per_token,
             r.kv_memory.host_bytes_per_token);
}

// Prompts of more than this many tokens show prefill progress on stderr.
constexpr int64_t kPrefillProgressTokens = 2048;

GenerationResult stream(Engine& engine, const std::string& text, const RunArgs& a) {
  auto tokens = engine.tokenize(text, true);
  KVT_CHECK(!tokens.empty(), "the prompt is empty");
  auto seq = engine.start(std::move(tokens), a.sampling, a.kv);
  if (!a.quiet && seq->result().n_prompt_tokens > kPrefillProgressTokens) seq->set_prefill_progress(prefill_progress());
  GenerationResult r = seq->run([](const std::string& piece) {
    std::fwrite(piece.data(), 1, piece.size(), stdout);
    std::fflush(stdout);
    return true;
  });
  std::fputc('\n', stdout);
  return r;
}

void run(RunArgs& a) {
  KVT_CHECK(a.interactive || !a.prompt.empty() || !a.prompt_file.empty(),
            "give a prompt (-p TEXT or -f FILE) or use -i for an interactive chat");
  KVT_CHECK(a.prompt.empty() || a.prompt_file.empty(), "give -p or -f, not both");
  KVT_CHECK(!a.json || a.json_schema_file.empty(), "give --json or --json-schema, not both");
  auto engine = load_engine(a.engine);
  if (a.json) a.sampling.constraint = engine->grammar_vocab()->json_object();
  if (!a.json_schema_file.empty()) {
    std::ifstream in(a.json_schema_file, std::ios::binary);
    KVT_CHECK(in.good(), "cannot read JSON Schema file {}", a.json_schema_file);
    std::stringstream ss;
    ss << in.rdbuf();
    try {
      a.sampling.constraint = engine->grammar_vocab()->json_schema(ss.str(), a.json_schema_file);
    } catch (const GrammarError& e) {
      fail("{}: {}", a.json_schema_file, e.what());
    }
  }
  const bool chat = !a.raw && engine->tokenizer().chat_template() != ChatTemplate::none;
  std::vector<ChatMessage> history;
  if (!a.system.empty()) history.push_back({"system", a.system});
  if (!a.interactive) {
    std::string user = a.prompt_file.empty() ? a.prompt : read_file(a.prompt_file);
    KVT_CHECK(!user.empty(), "the prompt is empty{}", a.prompt_file.empty() ? "" : " (" + a.prompt_file + ")");
    std::string text = user;
    if (chat) {
      history.push_back({"user", user});
      text = engine->chat_prompt(history);
    }
    print_stats(stream(*engine, text, a), a.quiet);
    return;
  }
  KVT_CHECK(chat, "interactive mode needs a model with a chat template (drop --raw)");
  std::string line;
  for (;;) {
    fmt::print(stderr, "> ");
    if (!std::getline(std::cin, line)) break;
    if (line.empty()) continue;
    history.push_back({"user", line});
    auto r = stream(*engine, engine->chat_prompt(history), a);
    history.push_back({"assistant", r.text});
    print_stats(r, a.quiet);
  }
}

Registration reg(10, [](CLI::App& app) {
  auto a = std::make_shared<RunArgs>();
  auto* cmd = app.add_subcommand("run", "generate text: prompt, prompt file or interactive chat");
  add_engine_options(*cmd, a->engine);
  add_sampling_options(*cmd, a->sampling);
  add_kv_option(*cmd, a->kv);
  cmd->add_option("-p,--prompt", a->prompt, "prompt text (the user message in chat mode)");
  cmd->add_option("-f,--file", a->prompt_file, "read the prompt from a file");
  cmd->add_option("--system", a->system, "system message (chat mode)");
  cmd->add_flag("--raw", a->raw, "no chat template: feed the prompt as is");
  cmd->add_flag("-i,--interactive", a->interactive, "chat in the terminal, one line per turn");
  cmd->add_flag("-q,--quiet", a->quiet, "no timing line");
  cmd->add_flag("--json", a->json, "constrain the output to a JSON object (grammar-constrained decoding)");
  cmd->add_option("--json-schema", a->json_schema_file,
                  "constrain the output to a value of the JSON Schema in FILE (see README: structured output)");
  cmd->callback([a] { run(*a); });
});

}  // namespace
}  // namespace kvtier::tools
