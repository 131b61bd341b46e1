// Intrinsics for the AVX-512 kernels (*_avx512.cpp): the compiler's own, the
// translation unit being compiled with -mavx512f/bw/vl/vnni; or, when
// KVT_EMULATE_AVX512 is defined, SIMDe's portable implementations of the same
// intrinsics (a test-only second build of those files, so that machines
// without AVX-512, CI's included, run the AVX-512 kernels' code and compare it
// with the references). KVT_AVX512_NAME gives the emulated build's functions
// their own names (row_avx512 → row_avx512_emulated).
#pragma once
#if defined(KVT_EMULATE_AVX512)
#define SIMDE_ENABLE_NATIVE_ALIASES
#include <simde/x86/avx512.h>
#define KVT_AVX512_NAME(name) name##_emulated
#else
#include <immintrin.h>
// GCC 12's _mm512_cvtph_ps and _mm512_castsi256_si512 pass an undefined
// vector through a builtin, which -W(maybe-)uninitialized reports (header
// false positives).
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#define KVT_AVX512_NAME(name) name
#endif
