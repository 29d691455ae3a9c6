"""The simulator's run state: slot admission order, release of finished requests, the KV ledger."""

from __future__ import annotations

import numpy as np

from control.executors.sim.state import NO_REQUEST, KvLedger, SlotTable, Tally


def test_slots_are_taken_lowest_first_and_pending_keeps_admission_order():
    t = SlotTable(4, drafters=2, category=np.array([7, 8, 9, 10]))
    for rid in (0, 1, 2):
        t.admit(rid)
    t.refresh()
    assert t.pending.tolist() == [0, 1, 2] and t.dec.size == 0
    t.begin_decoding(np.array([1]))
    t.refresh()
    assert t.pending.tolist() == [0, 2] and t.dec.tolist() == [1]
    assert t.rid_dec.tolist() == [1] and t.cat_dec.tolist() == [8]


def test_release_frees_only_decoding_requests_with_all_their_tokens():
    t = SlotTable(3, drafters=1, category=None)
    for rid in (0, 1, 2):
        t.admit(rid)
    t.begin_decoding(np.array([0, 1]))
    t.gen[:] = [5, 2, 9]  # slot 2 has tokens enough but is still in its prefill
    output = np.array([5, 4, 3])
    slots, rids = t.release(np.array([0, 1, 2]), output)
    assert slots.tolist() == [0] and rids.tolist() == [0]
    assert t.rid[0] == NO_REQUEST and not t.active[0] and not t.decoding[0]
    t.admit(3)  # the freed slot is reused first
    assert t.rid[0] == 3 and t.lag[0].tolist() == [0]
    t.refresh()
    assert t.pending.tolist() == [2, 0]  # admission order, not slot order


def test_kv_ledger_reserves_whole_requests():
    kv = KvLedger(capacity=100)
    assert kv.fits(100) and not kv.fits(101)
    kv.reserved, kv.used = 60, 25
    assert kv.fits(40) and not kv.fits(41) and kv.free == 75


def test_tally_series_only_when_recording():
    on, off = Tally(8, 4, True), Tally(8, 4, False)
    for t in (on, off):
        t.add_series(1.5, 3, 6, 4, 5)
    assert on.series_arrays()["k_sum"].tolist() == [6] and off.series_arrays()["t_s"].size == 0
    assert on.bucket_of[[1, 2, 3, 4]].tolist() == [0, 1, 2, 2]
