// Where a decode step's time goes, stage by stage, for benchmarks
// (`kvtier perf --stages`). Code that runs on an Exec calls stage(x, name)
// where a stage begins; the interval until the next mark (or stop) is charged
// to it. On CUDA the marks are timing events on the main stream, so a stage's
// time is the GPU time between them (work on the side stream overlaps and is
// not charged; with launch-bound work, launch gaps are). On the CPU, wall time.
// Off unless an Exec carries a clock: stage() is then one branch.
#pragma once
#include <string>
#include <utility>
#include <vector>

#include "backend/device.h"

namespace kvtier {

class StageClock {
 public:
  explicit StageClock(DeviceKind kind);
  ~StageClock();
  StageClock(const StageClock&) = delete;
  StageClock& operator=(const StageClock&) = delete;

  // Closes the open interval and opens one for `stage` (a string literal).
  void mark(const Exec& x, const char* stage);
  // Closes the open interval (idle time after it is not charged).
  void stop(const Exec& x);
  // Milliseconds per stage since the last reset, in order of first appearance
  // (waits for the device).
  std::vector<std::pair<std::string, double>> totals_ms();
  void reset();

 private:
  struct Mark {
    void* event = nullptr;       // CUDA
    double t = 0;                // CPU: seconds
    const char* stage = nullptr;  // null: a stop
  };
  void record(const Exec& x, const char* stage);
  void drain();  // adds the closed intervals to the totals, keeps the open one
  DeviceKind kind_;
  std::vector<void*> pool_;  // CUDA events, reused
  std::vector<Mark> marks_;
  std::vector<std::pair<std::string, double>> totals_;
};

inline void stage(const Exec& x, const char* name) {
  if (x.clock) x.clock->mark(x, name);
}
inline void stage_stop(const Exec& x) {
  if (x.clock) x.clock->stop(x);
}

}  // namespace kvtier
