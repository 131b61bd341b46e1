#include "kv/policy.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <vector>

#include "core/status.h"
#include "ops/quant/quant_format.h"

namespace kvtier {
namespace {

const char* kPresets = "full, shadowkv, yakv, oracle, landmarks";
const char* kKeys =
    "index, chunk, lm, meta, res, m, rank, kv, keys_prerope, budget, min_budget, sink, local, outliers, "
    "reselect, rescore, gqa, cache, prefill, store";

PolicyConfig preset(const std::string& name) {
  PolicyConfig p;
  p.preset = name;
  if (name == "full") return p;
  if (name == "shadowkv") {
    // ShadowKV (ICML 2025) on Llama-3.1-8B: rank 160 of 1024 KV dims, chunk-8
    // landmarks, 48 outlier chunks, 32 local tokens, 2048 tokens of 128K.
    p.index = IndexKind::shadowkv;
    p.chunk = 8;
    p.lm = bf16_spec();
    p.rank = 160.0 / 1024.0;
    p.budget = 2048.0 / 131072.0;
    p.local = 32;
    p.outliers = 48;
    return p;
  }
  if (name == "yakv") {
    // SPEC "Why": per-token 2-bit HIGGS landmarks (EDEN4-256, one scale per
    // head of ≤ 128 dims), 4-bit HIGGS host K/V over the layer's KV width.
    p.index = IndexKind::landmarks;
    p.chunk = 1;
    p.lm = parse_quant_spec("higgs2:g128");
    // Host records per KV head (group 128 = one Hadamard group per head), so
    // that a head's gather reads only its own 144 bytes.
    p.kv = parse_quant_spec("higgs4:g128");
    p.budget = 0.03125;
    p.local = 64;
    return p;
  }
  if (name == "oracle") {
    p.index = IndexKind::exact;
    p.chunk = 1;
    p.budget = 0.03125;
    p.local = 64;
    return p;
  }
  if (name == "landmarks") {
    p.index = IndexKind::landmarks;
    p.chunk = 8;
    p.lm = bf16_spec();
    p.budget = 0.03125;
    p.local = 64;
    return p;
  }
  fail("kv policy: unknown preset '{}' (valid presets: {})", name, kPresets);
}

int parse_int(const std::string& key, const std::string& v, int lo, int hi) {
  size_t used = 0;
  long long x = 0;
  try {
    x = std::stoll(v, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  KVT_CHECK(used == v.size() && !v.empty() && x >= lo && x <= hi,
            "kv policy: {}={} is not valid (expected an integer in [{}, {}])", key, v, lo, hi);
  return int(x);
}

double parse_double(const std::string& key, const std::string& v) {
  size_t used = 0;
  double x = 0;
  try {
    x = std::stod(v, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  KVT_CHECK(used == v.size() && !v.empty() && std::isfinite(x),
            "kv policy: {}={} is not a number", key, v);
  return x;
}

QuantSpec check_quant(const std::string& key, const std::string& v) {
  try {
    return parse_quant_spec(v);
  } catch (const Error& e) {
    fail("kv policy: {}={} is not a quantizer spec ({})", key, v, e.what());
  }
}

std::string fmt_double(double x) {
  std::string s = fmt::format("{:.10g}", x);
  return s;
}

}  // namespace

const char* cache_mode_name(CacheMode m) {
  switch (m) {
    case CacheMode::step: return "step";
    case CacheMode::all: return "all";
    case CacheMode::none: return "none";
    default: return "auto";
  }
}

const char* store_mode_name(StoreMode m) { return m == StoreMode::gpu ? "gpu" : "host"; }

const char* prefill_mode_name(PrefillMode m) {
  switch (m) {
    case PrefillMode::dense: return "dense";
    case PrefillMode::stream: return "stream";
    default: return "auto";
  }
}

namespace {

const char* index_name(IndexKind k) {
  switch (k) {
    case IndexKind::none: return "none";
    case IndexKind::landmarks: return "landmarks";
    case IndexKind::exact: return "exact";
    case IndexKind::shadowkv: return "shadowkv";
  }
  return "?";
}

}  // namespace

PolicyConfig parse_policy(const std::string& text) {
  std::vector<std::string> items;
  {
    size_t start = 0;
    while (true) {
      size_t comma = text.find(',', start);
      items.push_back(text.substr(start, comma == std::string::npos ? std::string::npos
                                                                     : comma - start));
      if (comma == std::string::npos) break;
      start = comma + 1;
    }
  }
  KVT_CHECK(!items[0].empty(), "kv policy '{}': expected a preset first (one of: {})", text,
            kPresets);
  PolicyConfig p = preset(items[0]);
  std::map<std::string, std::string> seen;
  for (size_t i = 1; i < items.size(); ++i) {
    const std::string& item = items[i];
    size_t eq = item.find('=');
    KVT_CHECK(eq != std::string::npos && eq > 0,
              "kv policy '{}': '{}' is not key=value (keys: {})", text, item, kKeys);
    std::string key = item.substr(0, eq);
    std::string v = item.substr(eq + 1);
    KVT_CHECK(!seen.count(key), "kv policy '{}': key '{}' given twice", text, key);
    seen[key] = v;
    if (key == "index") {
      if (v == "none") p.index = IndexKind::none;
      else if (v == "landmarks") p.index = IndexKind::landmarks;
      else if (v == "exact") p.index = IndexKind::exact;
      else if (v == "shadowkv") p.index = IndexKind::shadowkv;
      else fail("kv policy: index={} is not valid (valid: none, landmarks, exact, shadowkv)", v);
    } else if (key == "chunk") {
      p.chunk = parse_int(key, v, 1, 1 << 20);
    } else if (key == "lm") {
      if (v == "residual" || v.rfind("residual:", 0) == 0) {
        p.residual = true;
        if (v.size() > 9) {
          std::string opt = v.substr(9);
          KVT_CHECK(opt.rfind("meta=", 0) == 0,
                    "kv policy: lm={} is not valid (expected residual or residual:meta=SPEC)", v);
          KVT_CHECK(!seen.count("meta"), "kv policy '{}': meta given twice", text);
          seen["meta"] = opt.substr(5);
          p.res_meta = check_quant("meta", opt.substr(5));
        }
      } else {
        p.residual = false;
        p.lm = check_quant(key, v);
      }
    } else if (key == "meta") {
      p.res_meta = check_quant(key, v);
    } else if (key == "res") {
      p.res = check_quant(key, v);
    } else if (key == "m") {
      p.res_m = parse_int(key, v, 1, 1 << 16);
    } else if (key == "rank") {
      p.rank_fraction = true;
      if (v == "full") {
        p.rank = 1.0;
      } else if (!v.empty() && v.back() == '%') {
        double x = parse_double(key, v.substr(0, v.size() - 1));
        KVT_CHECK(x > 0 && x <= 100, "kv policy: rank={} must be in (0%, 100%]", v);
        p.rank = x / 100.0;
      } else {
        double x = parse_double(key, v);
        KVT_CHECK(x > 0 && (x < 1 || x == std::floor(x)),
                  "kv policy: rank={} is not valid (expected an integer ≥ 1, a fraction in "
                  "(0, 1), P% or full)",
                  v);
        p.rank = x;
        p.rank_fraction = x < 1;
      }
    } else if (key == "kv") {
      p.kv = check_quant(key, v);
    } else if (key == "keys_prerope") {
      KVT_CHECK(v == "0" || v == "1" || v == "true" || v == "false",
                "kv policy: keys_prerope={} is not valid (valid: 0, 1)", v);
      p.keys_prerope = v == "1" || v == "true";
    } else if (key == "budget") {
      double x = parse_double(key, v);
      KVT_CHECK(x > 0 && (x < 1 || x == std::floor(x)),
                "kv policy: budget={} is not valid (expected tokens, an integer ≥ 1, or a "
                "fraction of the prompt in (0, 1))",
                v);
      p.budget = x;
    } else if (key == "min_budget") {
      p.min_budget = parse_int(key, v, 0, 1 << 30);
    } else if (key == "sink") {
      p.sink = parse_int(key, v, 0, 1 << 30);
    } else if (key == "local") {
      p.local = parse_int(key, v, 0, 1 << 30);
    } else if (key == "outliers") {
      p.outliers = parse_int(key, v, 0, 1 << 30);
    } else if (key == "reselect") {
      p.reselect = parse_int(key, v, 1, 1 << 20);
    } else if (key == "rescore") {
      p.rescore = parse_int(key, v, 0, 1 << 10);
    } else if (key == "gqa") {
      if (v == "shadowkv") p.gqa = GqaMode::shadowkv;
      else if (v == "mean") p.gqa = GqaMode::mean;
      else fail("kv policy: gqa={} is not valid (valid: shadowkv, mean)", v);
    } else if (key == "cache") {
      if (v == "auto") p.cache = CacheMode::auto_;
      else if (v == "step") p.cache = CacheMode::step;
      else if (v == "all") p.cache = CacheMode::all;
      else if (v == "none") p.cache = CacheMode::none;
      else fail("kv policy: cache={} is not valid (valid: auto, step, all, none)", v);
    } else if (key == "prefill") {
      if (v == "auto") p.prefill = PrefillMode::auto_;
      else if (v == "dense") p.prefill = PrefillMode::dense;
      else if (v == "stream") p.prefill = PrefillMode::stream;
      else fail("kv policy: prefill={} is not valid (valid: auto, dense, stream)", v);
    } else if (key == "store") {
      if (v == "host") p.store = StoreMode::host;
      else if (v == "gpu") p.store = StoreMode::gpu;
      else fail("kv policy: store={} is not valid (valid: host, gpu)", v);
    } else {
      fail("kv policy '{}': unknown key '{}' (valid keys: {})", text, key, kKeys);
    }
  }
  // Contradictions: knobs that the chosen index does not use.
  auto given = [&](const char* k) { return seen.count(k) > 0; };
  auto forbid = [&](bool bad, const char* k, const char* why) {
    KVT_CHECK(!(bad && given(k)), "kv policy '{}': {} makes no sense with index={} ({})", text, k,
              index_name(p.index), why);
  };
  bool dense = p.index == IndexKind::none;
  for (const char* k : {"budget", "min_budget", "sink", "local", "reselect", "rescore", "gqa", "chunk", "lm", "keys_prerope",
                        "cache"})
    forbid(dense, k, "dense attention selects nothing");
  forbid(dense, "prefill", "dense attention keeps every token's K/V on the device");
  forbid(dense, "store", "dense attention has no quantized store: its K/V stay on the device");
  KVT_CHECK(p.cache != CacheMode::none || p.store == StoreMode::gpu,
            "kv policy '{}': cache=none reads the store in place, which needs store=gpu (a store in host memory "
            "would be read over PCIe at every step)", text);
  forbid(p.index != IndexKind::shadowkv, "rank", "only the shadowkv index has an SVD");
  forbid(p.index != IndexKind::shadowkv, "outliers", "outlier chunks belong to the shadowkv index");
  forbid(p.index == IndexKind::exact, "chunk", "the exact index scores every token");
  forbid(p.index == IndexKind::exact, "lm", "the exact index holds exact keys");
  bool residual_knob = given("meta") || given("res") || given("m");
  KVT_CHECK(!(residual_knob && !p.residual),
            "kv policy '{}': meta/res/m need lm=residual (residual landmarks)", text);
  KVT_CHECK(!(p.residual && p.index != IndexKind::landmarks),
            "kv policy '{}': lm=residual needs index=landmarks (now index={})", text,
            index_name(p.index));
  if (p.index == IndexKind::shadowkv) {
    KVT_CHECK(p.rank > 0, "kv policy '{}': index=shadowkv needs rank=", text);
    KVT_CHECK(!p.keys_prerope,
              "kv policy '{}': keys_prerope with index=shadowkv: ShadowKV reconstructs keys "
              "from its SVD, the host holds values only", text);
  } else {
    p.rank = 0;
    p.rank_fraction = true;
    p.outliers = 0;
  }
  if (!dense) KVT_CHECK(p.budget > 0, "kv policy '{}': a sparse index needs budget=", text);
  if (p.index == IndexKind::exact) p.chunk = 1;
  if (p.rescore > 0) {
    KVT_CHECK(p.reselect > 1, "kv policy '{}': rescore=D rescores candidates between picks, which needs reselect > 1",
              text);
    KVT_CHECK(p.chunk == 1, "kv policy '{}': rescore needs chunk=1 (its candidates are the tokens after each picked one)",
              text);
    KVT_CHECK(p.outliers == 0, "kv policy '{}': rescore with outlier chunks is not supported (outliers=0)", text);
    KVT_CHECK(!p.residual, "kv policy '{}': rescore with lm=residual is not supported", text);
  }
  return p;
}

std::string to_string(const PolicyConfig& p) {
  std::string s = fmt::format("{},index={}", p.preset, index_name(p.index));
  if (p.index != IndexKind::none) {
    if (p.index != IndexKind::exact) {
      s += fmt::format(",chunk={}", p.chunk);
      if (p.residual)
        s += fmt::format(",lm=residual,meta={},res={},m={}", to_string(p.res_meta), to_string(p.res), p.res_m);
      else s += fmt::format(",lm={}", to_string(p.lm));
    }
    if (p.index == IndexKind::shadowkv)
      s += fmt::format(",rank={},outliers={}",
                       p.rank_fraction ? fmt_double(p.rank * 100) + "%" : fmt_double(p.rank),
                       p.outliers);
  }
  s += fmt::format(",kv={}", to_string(p.kv));
  if (p.index != IndexKind::none) {
    s += fmt::format(",keys_prerope={},budget={},sink={},local={},gqa={}", p.keys_prerope ? 1 : 0,
                     fmt_double(p.budget), p.sink, p.local,
                     p.gqa == GqaMode::shadowkv ? "shadowkv" : "mean");
    if (p.min_budget > 0) s += fmt::format(",min_budget={}", p.min_budget);
    if (p.reselect > 1) s += fmt::format(",reselect={}", p.reselect);
    if (p.rescore > 0) s += fmt::format(",rescore={}", p.rescore);
    if (p.cache != CacheMode::auto_) s += fmt::format(",cache={}", cache_mode_name(p.cache));
    if (p.prefill != PrefillMode::auto_) s += fmt::format(",prefill={}", prefill_mode_name(p.prefill));
    if (p.store != StoreMode::host) s += fmt::format(",store={}", store_mode_name(p.store));
  }
  return s;
}

void check_policy_fits_context(const PolicyConfig& p, int64_t n_ctx) {
  auto check = [&](const char* knob, int64_t tokens) {
    if (tokens > n_ctx)
      throw LimitError(fmt::format("kv policy: {}={} tokens exceeds the context of {} tokens", knob, tokens,
                                   n_ctx));
  };
  check("sink", p.sink);
  check("local", p.local);
  check("min_budget", p.min_budget);
  if (p.budget >= 1) check("budget", int64_t(p.budget));
  if (p.index != IndexKind::none && p.index != IndexKind::exact) check("chunk", p.chunk);
  if (p.outliers > 0) check("outliers (x chunk)", int64_t(p.outliers) * p.chunk);
  if (p.residual) check("m (x chunk)", int64_t(p.res_m) * p.chunk);
}

int64_t budget_tokens(const PolicyConfig& p, int64_t n_prompt) {
  if (p.budget <= 0) return 0;
  const int64_t b = p.budget >= 1 ? int64_t(p.budget)
                                  : std::max<int64_t>(1, int64_t(std::llround(p.budget * double(n_prompt))));
  return std::max<int64_t>(b, p.min_budget);
}

int resolved_rank(const PolicyConfig& p, int kv_width) {
  if (p.rank <= 0) return 0;
  int r = p.rank_fraction ? int(std::lround(p.rank * kv_width)) : int(p.rank);
  r = std::max(1, r);
  KVT_CHECK(r <= kv_width, "kv policy: rank {} exceeds the layer's KV width {}", r, kv_width);
  return r;
}

QuantSpec resolved_lm_spec(const QuantSpec& spec, int head_dim) {
  QuantSpec q = spec;
  if ((q.kind == QuantKind::higgs || q.kind == QuantKind::uniform || q.kind == QuantKind::binary) &&
      q.group > head_dim)
    q.group = head_dim;
  return q;
}

}  // namespace kvtier
