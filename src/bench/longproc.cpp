#include "bench/longproc.h"

#include <nlohmann/json.hpp>

#include "bench/bench_text.h"
#include "bench/jsonl.h"
#include "core/status.h"

namespace kvtier::bench {

using nlohmann::json;

std::vector<LongProcTask> load_longproc_tasks(const std::string& dir, const std::string& group) {
  const std::string path = dir + "/html_to_tsv_" + group + ".json";
  const std::string text = read_text_file(path);
  json doc;
  try {
    doc = json::parse(text);
  } catch (const json::parse_error& e) {
    const size_t at = std::min<size_t>(e.byte, text.size());
    const size_t line = 1 + count_substr(std::string_view(text).substr(0, at), "\n");
    fail("{}:{}: not valid JSON ({})", path, line, e.what());
  }
  KVT_CHECK(doc.is_array(), "{}: expected a JSON list of tasks, got {}", path, doc.type_name());
  std::vector<LongProcTask> out;
  for (size_t i = 0; i < doc.size(); ++i) {
    const std::string where = path + " task " + std::to_string(i);
    KVT_CHECK(doc[i].is_object(), "{}: expected an object, got {}", where, doc[i].type_name());
    LongProcTask t;
    t.task_id = get_string_field(doc[i], "task_id", where);
    t.html_path = get_string_field(doc[i], "html_path", where);
    t.task_topic = get_string_field(doc[i], "task_topic", where);
    t.task_description = get_string_field(doc[i], "task_description", where);
    t.gt = get_string_field(doc[i], "gt", where);
    t.tsv_header = get_string_field(doc[i], "tsv_header", where);
    t.filtering_instruction = get_string_field(doc[i], "filtering_instruction", where);
    out.push_back(std::move(t));
  }
  return out;
}

std::string yaml_block_scalar(const std::string& text, const std::string& key, const std::string& name) {
  const auto lines = split_on(text, "\n");
  for (size_t i = 0; i < lines.size(); ++i) {
    std::string line = lines[i];
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.rfind(key + ":", 0) != 0) continue;
    const std::string rest = py_strip(line.substr(key.size() + 1));
    KVT_CHECK(rest == "|" || rest == "|-" || rest == "|+",
              "{}:{}: '{}' must be a literal block scalar ('|', '|-' or '|+'), got '{}'", name, i + 1, key, rest);
    size_t indent = 0;
    std::vector<std::string> body;
    size_t j = i + 1;
    for (; j < lines.size(); ++j) {
      std::string l = lines[j];
      if (!l.empty() && l.back() == '\r') l.pop_back();
      if (l.find_first_not_of(' ') == std::string::npos) {  // blank lines belong to the block
        body.emplace_back();
        continue;
      }
      const size_t lead = l.find_first_not_of(' ');
      if (indent == 0) {
        KVT_CHECK(lead > 0, "{}:{}: block of '{}' is not indented", name, j + 1, key);
        indent = lead;
      }
      if (lead < indent) break;  // the next key
      body.push_back(l.substr(indent));
    }
    // Chomping: '|-' strips trailing newlines, '|' keeps one, '|+' keeps all.
    size_t n_trailing_blank = 0;
    while (n_trailing_blank < body.size() && body[body.size() - 1 - n_trailing_blank].empty()) ++n_trailing_blank;
    std::vector<std::string> content(body.begin(), body.end() - static_cast<std::ptrdiff_t>(n_trailing_blank));
    std::string out = join(content, "\n");
    if (rest == "|") out += "\n";
    if (rest == "|+") out += "\n" + std::string(n_trailing_blank, '\n');
    return out;
  }
  fail("{}: no top-level key '{}'", name, key);
}

std::string py_format(const std::string& tmpl, const std::vector<std::pair<std::string, std::string>>& fields) {
  std::string out;
  for (size_t i = 0; i < tmpl.size(); ++i) {
    const char c = tmpl[i];
    if (c == '{' && i + 1 < tmpl.size() && tmpl[i + 1] == '{') {
      out += '{';
      ++i;
    } else if (c == '}' && i + 1 < tmpl.size() && tmpl[i + 1] == '}') {
      out += '}';
      ++i;
    } else if (c == '{') {
      const size_t end = tmpl.find('}', i);
      KVT_CHECK(end != std::string::npos, "template: unclosed '{{' at offset {}", i);
      const std::string name = tmpl.substr(i + 1, end - i - 1);
      bool found = false;
      for (const auto& [k, v] : fields) {
        if (k == name) {
          out += v;
          found = true;
          break;
        }
      }
      KVT_CHECK(found, "template: unknown field '{}'", name);
      i = end;
    } else {
      KVT_CHECK(c != '}', "template: single '}}' at offset {}", i);
      out += c;
    }
  }
  return out;
}

BenchSample make_longproc_sample(const std::string& dir, const std::string& user_prompt_template,
                                 const LongProcTask& task) {
  const std::string html = read_text_file(dir + "/" + task.html_path);
  BenchSample s;
  s.task = "longproc";
  s.id = task.task_id;
  s.prompt = py_format(user_prompt_template, {{"html_str", html},
                                              {"task_topic", task.task_topic},
                                              {"task_description", task.task_description},
                                              {"filtering_instruction", task.filtering_instruction},
                                              {"tsv_header", task.tsv_header}});
  s.gold = {{"gt", task.gt}};
  s.reference = "```tsv\n" + task.gt + "\n```";
  return s;
}

}  // namespace kvtier::bench
