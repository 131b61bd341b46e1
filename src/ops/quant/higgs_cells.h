// A bucket table that narrows the nearest-point search of a 2-D HIGGS grid
// (EDEN2-256 is HIGGS4, EDEN2-64 HIGGS3) from every point to the few that
// can win: the search the host tier's records spend most of their encoding
// time in.
//
// The square [lo, lo + n_side·cell)² is cut into n_side² cells. A cell lists,
// in increasing index, every grid point c whose least squared distance to
// the cell is at most the least, over the grid, of the greatest squared
// distance to the cell, plus a slack. The nearest point to any u in the cell
// passes that test; the slack covers the f32 rounding of the search's scores
// (u·c − ‖c‖²/2) and of the cell index, so the listed points hold every f32
// argmax, and the first largest among them is the full search's first
// largest: the codes do not change. A u outside the square (or NaN) is
// searched over every point.
//
// Packed as 32-bit words, the form the device reads (quant_dev_higgs.cuh):
//   [0] n_side  [1] lo (f32 bits)  [2] 1/cell (f32 bits)  [3] candidates
//   [4, 4 + n_side² + 1) where each cell's candidates start, in row-major
//   cell order (the cell of u is ⌊(u₁ − lo)/cell⌋·n_side + ⌊(u₀ − lo)/cell⌋),
//   and one more word, where the last cell's candidates end; then the candidates'
//   point indices, cell after cell.
#pragma once
#include <cstdint>
#include <vector>

namespace kvtier {

constexpr int kCellsHeaderWords = 4;

// The table for a grid of n points in 2 dimensions (points: [n, 2] f32,
// half_norm2: [n] f32, the ‖c‖²/2 the search subtracts). Empty for d ≠ 2
// and for grids of more than 4096 points.
std::vector<uint32_t> make_higgs_cells(const float* points, const float* half_norm2, int n, int d);

}  // namespace kvtier
