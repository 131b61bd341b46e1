#include "bench/longproc_score.h"

#include <set>

#include "bench/bench_text.h"

namespace kvtier::bench {

std::string extract_tsv_block(std::string_view prediction) {
  const size_t open = prediction.find("```tsv");
  if (open == std::string_view::npos) return py_strip(prediction);
  // A regex '```tsv([\s\S]*)```' matches greedily up to the last fence; a
  // later "```tsv" is itself a fence, so when the first has none after it no
  // other can.
  const size_t close = prediction.rfind("```");
  if (close != std::string_view::npos && close >= open + 6)
    return py_strip(prediction.substr(open + 6, close - open - 6));
  const size_t next = prediction.find("```tsv", open + 6);
  return py_strip(prediction.substr(open + 6, next == std::string_view::npos ? next : next - open - 6));
}

std::optional<std::vector<std::vector<std::string>>> parse_tsv_records(const std::vector<std::string>& lines) {
  // States of CPython's _csv.c reader (default dialect, strict=False).
  enum State { start_record, start_field, in_field, in_quoted, quote_in_quoted, eat_crnl };
  std::vector<std::vector<std::string>> records;
  std::vector<std::string> fields;
  std::string field;
  bool field_started = false;
  State state = start_record;
  auto save_field = [&] {
    fields.push_back(std::move(field));
    field.clear();
    field_started = false;
  };
  for (const std::string& line : lines) {
    for (size_t i = 0; i <= line.size(); ++i) {
      const bool eol = i == line.size();
      const char c = eol ? '\0' : line[i];
      const bool newline = !eol && (c == '\n' || c == '\r');
      switch (state) {
        case start_record:
          if (eol) break;  // an empty line is the record []
          if (newline) {
            state = eat_crnl;
            break;
          }
          state = start_field;
          [[fallthrough]];
        case start_field:
          if (eol || newline) {
            save_field();
            state = eol ? start_record : eat_crnl;
          } else if (c == '"') {
            state = in_quoted;
            field_started = true;
          } else if (c == '\t') {
            save_field();
          } else {
            field += c;
            field_started = true;
            state = in_field;
          }
          break;
        case in_field:
          if (eol || newline) {
            save_field();
            state = eol ? start_record : eat_crnl;
          } else if (c == '\t') {
            save_field();
            state = start_field;
          } else {
            field += c;
          }
          break;
        case in_quoted:
          // Lines come without their '\n', so a quoted field continues on the
          // next line with nothing in between.
          if (eol) break;
          if (c == '"') {
            state = quote_in_quoted;
          } else {
            field += c;
          }
          break;
        case quote_in_quoted:
          if (c == '"' && !eol) {
            field += c;
            state = in_quoted;
          } else if (c == '\t' && !eol) {
            save_field();
            state = start_field;
          } else if (eol || newline) {
            save_field();
            state = eol ? start_record : eat_crnl;
          } else {
            field += c;
            state = in_field;
          }
          break;
        case eat_crnl:
          if (newline) break;
          if (eol) {
            state = start_record;
            break;
          }
          return std::nullopt;  // "new-line character seen in unquoted field"
      }
    }
    if (state == start_record) {
      records.push_back(std::move(fields));
      fields.clear();
    }
  }
  if (state == in_quoted || field_started) {  // input ended inside a record
    save_field();
    records.push_back(std::move(fields));
  }
  return records;
}

namespace {

bool is_ascii_punct(char32_t c) {
  return (c >= 33 && c <= 47) || (c >= 58 && c <= 64) || (c >= 91 && c <= 96) || (c >= 123 && c <= 126);
}

// Python's \w for the characters that survive punctuation removal. Non-ASCII
// code points count as word characters except spaces and the common
// punctuation and symbol blocks (an approximation of str.isalnum()).
bool is_word_cp(char32_t c) {
  if (c < 0x80) return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_';
  if (is_py_space(c)) return false;
  if (c >= 0xA1 && c <= 0xBF)
    return c == 0xAA || c == 0xB2 || c == 0xB3 || c == 0xB5 || c == 0xB9 || c == 0xBA || c >= 0xBC;
  if (c == 0xD7 || c == 0xF7) return false;
  if (c >= 0x2000 && c <= 0x206F) return false;  // general punctuation
  if (c >= 0x20A0 && c <= 0x20CF) return false;  // currency
  if (c >= 0x2190 && c <= 0x2BFF) return false;  // arrows, math, boxes, shapes, symbols
  if (c >= 0x3000 && c <= 0x303F) return false;  // CJK punctuation
  if (c >= 0x1F000) return false;                // emoji and pictographs
  return true;
}

}  // namespace

std::string normalize_tsv_cell(std::string_view cell) {
  const std::string lower = py_lower(cell);
  std::string no_punct;
  for (size_t i = 0; i < lower.size();) {
    const size_t at = i;
    if (!is_ascii_punct(next_code_point(lower, i))) no_punct.append(lower, at, i - at);
  }
  // Drop whole words "a", "an", "the"; then all whitespace.
  std::string out;
  std::string word;
  auto flush = [&] {
    if (word != "a" && word != "an" && word != "the") out += word;
    word.clear();
  };
  for (size_t i = 0; i < no_punct.size();) {
    const size_t at = i;
    const char32_t c = next_code_point(no_punct, i);
    if (is_word_cp(c)) {
      word.append(no_punct, at, i - at);
      continue;
    }
    flush();
    if (!is_py_space(c)) out.append(no_punct, at, i - at);
  }
  flush();
  return out;
}

namespace {

struct Table {
  std::vector<std::vector<std::string>> rows;  // normalized cells
  size_t n_col = 0;
};

// The evaluator's _string_to_pd: header first; a last row of the wrong width
// is dropped (a trailing remark); other wrong-width rows become N/A rows.
std::optional<Table> build_table(std::string_view text, std::string* error) {
  auto records = parse_tsv_records(split_on(py_strip(text), "\n"));
  if (!records) {
    *error = "TSV parse error (new-line character in unquoted field)";
    return std::nullopt;
  }
  if (records->size() < 2) {
    *error = "no rows after the header";
    return std::nullopt;
  }
  Table t;
  const auto& header = (*records)[0];
  t.n_col = header.size();
  if (std::set<std::string>(header.begin(), header.end()).size() != header.size()) {
    *error = "repeated column name in the header";  // pandas then fails to normalize
    return std::nullopt;
  }
  size_t n_data = records->size() - 1;
  if ((*records)[n_data].size() != t.n_col) --n_data;
  const std::string na = normalize_tsv_cell("N/A");
  for (size_t r = 1; r <= n_data; ++r) {
    const auto& rec = (*records)[r];
    std::vector<std::string> row;
    for (size_t c = 0; c < t.n_col; ++c) row.push_back(rec.size() == t.n_col ? normalize_tsv_cell(rec[c]) : na);
    t.rows.push_back(std::move(row));
  }
  return t;
}

}  // namespace

TsvScore score_html_to_tsv(std::string_view prediction, std::string_view gold_tsv) {
  TsvScore s;
  const std::string pred_text = extract_tsv_block(prediction);
  auto gold = build_table(gold_tsv, &s.error);
  if (!gold) {
    s.error = "gold: " + s.error;
    return s;
  }
  auto pred = build_table(pred_text, &s.error);
  if (!pred) {
    s.error = "prediction: " + s.error;
    return s;
  }
  if (pred->rows.empty() || gold->rows.empty()) {
    s.error = pred->rows.empty() ? "prediction has no complete row" : "gold has no complete row";
    return s;
  }
  if (pred->n_col != gold->n_col) {
    s.error = "prediction has " + std::to_string(pred->n_col) + " columns, gold " + std::to_string(gold->n_col);
    return s;
  }
  const std::set<std::vector<std::string>> gold_set(gold->rows.begin(), gold->rows.end());
  const std::set<std::vector<std::string>> pred_set(pred->rows.begin(), pred->rows.end());
  size_t n_hit = 0;
  for (const auto& row : pred->rows) n_hit += gold_set.count(row);
  s.precision = static_cast<double>(n_hit) / static_cast<double>(pred->rows.size());
  n_hit = 0;
  for (const auto& row : gold->rows) n_hit += pred_set.count(row);
  s.recall = static_cast<double>(n_hit) / static_cast<double>(gold->rows.size());
  s.f1 = s.precision + s.recall > 0 ? 2 * s.precision * s.recall / (s.precision + s.recall) : 0.0;
  s.extracted = true;
  return s;
}

}  // namespace kvtier::bench
