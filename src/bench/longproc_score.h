// LongProc HTML->TSV metric (Ye et al., 2025): the TSV is taken from the
// ```tsv block, parsed like Python's csv module (tab-delimited, '"' quoting),
// every cell normalized (lower case, no ASCII punctuation, no articles, no
// whitespace), and rows matched exactly, in any order.
#pragma once
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace kvtier::bench {

struct TsvScore {
  double precision = 0;  // predicted rows found in the gold
  double recall = 0;     // gold rows found in the prediction
  double f1 = 0;
  bool extracted = false;  // the evaluator could build and compare both tables
  std::string error;       // why not, when not
};

// The text between the first "```tsv" and the last "```" after it, or after
// "```tsv" up to the next "```tsv" when unclosed, or everything; stripped.
std::string extract_tsv_block(std::string_view prediction);

// Records of tab-separated text split into lines, as Python's
// csv.reader(lines, delimiter='\t') returns them; nullopt where it raises.
std::optional<std::vector<std::vector<std::string>>> parse_tsv_records(const std::vector<std::string>& lines);

// The cell normalization of the LongProc evaluator.
std::string normalize_tsv_cell(std::string_view cell);

// Scores a raw model output against the gold TSV (header line first).
TsvScore score_html_to_tsv(std::string_view prediction, std::string_view gold_tsv);

}  // namespace kvtier::bench
