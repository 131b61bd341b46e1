#include "core/cpu_features.h"

#include <fmt/format.h>

#include <atomic>
#include <cstring>

#include "core/status.h"

#if defined(__x86_64__)
#include <cpuid.h>
#include <sys/syscall.h>
#include <unistd.h>
#endif

namespace kvtier {
namespace {

#if defined(__x86_64__)
struct Regs {
  unsigned a = 0, b = 0, c = 0, d = 0;
};

Regs cpuid(unsigned leaf, unsigned sub) {
  Regs r;
  __cpuid_count(leaf, sub, r.a, r.b, r.c, r.d);
  return r;
}

// XCR0: which register states the OS saves on a context switch.
unsigned long long xgetbv0() {
  unsigned lo, hi;
  __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
  return (static_cast<unsigned long long>(hi) << 32) | lo;
}

bool bit(unsigned reg, int i) { return (reg >> i) & 1u; }

// Linux ≥ 5.16 hands out the AMX tile data state only on request
// (Documentation/arch/x86/xstate.rst); before that the call fails and the
// tiles must not be touched.
bool request_amx_permission() {
  constexpr int kArchReqXcompPerm = 0x1023;
  constexpr int kXfeatureXtiledata = 18;
  return syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) == 0;
}

CpuFeatures detect() {
  CpuFeatures f;
  const Regs r0 = cpuid(0, 0);
  const unsigned max_leaf = r0.a;
  char vendor[13] = {};
  std::memcpy(vendor, &r0.b, 4);
  std::memcpy(vendor + 4, &r0.d, 4);
  std::memcpy(vendor + 8, &r0.c, 4);
  f.vendor = vendor;
  if (cpuid(0x80000000u, 0).a >= 0x80000004u) {
    char brand[49] = {};
    for (unsigned i = 0; i < 3; ++i) {
      const Regs r = cpuid(0x80000002u + i, 0);
      std::memcpy(brand + 16 * i, &r, 16);
    }
    f.brand = brand;
    const size_t b = f.brand.find_first_not_of(' ');
    f.brand = b == std::string::npos ? "" : f.brand.substr(b);
  }
  if (max_leaf < 7) return f;
  const Regs r1 = cpuid(1, 0);
  const bool osxsave = bit(r1.c, 27);
  const unsigned long long xcr0 = osxsave ? xgetbv0() : 0;
  const bool os_avx = (xcr0 & 0x6) == 0x6;             // XMM | YMM
  const bool os_avx512 = os_avx && (xcr0 & 0xe0) == 0xe0;  // opmask | ZMM_Hi256 | Hi16_ZMM
  const bool os_amx = (xcr0 & 0x60000) == 0x60000;     // XTILECFG | XTILEDATA
  const Regs r7 = cpuid(7, 0);
  const Regs r7_1 = cpuid(7, 1);
  f.fma = os_avx && bit(r1.c, 12);
  f.f16c = os_avx && bit(r1.c, 29);
  f.avx2 = os_avx && bit(r7.b, 5);
  f.avx512f = os_avx512 && bit(r7.b, 16);
  f.avx512dq = os_avx512 && bit(r7.b, 17);
  f.avx512bw = os_avx512 && bit(r7.b, 30);
  f.avx512vl = os_avx512 && bit(r7.b, 31);
  f.avx512vnni = os_avx512 && bit(r7.c, 11);
  f.avx512bf16 = os_avx512 && bit(r7_1.a, 5);
  f.avx_vnni = os_avx && bit(r7_1.a, 4);
  f.amx_bf16 = os_amx && bit(r7.d, 22);
  f.amx_tile = os_amx && bit(r7.d, 24);
  f.amx_int8 = os_amx && bit(r7.d, 25);
  if (f.amx_tile) f.amx_permitted = request_amx_permission();
  return f;
}
#else
CpuFeatures detect() { return CpuFeatures{}; }
#endif

std::atomic<int> g_limit{int(CpuPath::avx512)};

}  // namespace

const CpuFeatures& cpu_features() {
  static const CpuFeatures f = detect();
  return f;
}

bool cpu_supports(CpuPath path) {
  const CpuFeatures& f = cpu_features();
  const bool avx2 = f.avx2 && f.fma && f.f16c;
  switch (path) {
    case CpuPath::avx2: return avx2;
    case CpuPath::avx512: return avx2 && f.avx512f && f.avx512bw && f.avx512vl && f.avx512vnni;
  }
  return false;
}

CpuPath cpu_best_path() {
  static const CpuPath best = cpu_supports(CpuPath::avx512) ? CpuPath::avx512 : CpuPath::avx2;
  return best;
}

CpuPath cpu_path() {
  const int best = int(cpu_best_path()), limit = g_limit.load(std::memory_order_relaxed);
  return CpuPath(best < limit ? best : limit);
}

void set_cpu_path_limit(CpuPath limit) { g_limit.store(int(limit), std::memory_order_relaxed); }

const char* cpu_path_name(CpuPath path) {
  switch (path) {
    case CpuPath::avx2: return "avx2";
    case CpuPath::avx512: return "avx512";
  }
  return "?";
}

CpuPath parse_cpu_path(const std::string& name) {
  if (name == "auto") return cpu_best_path();
  if (name == "avx2") return CpuPath::avx2;
  if (name == "avx512") return CpuPath::avx512;
  fail("cpu isa '{}': expected auto, avx2 or avx512", name);
}

std::string cpu_features_report() {
  const CpuFeatures& f = cpu_features();
  std::string have;
  auto add = [&](bool on, const char* name) {
    if (on) have += have.empty() ? name : fmt::format(" {}", name);
  };
  add(f.avx2, "avx2");
  add(f.fma, "fma");
  add(f.f16c, "f16c");
  add(f.avx_vnni, "avx-vnni");
  add(f.avx512f, "avx512f");
  add(f.avx512bw, "avx512bw");
  add(f.avx512vl, "avx512vl");
  add(f.avx512dq, "avx512dq");
  add(f.avx512vnni, "avx512vnni");
  add(f.avx512bf16, "avx512bf16");
  add(f.amx_tile, "amx-tile");
  add(f.amx_int8, "amx-int8");
  add(f.amx_bf16, "amx-bf16");
  const CpuPath p = cpu_path();
  std::string s;
  s += fmt::format("cpu              {} ({})\n", f.brand.empty() ? "unknown" : f.brand, f.vendor);
  s += fmt::format("cpu features     {}\n", have.empty() ? "none of the tracked ones" : have);
  s += fmt::format("amx tiles        {}\n",
                   !f.amx_tile        ? "not present"
                   : f.amx_permitted ? "granted by the OS (no kernel uses them yet)"
                                     : "present, refused by the OS (not used)");
  s += fmt::format("kernel path      {}{}\n", cpu_path_name(p),
                   p != cpu_best_path() ? fmt::format(" (capped; the CPU has {})", cpu_path_name(cpu_best_path()))
                                        : std::string());
  if (p == CpuPath::avx512) {
    s += "  matmul         avx512-vnni: Q4_0/Q4_1/Q8_0 x Q8 activations, vpdpbusd on 512-bit vectors\n";
    s += "  attention      avx512: bf16/fp8 K/V read in place, 16-wide f32 dot products and accumulation\n";
  } else {
    s += "  matmul         avx2: Q4_0/Q4_1/Q8_0 x Q8 activations, vpmaddubsw + vpmaddwd\n";
    s += "  attention      avx2: bf16/fp8 K/V read in place, 8-wide f32 dot products and accumulation\n";
  }
  return s;
}

}  // namespace kvtier
