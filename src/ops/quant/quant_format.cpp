// Spec strings, validation and exact byte accounting of the quantizers.
#include "ops/quant/quant_format.h"

#include <charconv>
#include <cmath>
#include <string_view>
#include <vector>

#include "core/status.h"
#include "ops/quant/hadamard.h"

namespace kvtier {
namespace {

struct HiggsDefault {
  const char* bits;  // as written in the spec string
  int d, n;
};
// Bits per coordinate → grid (SPEC; bits = log2(n)/d).
constexpr HiggsDefault kHiggsDefaults[] = {
    {"4", 2, 256}, {"3", 2, 64}, {"2", 4, 256}, {"1", 8, 256}, {"0.5", 8, 16}};

bool parse_int(std::string_view s, int64_t& v) {
  if (s.empty()) return false;
  auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  return ec == std::errc() && p == s.data() + s.size();
}

int code_bits(int n) {  // ceil(log2 n)
  int b = 0;
  while ((1 << b) < n) ++b;
  return b;
}

const char* kind_name(QuantKind k) {
  switch (k) {
    case QuantKind::f32: return "f32";
    case QuantKind::bf16: return "bf16";
    case QuantKind::fp8: return "fp8";
    case QuantKind::fp8_scaled: return "fp8s";
    case QuantKind::nvfp4: return "nvfp4";
    case QuantKind::uniform: return "int";
    case QuantKind::binary: return "1bit";
    case QuantKind::higgs: return "higgs";
  }
  return "?";
}

}  // namespace

QuantSpec parse_quant_spec(const std::string& text) {
  const char* grammar =
      "expected f32|bf16|fp8|fp8s|nvfp4|int<1..8>|1bit|higgs<4|3|2|1|0.5>|higgs, then options "
      ":g<N> (int/higgs), :EDEN<d>-<n> or :U<n> (higgs), :rs[<seed>] (higgs), e.g. \"higgs2:g128\"";
  std::vector<std::string_view> parts;
  std::string_view rest(text);
  while (true) {
    size_t colon = rest.find(':');
    parts.push_back(rest.substr(0, colon));
    if (colon == std::string_view::npos) break;
    rest.remove_prefix(colon + 1);
  }
  std::string_view base = parts[0];
  QuantSpec s;
  bool higgs_bits_given = false;
  if (base == "f32") {
    s.kind = QuantKind::f32, s.bits = 32;
  } else if (base == "bf16") {
    s.kind = QuantKind::bf16, s.bits = 16;
  } else if (base == "fp8") {
    s.kind = QuantKind::fp8, s.bits = 8;
  } else if (base == "fp8s") {
    s.kind = QuantKind::fp8_scaled, s.bits = 8;
  } else if (base == "nvfp4") {
    s.kind = QuantKind::nvfp4, s.bits = 4;
  } else if (base == "1bit") {
    s.kind = QuantKind::binary, s.bits = 1;
  } else if (base.starts_with("int")) {
    int64_t b = 0;
    if (!parse_int(base.substr(3), b) || b < 1 || b > 8)
      fail("quant spec \"{}\": \"{}\" is not int1..int8; {}", text, base, grammar);
    s.kind = QuantKind::uniform, s.bits = int(b);
  } else if (base.starts_with("higgs")) {
    s.kind = QuantKind::higgs, s.bits = 0;
    std::string_view bits = base.substr(5);
    if (!bits.empty()) {
      bool found = false;
      for (const HiggsDefault& h : kHiggsDefaults) {
        if (bits == h.bits) s.grid_dim = h.d, s.grid_size = h.n, found = true;
      }
      if (!found)
        fail("quant spec \"{}\": HIGGS bit width \"{}\" has no default grid (4, 3, 2, 1 or 0.5; "
             "or \"higgs:EDEN<d>-<n>\")", text, bits);
      higgs_bits_given = true;
    }
  } else {
    fail("quant spec \"{}\": unknown format \"{}\"; {}", text, base, grammar);
  }

  for (size_t i = 1; i < parts.size(); ++i) {
    std::string_view opt = parts[i];
    int64_t v = 0;
    if (opt.starts_with("EDEN")) {
      KVT_CHECK(s.kind == QuantKind::higgs, "quant spec \"{}\": option \"{}\" is for higgs only", text, opt);
      KVT_CHECK(!higgs_bits_given, "quant spec \"{}\": give either a bit width or \"{}\", not both "
                "(write \"higgs:{}\")", text, opt, opt);
      std::string_view dn = opt.substr(4);
      size_t dash = dn.find('-');
      int64_t d = 0, n = 0;
      if (dash == std::string_view::npos || !parse_int(dn.substr(0, dash), d) ||
          !parse_int(dn.substr(dash + 1), n) || d < 1 || d > 64 || n < 2 || n > 65536)
        fail("quant spec \"{}\": grid \"{}\" is not EDEN<d>-<n> with d in 1..64, n in 2..65536", text, opt);
      s.grid_dim = int(d), s.grid_size = int(n);
      higgs_bits_given = true;
    } else if (opt.starts_with("U")) {
      KVT_CHECK(s.kind == QuantKind::higgs, "quant spec \"{}\": option \"{}\" is for higgs only", text, opt);
      KVT_CHECK(!higgs_bits_given, "quant spec \"{}\": give either a bit width or \"{}\", not both "
                "(write \"higgs:{}\")", text, opt, opt);
      if (!parse_int(opt.substr(1), v) || (v != 2 && v != 4 && v != 8 && v != 16))
        fail("quant spec \"{}\": grid \"{}\" is not U<n> with n in 2, 4, 8, 16", text, opt);
      s.grid_dim = 1, s.grid_size = int(v), s.uniform_levels = true;
      higgs_bits_given = true;
    } else if (opt.starts_with("rs")) {
      KVT_CHECK(s.kind == QuantKind::higgs, "quant spec \"{}\": option \"{}\" is for higgs only", text, opt);
      s.random_signs = true;
      if (opt.size() > 2) {
        KVT_CHECK(parse_int(opt.substr(2), v) && v >= 0, "quant spec \"{}\": bad sign seed in \"{}\"", text, opt);
        s.sign_seed = uint64_t(v);
      }
    } else if (opt.starts_with("g")) {
      KVT_CHECK(s.kind == QuantKind::uniform || s.kind == QuantKind::binary || s.kind == QuantKind::higgs,
                "quant spec \"{}\": option \"{}\": only int/1bit/higgs take a group size", text, opt);
      KVT_CHECK(parse_int(opt.substr(1), v) && v >= 1 && v <= (1 << 20),
                "quant spec \"{}\": bad group size \"{}\" (expected g<N>, N >= 1)", text, opt);
      if (s.kind == QuantKind::higgs)
        KVT_CHECK(is_power_of_two(v), "quant spec \"{}\": HIGGS group {} is not a power of two", text, v);
      s.group = int(v);
    } else {
      fail("quant spec \"{}\": unknown option \"{}\"; {}", text, opt, grammar);
    }
  }
  if (s.kind == QuantKind::higgs) {
    KVT_CHECK(higgs_bits_given, "quant spec \"{}\": higgs needs a bit width (higgs2) or a grid "
              "(higgs:EDEN4-256)", text);
    if (s.group != 0)
      KVT_CHECK(s.group % s.grid_dim == 0, "quant spec \"{}\": HIGGS group {} is not a multiple of the "
                "grid dimension {}", text, s.group, s.grid_dim);
  }
  return s;
}

std::string to_string(const QuantSpec& s) {
  std::string out;
  if (s.kind == QuantKind::uniform) {
    out = fmt::format("int{}", s.bits);
  } else if (s.kind == QuantKind::higgs) {
    out = fmt::format("higgs:EDEN{}-{}", s.grid_dim, s.grid_size);
    for (const HiggsDefault& h : kHiggsDefaults)
      if (h.d == s.grid_dim && h.n == s.grid_size) out = fmt::format("higgs{}", h.bits);
    if (s.uniform_levels) out = fmt::format("higgs:U{}", s.grid_size);
  } else {
    out = kind_name(s.kind);
  }
  if (s.group != 0) out += fmt::format(":g{}", s.group);
  if (s.kind == QuantKind::higgs && s.random_signs)
    out += s.sign_seed == QuantSpec{}.sign_seed ? std::string(":rs") : fmt::format(":rs{}", s.sign_seed);
  return out;
}

int resolved_group(const QuantSpec& s, int dim) {
  if (s.kind == QuantKind::uniform || s.kind == QuantKind::binary) return s.group ? s.group : dim;
  if (s.kind == QuantKind::higgs) {
    if (s.group) return s.group;
    return dim > 0 ? int(int64_t(dim) & -int64_t(dim)) : dim;  // largest power of two dividing dim
  }
  return dim;
}

void validate(const QuantSpec& s, int dim) {
  KVT_CHECK(dim >= 1, "quantizer {}: vector dimension {} (expected >= 1)", to_string(s), dim);
  int g = resolved_group(s, dim);
  switch (s.kind) {
    case QuantKind::f32:
    case QuantKind::bf16:
    case QuantKind::fp8:
    case QuantKind::fp8_scaled:
      return;
    case QuantKind::nvfp4:
      KVT_CHECK(dim % 16 == 0, "quantizer nvfp4: vector dimension {} is not a multiple of the block 16", dim);
      KVT_CHECK(std::isfinite(s.tensor_scale) && s.tensor_scale > 0,
                "quantizer nvfp4: per-tensor scale {} (expected finite > 0)", s.tensor_scale);
      return;
    case QuantKind::uniform:
    case QuantKind::binary:
      KVT_CHECK(s.bits >= 1 && s.bits <= 8, "quantizer {}: {} bits (expected 1..8)", to_string(s), s.bits);
      KVT_CHECK(dim % g == 0, "quantizer {}: vector dimension {} is not a multiple of the group {}",
                to_string(s), dim, g);
      return;
    case QuantKind::higgs:
      KVT_CHECK(s.grid_dim >= 1 && s.grid_size >= 2 && s.grid_size <= 65536,
                "quantizer {}: grid EDEN{}-{} (expected d >= 1, 2 <= n <= 65536)", to_string(s),
                s.grid_dim, s.grid_size);
      KVT_CHECK(is_power_of_two(g), "quantizer {}: Hadamard group {} is not a power of two", to_string(s), g);
      KVT_CHECK(dim % g == 0, "quantizer {}: vector dimension {} is not a multiple of the Hadamard group {}",
                to_string(s), dim, g);
      KVT_CHECK(g % s.grid_dim == 0, "quantizer {}: Hadamard group {} is not a multiple of the grid "
                "dimension {}", to_string(s), g, s.grid_dim);
      return;
  }
  fail("quantizer: unknown kind {}", int(s.kind));
}

size_t bytes_per_vector(const QuantSpec& s, int dim) {
  validate(s, dim);
  size_t n = size_t(dim);
  int g = resolved_group(s, dim);
  size_t n_group = n / size_t(g);
  switch (s.kind) {
    case QuantKind::f32: return 4 * n;
    case QuantKind::bf16: return 2 * n;
    case QuantKind::fp8: return n;
    case QuantKind::fp8_scaled: return n + 4;                  // + f32 scale
    case QuantKind::nvfp4: return n / 2 + n / 16;              // + 4 B per tensor, held outside
    case QuantKind::uniform:                                   // + bf16 min, bf16 step per group
    case QuantKind::binary:
      return n_group * ((size_t(g) * size_t(s.bits) + 7) / 8 + 4);
    case QuantKind::higgs: {                                   // + bf16 scale per group
      size_t n_sub = size_t(g / s.grid_dim);
      return n_group * ((n_sub * size_t(code_bits(s.grid_size)) + 7) / 8 + 2);
    }
  }
  return 0;
}

size_t tensor_constant_bytes(const QuantSpec& s) { return s.kind == QuantKind::nvfp4 ? 4 : 0; }

double bits_per_value(const QuantSpec& s, int dim) {
  return 8.0 * double(bytes_per_vector(s, dim)) / double(dim);
}

float nvfp4_tensor_scale(const float* x, int64_t n) {
  float amax = 0;
  for (int64_t i = 0; i < n; ++i) amax = std::max(amax, std::fabs(x[i]));
  KVT_CHECK(std::isfinite(amax), "nvfp4_tensor_scale: non-finite value among {} inputs", n);
  return amax > 0 ? amax / (448.0f * 6.0f) : 1.0f;
}

void score(const QuantSpec& spec, const float* q, const uint8_t* codes, int64_t n_vec, int dim,
           float* scores) {
  ScoreParams p;
  p.q = q;
  p.n_q = 1;
  p.codes = codes;
  p.n_vec = n_vec;
  p.dim = dim;
  p.scores = scores;
  score(spec, p);
}

bool same_format(const QuantSpec& a, const QuantSpec& b) {
  return a.kind == b.kind && a.bits == b.bits && a.group == b.group && a.grid_dim == b.grid_dim &&
         a.grid_size == b.grid_size && a.uniform_levels == b.uniform_levels && a.random_signs == b.random_signs &&
         (!a.random_signs || a.sign_seed == b.sign_seed);
}

}  // namespace kvtier
