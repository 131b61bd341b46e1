// SVG plot of bench summaries against GPU KV bytes per token: per task, a
// panel of the score and, when the records have them, panels of top-1
// agreement with full attention and of KL(full ‖ policy); one line per policy
// family, 95 % bootstrap intervals as error bars.
#pragma once
#include <string>
#include <vector>

#include "bench/bench_report.h"

namespace kvtier::bench {

// Each point pools a policy's samples over the task's context lengths. x: GPU
// KV bytes per token (log scale when it spans more than 10x).
std::string score_vs_memory_svg(const std::vector<SummaryRow>& rows);

}  // namespace kvtier::bench
