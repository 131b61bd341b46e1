// The definitions of the scalar casts: the nearest representable value found
// by looking at every code, ties to the even code, saturation at the largest
// finite magnitude. Slow on purpose; quant_scalar.h's bit tricks must agree.
#include <cmath>
#include <cstdint>

#include "ops/quant/quant_scalar.h"

namespace kvtier {
namespace {

// Nearest of the non-negative codes [0, n_code) of `decode` to |f|; ties to
// the even code. Magnitudes are increasing in the code.
template <class Decode>
uint8_t nearest_code(float a, int n_code, Decode decode) {
  int best = 0;
  double best_err = std::fabs(double(a) - double(decode(0)));
  for (int c = 1; c < n_code; ++c) {
    double err = std::fabs(double(a) - double(decode(uint8_t(c))));
    if (err < best_err || (err == best_err && (c & 1) == 0 && (best & 1) != 0)) {
      best = c;
      best_err = err;
    }
  }
  return uint8_t(best);
}

}  // namespace

uint8_t f32_to_e4m3_ref(float f) {
  uint8_t sign = std::signbit(f) ? 0x80 : 0;
  if (std::isnan(f)) return uint8_t(sign | 0x7f);
  float a = std::fabs(f);
  if (a >= kE4m3Max) return uint8_t(sign | 0x7e);
  return uint8_t(sign | nearest_code(a, 0x7f, e4m3_to_f32));  // 0x7f is NaN: excluded
}

uint8_t f32_to_e2m1_ref(float f) {
  uint8_t sign = std::signbit(f) ? 8 : 0;
  if (std::isnan(f)) return sign;
  float a = std::fabs(f);
  if (a >= kE2m1Max) return uint8_t(sign | 7);
  return uint8_t(sign | nearest_code(a, 8, e2m1_to_f32));
}

}  // namespace kvtier
