// What the CPU (and the OS) let the hot kernels use, detected once: CPUID
// feature bits, the register state the OS saves (XGETBV), and for AMX the
// tile-data permission Linux grants per process (arch_prctl).
//
// The binary is compiled for x86-64-v3 (AVX2, FMA, F16C); kernels that need
// more live in translation units compiled with their own target flags and are
// chosen through cpu_path() once, at their first call. The path can be capped
// (set_cpu_path_limit, `--cpu-isa`) to compare paths on one machine.
#pragma once
#include <string>

namespace kvtier {

struct CpuFeatures {
  // CPUID bits, each also requiring the OS to save the registers it uses.
  bool avx2 = false, fma = false, f16c = false;
  bool avx512f = false, avx512bw = false, avx512vl = false, avx512dq = false;
  bool avx512vnni = false, avx512bf16 = false;
  bool avx_vnni = false;  // VEX-encoded VNNI (256-bit)
  bool amx_tile = false, amx_int8 = false, amx_bf16 = false;
  // Linux granted this process the AMX tile data state (ARCH_REQ_XCOMP_PERM);
  // false where the kernel refuses or predates it.
  bool amx_permitted = false;
  std::string vendor;  // "GenuineIntel", "AuthenticAMD", ...
  std::string brand;   // the processor's brand string
};

// Detected once (thread-safe); the AMX permission is requested then too.
const CpuFeatures& cpu_features();

// Kernel paths, narrowest first.
enum class CpuPath {
  avx2,    // x86-64-v3: AVX2 + FMA + F16C (the baseline)
  avx512,  // AVX-512 F/BW/VL + VNNI (512-bit int8 dot products, 16-wide f32)
};

// The widest path the CPU supports, capped by set_cpu_path_limit.
CpuPath cpu_path();
// The widest path the CPU supports.
CpuPath cpu_best_path();
bool cpu_supports(CpuPath path);
// Caps cpu_path() (e.g. avx2 on an AVX-512 machine, to compare the two).
// Kernels read cpu_path() at each call, so a cap applies from the next call.
void set_cpu_path_limit(CpuPath limit);

const char* cpu_path_name(CpuPath path);
// Parses "avx2" / "avx512" / "auto" (the best); throws kvtier::Error otherwise.
CpuPath parse_cpu_path(const std::string& name);

// One line per fact: the CPU, its features, the path chosen per kernel family.
std::string cpu_features_report();

}  // namespace kvtier
