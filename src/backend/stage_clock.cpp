// StageClock: marks kept until the pool fills (or totals are asked for), then
// their differences are summed per stage.
#include "backend/stage_clock.h"

#include <chrono>
#include <utility>

#include "backend/device_cuda.h"

namespace kvtier {
namespace {
constexpr size_t kPool = 4096;  // marks in flight before a drain waits for the device
}

StageClock::StageClock(DeviceKind kind) : kind_(kind) {}

StageClock::~StageClock() {
  for (void* e : pool_) cuda_dev::event_destroy(e);
}

void StageClock::record(const Exec& x, const char* stage) {
  if (marks_.size() == kPool) drain();
  Mark m;
  m.stage = stage;
  if (kind_ == DeviceKind::cuda) {
    if (pool_.size() <= marks_.size()) pool_.push_back(cuda_dev::event_create());
    m.event = pool_[marks_.size()];
    cuda_dev::event_record(x, m.event);
  } else {
    m.t = std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
  }
  marks_.push_back(m);
}

void StageClock::mark(const Exec& x, const char* stage) { record(x, stage); }

void StageClock::stop(const Exec& x) {
  if (!marks_.empty() && marks_.back().stage) record(x, nullptr);
}

void StageClock::drain() {
  if (marks_.size() < 2) return;
  if (kind_ == DeviceKind::cuda) cuda_dev::event_sync(marks_.back().event);
  for (size_t i = 0; i + 1 < marks_.size(); ++i) {
    const Mark& a = marks_[i];
    if (!a.stage) continue;
    const double ms = kind_ == DeviceKind::cuda ? double(cuda_dev::event_ms(a.event, marks_[i + 1].event))
                                                 : 1e3 * (marks_[i + 1].t - a.t);
    auto it = totals_.begin();
    while (it != totals_.end() && it->first != a.stage) ++it;
    if (it == totals_.end()) totals_.emplace_back(a.stage, ms);
    else it->second += ms;
  }
  // The last mark opens the next interval: keep it (its event moves to slot 0).
  Mark last = marks_.back();
  if (kind_ == DeviceKind::cuda) {
    std::swap(pool_[0], pool_[marks_.size() - 1]);
    last.event = pool_[0];
  }
  marks_.assign(1, last);
}

std::vector<std::pair<std::string, double>> StageClock::totals_ms() {
  drain();
  return totals_;
}

void StageClock::reset() {
  drain();
  totals_.clear();
  if (!marks_.empty() && marks_.back().stage) marks_.back().stage = nullptr;  // the open interval is dropped
}

}  // namespace kvtier
