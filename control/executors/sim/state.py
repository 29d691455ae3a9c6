"""The simulator's run state: the slot table, the KV ledger, the clock and the run's tallies.

``SimEngine.run`` creates one of each per run; its methods read and advance them. Every array is
indexed by batch slot (S = ``SimConfig.max_batch``) unless its comment says otherwise.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

I64 = np.int64
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 1 << 30)
NO_REQUEST = -1  # SlotTable.rid of a free slot
NO_DRAFTER = -1  # SlotTable.last of a slot that has not speculated yet


class SlotTable:
    """Batch slots: which request each holds and how far it got. Admission takes the lowest free slot;
    ``pending`` (admitted, prompt not done; admission order) and ``dec`` (decoding) are recomputed after
    any change of membership."""

    def __init__(self, size: int, drafters: int, category: np.ndarray | None) -> None:
        self.rid = np.full(size, NO_REQUEST, dtype=I64)  # (S,) request id, NO_REQUEST when free
        self.ctx = np.zeros(size, dtype=I64)  # (S,) tokens in the target's KV
        self.gen = np.zeros(size, dtype=I64)  # (S,) output tokens generated
        self.pref = np.zeros(size, dtype=I64)  # (S,) prompt tokens prefilled
        self.seq = np.zeros(size, dtype=I64)  # (S,) admission order
        self.lag = np.zeros((size, max(drafters, 1)), dtype=I64)  # (S, m) tokens each drafter is behind
        self.last = np.full(size, NO_DRAFTER, dtype=I64)  # (S,) drafter of the latest speculative step
        self.active = np.zeros(size, dtype=bool)  # (S,) holds a request
        self.decoding = np.zeros(size, dtype=bool)  # (S,) past its prefill
        self.free = list(range(size - 1, -1, -1))  # free slots, the lowest last (popped first)
        self._category = category  # (N,) category per request, or None
        self._next_seq = 0
        self._dirty = True
        empty = np.zeros(0, dtype=I64)
        self.pending = self.dec = self.rid_dec = empty  # (p,) slots; (n,) slots; (n,) their request ids
        self.cat_dec: np.ndarray | None = None  # (n,) categories of the decoding requests

    def admit(self, rid: int) -> None:
        s = self.free.pop()
        self.rid[s], self.ctx[s], self.gen[s], self.pref[s], self.seq[s], self.last[s] = (
            rid, 0, 0, 0, self._next_seq, NO_DRAFTER)
        self.lag[s] = 0
        self.active[s] = True
        self._next_seq += 1
        self._dirty = True

    def begin_decoding(self, slots: np.ndarray) -> None:
        self.decoding[slots] = True
        self._dirty = True

    def release(self, slots: np.ndarray, output: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Free those of ``slots`` whose request is decoding and has all ``output[rid]`` tokens; returns
        (their slots, their request ids)."""
        rid = self.rid[slots]
        fin = self.gen[slots] >= output[rid]
        fin &= self.decoding[slots]
        if not fin.any():
            return slots[:0], rid[:0]
        fs = slots[fin]
        self.active[fs] = False
        self.decoding[fs] = False
        self.rid[fs] = NO_REQUEST
        self.free.extend(int(x) for x in fs)
        self._dirty = True
        return fs, rid[fin]

    def refresh(self) -> None:
        """Recompute ``pending``, ``dec``, ``rid_dec`` and ``cat_dec`` if membership changed."""
        if not self._dirty:
            return
        pending = np.flatnonzero(self.active & ~self.decoding)
        if pending.size > 1:
            pending = pending[np.argsort(self.seq[pending], kind="stable")]
        self.pending = pending
        self.dec = np.flatnonzero(self.decoding)
        self.rid_dec = self.rid[self.dec]
        self.cat_dec = None if self._category is None else self._category[self.rid_dec]
        self._dirty = False


@dataclass(slots=True)
class KvLedger:
    """KV cache tokens: reserved by admitted requests (prompt + output, so no eviction) and in use."""

    capacity: int
    reserved: int = 0
    used: int = 0

    def fits(self, need: int) -> bool:
        return self.reserved + need <= self.capacity

    @property
    def free(self) -> int:
        return int(self.capacity - self.used)


@dataclass(slots=True)
class Clock:
    """Simulated time (seconds since the first arrival can be admitted) and iterations run."""

    now: float = 0.0
    step: int = 0


@dataclass
class Tally:
    """What a run counts besides SimResult's scalars: k per request-step and the per-step series."""

    kc: int  # max(max_k, 1): the histogram covers k = 0..kc
    slots: int
    record_series: bool
    k_hist: np.ndarray = field(init=False)  # (kc + 1,) request-steps by k
    bucket_of: np.ndarray = field(init=False)  # (S + 1,) batch size -> BATCH_BUCKETS index
    series: tuple[list, list, list, list, list] = field(init=False)  # t_s, batch, k_sum, accepted, verified

    def __post_init__(self) -> None:
        self.k_hist = np.zeros(self.kc + 1, dtype=I64)
        self.bucket_of = np.searchsorted(BATCH_BUCKETS, np.arange(self.slots + 1), side="left")
        self.series = ([], [], [], [], [])

    def add_series(self, now: float, n: int, k_sum: int, accepted: int, verified: int) -> None:
        if self.record_series:
            for col, v in zip(self.series, (now, n, k_sum, accepted, verified), strict=True):
                col.append(v)

    def series_arrays(self) -> dict[str, np.ndarray]:
        t, n, k, acc, ver = self.series
        return {"t_s": np.array(t), "batch": np.array(n, dtype=I64), "k_sum": np.array(k, dtype=I64),
                "accepted": np.array(acc, dtype=I64), "verified": np.array(ver, dtype=I64)}
