// fetch_rows on the CPU: the slot cache persists across steps as on the GPU.
// A token selected again keeps its slot and its decoded K|V (it is not read
// from the host tier again); only misses are decoded, into free slots.
#include <gtest/gtest.h>

#include <algorithm>
#include <random>

#include "core/half.h"
#include "ops/gather/fetch.h"
#include "ops/kv_append/kv_write.h"
#include "ops/quant/quant_scalar.h"

namespace kvtier {
namespace {

TEST(AssignSlots, HeldTokensKeepTheirSlotsAndMissesTakeTheFreeOnesInOrder) {
  const int k = 5;
  std::vector<int32_t> prev{-1, 3, 7, 9, 12}, prev_slot{-1, 4, 0, 2, 1}, slot_of(k), miss;
  const std::vector<int32_t> now{2, 3, 8, 12, 20};
  EXPECT_EQ(assign_slots(now.data(), k, prev.data(), prev_slot.data(), slot_of.data(), &miss), 5);
  // 3 and 12 keep slots 4 and 1; 2, 8, 20 take the free 0, 2, 3 in order.
  EXPECT_EQ(slot_of, (std::vector<int32_t>{0, 4, 2, 1, 3}));
  EXPECT_EQ(miss, (std::vector<int32_t>{0, 2, 4}));
  EXPECT_EQ(prev, now);
  EXPECT_EQ(prev_slot, slot_of);
  const std::vector<int32_t> next{-1, -1, 3, 8, 30};
  EXPECT_EQ(assign_slots(next.data(), k, prev.data(), prev_slot.data(), slot_of.data(), &miss), 3);
  EXPECT_EQ(slot_of, (std::vector<int32_t>{-1, -1, 4, 2, 0}));
  EXPECT_EQ(miss, (std::vector<int32_t>{4}));
}

TEST(FetchCpu, DecodesOnlyTheMissesAndHitsKeepTheirDecodedValues) {
  const int H = 2, D = 64, W = H * D, n_tok = 64, K = 12;
  const QuantSpec spec = parse_quant_spec("higgs4:g64");
  std::mt19937 rng(5);
  std::normal_distribution<float> nd(0.f, 1.f);
  std::vector<float> k(size_t(n_tok) * W), v(k.size());
  for (float& a : k) a = bf16_to_f32(f32_to_bf16(nd(rng)));
  for (float& a : v) a = bf16_to_f32(f32_to_bf16(nd(rng)));
  HostWriteParams hp;
  hp.n_seq = 1;
  hp.n_new = n_tok;
  hp.n_kv_head = H;
  hp.head_dim = D;
  hp.fmt = RecordFormat{spec, D, int64_t(bytes_per_vector(spec, D))};
  hp.entry_bytes = (2 * hp.fmt.bytes + 15) / 16 * 16;
  hp.tok_bytes = H * hp.entry_bytes;
  hp.in_tok_stride = W;
  std::vector<uint8_t> host(size_t(n_tok) * hp.tok_bytes, 0), kplane(host.size(), 0);
  uint8_t* hrow = host.data();
  uint8_t* krow = kplane.data();
  const int64_t pos0 = 0, key_first = -1;
  host_write_cpu(hp, k.data(), k.data(), v.data(), &pos0, &hrow, &krow, &key_first);

  FetchParams fp;
  fp.n_seq = 1;
  fp.n_kv_head = H;
  fp.head_dim = D;
  fp.kmax = K;
  fp.fmt = hp.fmt;
  fp.entry_bytes = hp.entry_bytes;
  fp.tok_bytes = hp.tok_bytes;
  fp.elt = KvElt::f32;
  fp.slot_bytes = 2 * int64_t(D) * 4;
  const int32_t kslots = K;
  std::vector<int32_t> prev(size_t(H) * K, -1), prev_slot(prev.size(), -1), slot_of(prev.size());
  std::vector<std::vector<uint8_t>> slots(H, std::vector<uint8_t>(size_t(K) * fp.slot_bytes));
  std::vector<uint8_t*> slot_p{slots[0].data(), slots[1].data()};
  std::vector<int32_t*> prev_p{prev.data(), prev.data() + K}, prev_slot_p{prev_slot.data(), prev_slot.data() + K};
  unsigned long long counters[2] = {0, 0};
  unsigned long long* counter_p = counters;
  FetchRows fr;
  fr.host = &hrow;
  fr.kplane = &krow;
  fr.key_first = &key_first;
  fr.kslots = &kslots;
  fr.slots = slot_p.data();
  fr.prev_sel = prev_p.data();
  fr.prev_slot = prev_slot_p.data();
  fr.slot_of = slot_of.data();
  fr.counters = &counter_p;
  std::vector<const uint8_t*> view_rows(H);

  // The decoded K|V of token t, head h, from a copy of the tier as written.
  const std::vector<uint8_t> original = host;
  auto decoded = [&](int32_t t, int h, int w) {
    std::vector<float> out(static_cast<size_t>(D));
    dequantize(spec, original.data() + int64_t(t) * hp.tok_bytes + h * hp.entry_bytes + w * hp.fmt.bytes, 1, D,
               out.data());
    return out;
  };
  auto check_view = [&](const FetchView& view, const std::vector<int32_t>& sel) {
    for (int h = 0; h < H; ++h)
      for (int j = 0; j < K; ++j) {
        const int32_t t = sel[size_t(h * K + j)];
        ASSERT_EQ(t < 0, view.idx[h * K + j] < 0);
        if (t < 0) continue;
        const auto* e = reinterpret_cast<const float*>(view.rows[h] + view.idx[h * K + j] * view.tok_stride);
        for (int w = 0; w < 2; ++w) {
          const auto want = decoded(t, h, w);
          for (int d = 0; d < D; ++d) ASSERT_EQ(e[w * D + d], want[size_t(d)]) << t << " " << h << " " << w;
        }
      }
  };

  std::vector<int32_t> sel1(size_t(H) * K, -1), sel2(size_t(H) * K, -1);
  for (int h = 0; h < H; ++h) {
    for (int j = 0; j < 10; ++j) sel1[size_t(h * K + 2 + j)] = 3 * j + h;        // 10 tokens
    for (int j = 0; j < 12; ++j) sel2[size_t(h * K + j)] = 3 * (j + 4) + h;      // 6 held, 6 new
  }
  FetchView view;
  fetch_rows_cpu(fp, sel1.data(), fr, view_rows.data(), &view);
  check_view(view, sel1);
  EXPECT_EQ(counters[0], 20u);
  EXPECT_EQ(counters[1], 20u);
  const std::vector<int32_t> slots1(slot_of);

  // The held tokens are not read again: scramble their records in the tier.
  for (int h = 0; h < H; ++h)
    for (int j = 4; j < 10; ++j) {
      uint8_t* e = host.data() + int64_t(3 * j + h) * hp.tok_bytes;
      std::fill(e, e + hp.tok_bytes, uint8_t(0x5a));
    }
  fetch_rows_cpu(fp, sel2.data(), fr, view_rows.data(), &view);
  check_view(view, sel2);
  EXPECT_EQ(counters[0], 44u);
  EXPECT_EQ(counters[1], 32u);
  for (int h = 0; h < H; ++h)
    for (int j = 0; j < 6; ++j)  // token 3(j+4)+h: position 2+j+4 in step 1, j in step 2
      EXPECT_EQ(slot_of[size_t(h * K + j)], slots1[size_t(h * K + 6 + j)]);
}

}  // namespace
}  // namespace kvtier
