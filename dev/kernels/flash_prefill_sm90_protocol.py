#!/usr/bin/env python3
"""Randomized check of flash_prefill_sm90.cu's mbarrier protocol.

Runs the kernel's exact sequence of barrier operations (producer: expect_tx,
TMA issue, waits on k_empty / v_empty with the kernel's parities; the two
consumer warpgroups: waits on q_full / k_full / v_full and arrivals on
k_empty / v_empty, serial and overlapped variants) under random
interleavings, with TMA completions landing at random later times. mbarrier
model (PTX ISA): a phase completes when its pending arrivals reach zero and
its transaction count is zero; try_wait.parity(P) succeeds once the phase of
parity P has completed (the current phase has the other parity).

Checks: no deadlock; a consumer that passes a full barrier finds the tile it
expects in the stage; no TMA write lands in a stage while a consumer still
reads it (between its wait on the full barrier and its arrival on the empty
one); every barrier ends with no pending transaction.

usage: python3 dev/kernels/flash_prefill_sm90_protocol.py   (exit 0 when all runs pass)
"""
import random
import sys

STAGES = 2


class Barrier:
    def __init__(self, count):
        self.count, self.pending, self.tx, self.completed = count, count, 0, 0

    def _check(self):
        if self.pending == 0 and self.tx == 0:
            self.completed += 1
            self.pending = self.count

    def arrive(self):
        assert self.pending > 0
        self.pending -= 1
        self._check()

    def arrive_expect_tx(self, nbytes):
        self.tx += nbytes
        self.arrive()

    def complete_tx(self, nbytes):
        self.tx -= nbytes
        self._check()

    def passed(self, parity):
        return (self.completed & 1) != parity


class Sim:
    def __init__(self, n_tiles, overlap, rng):
        self.rng = rng
        self.q_full = Barrier(1)
        self.k_full = [Barrier(1) for _ in range(STAGES)]
        self.v_full = [Barrier(1) for _ in range(STAGES)]
        self.k_empty = [Barrier(2) for _ in range(STAGES)]  # one arrival per consumer warpgroup
        self.v_empty = [Barrier(2) for _ in range(STAGES)]
        # tile id whose data each 64-column box of a stage holds
        self.stage = {"k": [[None, None] for _ in range(STAGES)], "v": [[None, None] for _ in range(STAGES)]}
        self.readers = {"k": [set() for _ in range(STAGES)], "v": [set() for _ in range(STAGES)]}
        self.inflight = []  # TMA loads issued, not landed: (kind, stage, tile, barrier)
        self.n_tiles, self.overlap = n_tiles, overlap

    # --- TMA ---
    def tma(self, kind, st, tile, bar):
        for box in range(2):  # two boxes of 16 KB, each completing its bytes on the barrier
            self.inflight.append((kind, st, box, tile, bar))

    def land_one(self):
        kind, st, box, tile, bar = self.inflight.pop(self.rng.randrange(len(self.inflight)))
        if kind != "q":
            assert not self.readers[kind][st], f"TMA of {kind}{tile} into stage {st} while {self.readers[kind][st]} read it"
            self.stage[kind][st][box] = tile
        bar.complete_tx(16384)

    # --- threads as generators yielding a condition to wait for ---
    def producer(self):
        self.q_full.arrive_expect_tx(32768)
        self.tma("q", 0, 0, self.q_full)
        for j in range(self.n_tiles):
            st = j % STAGES
            free_parity = ((j // STAGES) & 1) ^ 1
            if j >= STAGES:
                yield lambda st=st, p=free_parity: self.k_empty[st].passed(p)
            self.k_full[st].arrive_expect_tx(32768)
            self.tma("k", st, j, self.k_full[st])
            if j >= STAGES:
                yield lambda st=st, p=free_parity: self.v_empty[st].passed(p)
            self.v_full[st].arrive_expect_tx(32768)
            self.tma("v", st, j, self.v_full[st])

    def read_begin(self, who, kind, st, tile):
        assert self.stage[kind][st] == [tile, tile], f"{who} expected {kind}{tile} in stage {st}, found {self.stage[kind][st]}"
        self.readers[kind][st].add(who)

    def read_end(self, who, kind, st, bar):
        self.readers[kind][st].discard(who)
        bar.arrive()

    def consumer(self, who):
        yield lambda: self.q_full.passed(0)
        n = self.n_tiles
        if not self.overlap:
            for j in range(n):
                st, ph = j % STAGES, (j // STAGES) & 1
                yield lambda st=st, ph=ph: self.k_full[st].passed(ph)
                self.read_begin(who, "k", st, j)
                yield None  # S = Q K^T runs
                self.read_end(who, "k", st, self.k_empty[st])
                yield lambda st=st, ph=ph: self.v_full[st].passed(ph)
                self.read_begin(who, "v", st, j)
                yield None  # O += P V runs
                self.read_end(who, "v", st, self.v_empty[st])
        else:
            yield lambda: self.k_full[0].passed(0)
            self.read_begin(who, "k", 0, 0)
            yield None
            self.read_end(who, "k", 0, self.k_empty[0])
            for j in range(1, n):
                st, sp = j % STAGES, (j - 1) % STAGES
                yield lambda st=st, p=(j // STAGES) & 1: self.k_full[st].passed(p)
                yield lambda sp=sp, p=((j - 1) // STAGES) & 1: self.v_full[sp].passed(p)
                self.read_begin(who, "k", st, j)  # S_j issued
                self.read_begin(who, "v", sp, j - 1)  # P_{j-1} V_{j-1} issued
                yield None  # wait_group 1: S_j done
                self.read_end(who, "k", st, self.k_empty[st])
                yield None  # softmax, then wait_group 0: P V done
                self.read_end(who, "v", sp, self.v_empty[sp])
            sl = (n - 1) % STAGES
            yield lambda sl=sl, p=((n - 1) // STAGES) & 1: self.v_full[sl].passed(p)
            self.read_begin(who, "v", sl, n - 1)
            yield None
            self.read_end(who, "v", sl, self.v_empty[sl])

    def run(self):
        threads = {"producer": self.producer(), "wg1": self.consumer("wg1"), "wg2": self.consumer("wg2")}
        waiting = {name: None for name in threads}
        steps = 0
        while threads or self.inflight:
            steps += 1
            assert steps < 100000
            runnable = [t for t in threads if waiting[t] is None or waiting[t]()]
            choices = runnable + (["tma"] if self.inflight else [])
            assert choices, f"deadlock: {len(self.inflight)} loads in flight, waiting: {list(threads)}"
            pick = self.rng.choice(choices)
            if pick == "tma":
                self.land_one()
                continue
            try:
                waiting[pick] = next(threads[pick])
            except StopIteration:
                del threads[pick]
        for b in [self.q_full, *self.k_full, *self.v_full, *self.k_empty, *self.v_empty]:
            assert b.tx == 0 and b.pending == b.count


def main():
    rng = random.Random(7)
    bad = 0
    for overlap in (False, True):
        for n_tiles in (1, 2, 3, 4, 5, 8, 17):
            try:
                for _ in range(300):
                    Sim(n_tiles, overlap, rng).run()
                verdict = "ok"
            except AssertionError as e:
                verdict, bad = f"FAILED: {e}", bad + 1
            print(f"{'overlap' if overlap else 'serial'} n_tiles {n_tiles:2}: 300 random schedules {verdict}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
