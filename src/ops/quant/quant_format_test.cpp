// Spec strings (round trip, errors) and the exact byte accounting.
#include <gtest/gtest.h>

#include <string>

#include "core/status.h"
#include "ops/quant/quant_format.h"

namespace kvtier {
namespace {

TEST(QuantFormat, ParseAndCanonicalString) {
  struct Case {
    const char* text;
    const char* canonical;
    QuantKind kind;
  };
  for (const Case& c : {Case{"f32", "f32", QuantKind::f32}, Case{"bf16", "bf16", QuantKind::bf16},
                        Case{"fp8", "fp8", QuantKind::fp8}, Case{"fp8s", "fp8s", QuantKind::fp8_scaled},
                        Case{"nvfp4", "nvfp4", QuantKind::nvfp4}, Case{"int4", "int4", QuantKind::uniform},
                        Case{"int2:g64", "int2:g64", QuantKind::uniform}, Case{"1bit", "1bit", QuantKind::binary},
                        Case{"1bit:g32", "1bit:g32", QuantKind::binary}, Case{"int1", "int1", QuantKind::uniform}, Case{"higgs2", "higgs2", QuantKind::higgs},
                        Case{"higgs4:g128", "higgs4:g128", QuantKind::higgs},
                        Case{"higgs:EDEN4-256:g128", "higgs2:g128", QuantKind::higgs},
                        Case{"higgs:EDEN8-4096", "higgs:EDEN8-4096", QuantKind::higgs},
                        Case{"higgs0.5:g64:rs", "higgs0.5:g64:rs", QuantKind::higgs},
                        Case{"higgs3:rs9", "higgs3:rs9", QuantKind::higgs}}) {
    QuantSpec s = parse_quant_spec(c.text);
    EXPECT_EQ(s.kind, c.kind) << c.text;
    EXPECT_EQ(to_string(s), c.canonical) << c.text;
    EXPECT_EQ(to_string(parse_quant_spec(to_string(s))), c.canonical) << c.text;
  }
  QuantSpec h = parse_quant_spec("higgs1:g256");
  EXPECT_EQ(h.grid_dim, 8);
  EXPECT_EQ(h.grid_size, 256);
  EXPECT_EQ(h.group, 256);
  EXPECT_FALSE(h.random_signs);
  EXPECT_EQ(parse_quant_spec("int3:g32").bits, 3);
}

TEST(QuantFormat, ParseErrorsNameTheProblem) {
  auto message = [](const char* text) {
    try {
      parse_quant_spec(text);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("(no error)");
  };
  EXPECT_NE(message("").find("unknown format"), std::string::npos);
  EXPECT_NE(message("fp16").find("unknown format \"fp16\""), std::string::npos);
  EXPECT_NE(message("int9").find("int1..int8"), std::string::npos);
  EXPECT_NE(message("int0").find("int1..int8"), std::string::npos);
  EXPECT_NE(message("higgs5").find("no default grid"), std::string::npos);
  EXPECT_NE(message("higgs").find("needs a bit width"), std::string::npos);
  EXPECT_NE(message("higgs2:g100").find("not a power of two"), std::string::npos);
  EXPECT_NE(message("higgs2:g2").find("not a multiple of the grid dimension 4"), std::string::npos);
  EXPECT_NE(message("higgs2:EDEN4-256").find("not both"), std::string::npos);
  EXPECT_NE(message("higgs:EDEN4").find("EDEN<d>-<n>"), std::string::npos);
  EXPECT_NE(message("fp8:g32").find("group size"), std::string::npos);
  EXPECT_NE(message("int4:g").find("bad group size"), std::string::npos);
  EXPECT_NE(message("int4:rs").find("higgs only"), std::string::npos);
  EXPECT_NE(message("bf16:x").find("unknown option \"x\""), std::string::npos);
}

TEST(QuantFormat, BytesPerVector) {
  struct Case {
    const char* spec;
    int dim;
    size_t bytes;
  };
  for (const Case& c : {
           Case{"f32", 128, 512}, Case{"bf16", 128, 256}, Case{"fp8", 128, 128},
           Case{"fp8s", 128, 132},                          // + f32 scale
           Case{"nvfp4", 128, 64 + 8},                      // E2M1 pairs + E4M3 block scales
           Case{"int8", 128, 128 + 4}, Case{"int4", 128, 64 + 4}, Case{"int2:g64", 128, 2 * (16 + 4)},
           Case{"1bit", 128, 16 + 4}, Case{"int1:g64", 128, 2 * (8 + 4)}, Case{"int3:g32", 128, 4 * (12 + 4)},
           Case{"higgs2:g128", 128, 34},                    // SPEC: 2-bit landmark, one bf16 scale per head
           Case{"higgs2", 128, 34}, Case{"higgs4:g128", 128, 66}, Case{"higgs3:g128", 128, 48 + 2},
           Case{"higgs1:g128", 128, 16 + 2}, Case{"higgs0.5:g128", 128, 8 + 2},
           Case{"higgs4:g1024", 1024, 514},                 // host KV: group = all KV dims of the layer
           Case{"higgs2:g64", 128, 2 * (16 + 2)}, Case{"higgs:EDEN8-4096:g64", 128, 2 * (12 + 2)},
           Case{"higgs4", 192, 3 * (32 + 2)},               // 192 = 3·64: default group 64
       }) {
    EXPECT_EQ(bytes_per_vector(parse_quant_spec(c.spec), c.dim), c.bytes) << c.spec << " dim " << c.dim;
  }
  // SPEC: Llama-3.1-8B, 32 layers × 8 KV heads × 34 B = 8704 B per token.
  EXPECT_EQ(32 * 8 * bytes_per_vector(parse_quant_spec("higgs2:g128"), 128), 8704u);
  EXPECT_EQ(tensor_constant_bytes(parse_quant_spec("nvfp4")), 4u);
  EXPECT_EQ(tensor_constant_bytes(parse_quant_spec("higgs2")), 0u);
  EXPECT_DOUBLE_EQ(bits_per_value(parse_quant_spec("higgs2:g128"), 128), 34 * 8 / 128.0);
}

TEST(QuantFormat, DimensionMismatchesThrow) {
  EXPECT_THROW(bytes_per_vector(parse_quant_spec("nvfp4"), 24), Error);
  EXPECT_THROW(bytes_per_vector(parse_quant_spec("int4:g48"), 128), Error);
  EXPECT_THROW(bytes_per_vector(parse_quant_spec("higgs2:g128"), 192), Error);
  EXPECT_THROW(bytes_per_vector(parse_quant_spec("higgs:EDEN6-4096"), 128), Error);  // 6 ∤ 128
  EXPECT_THROW(bytes_per_vector(parse_quant_spec("bf16"), 0), Error);
  QuantSpec s = parse_quant_spec("nvfp4");
  s.tensor_scale = 0;
  EXPECT_THROW(bytes_per_vector(s, 128), Error);
}

}  // namespace
}  // namespace kvtier
