// LongProc HTML->TSV tasks: loader for the task files, web pages and the prompt
// template (prompts.yaml), and the prompt as LongProc formats it.
#pragma once
#include <string>
#include <vector>

#include "bench/bench_sample.h"

namespace kvtier::bench {

struct LongProcTask {
  std::string task_id;
  std::string html_path;  // relative to the data folder
  std::string task_topic;
  std::string task_description;
  std::string gt;  // gold TSV, header first
  std::string tsv_header;
  std::string filtering_instruction;
};

// <dir>/html_to_tsv_<group>.json (group "0.5k", "2k", ...): a JSON list of tasks.
// Errors name the file, the line of a JSON syntax error, or the task and field.
std::vector<LongProcTask> load_longproc_tasks(const std::string& dir, const std::string& group);

// The value of a top-level block scalar ("KEY: |-" followed by indented lines)
// in a YAML file: the only YAML construct prompts.yaml uses. Throws naming the
// file for anything else.
std::string yaml_block_scalar(const std::string& text, const std::string& key, const std::string& name);

// Python str.format with named fields ("{name}", "{{" and "}}" escapes).
std::string py_format(const std::string& tmpl, const std::vector<std::pair<std::string, std::string>>& fields);

// The user prompt of one task (reads its web page from <dir>/<html_path>).
BenchSample make_longproc_sample(const std::string& dir, const std::string& user_prompt_template,
                                 const LongProcTask& task);

}  // namespace kvtier::bench
