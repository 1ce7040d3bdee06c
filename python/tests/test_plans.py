# SPDX-License-Identifier: Apache-2.0
"""bie._plans.Replay's policy, on a stand-in for libbie's recording calls (no GPU needed): a key's
calls run as usual the first time, are recorded and replayed the second, replayed after; a graph
that fails to replay is dropped and recorded again; a Replay keeps `cap` keys, and calls that cycle
through more keys than that never record (each key is dropped before it comes back)."""
import pytest
import torch

from bie import _plans


class FakeLib:
    """libbie's record/replay entry points: each recording yields a new graph handle."""

    def __init__(self):
        self.recorded, self.replays, self.fail_replay = 0, [], False

    def bie_cuda_record_begin(self, handle):
        return 0

    def bie_cuda_record_end(self, handle, graph):
        if graph is not None:
            self.recorded += 1
            graph._obj.value = 0x1000 + self.recorded
        return 0

    def bie_cuda_replay(self, handle, graph):
        self.replays.append(graph.value)
        return 1 if self.fail_replay else 0


class FakeContext:
    handle = None

    def __init__(self):
        self.lib = FakeLib()

    def check(self, name, status):
        raise AssertionError(f"{name} failed: {status}")


@pytest.fixture
def replay(monkeypatch):
    """(a Replay of cap keys on a stand-in context, a function running key's calls through it, the
    keys whose calls ran, the graphs destroyed)."""
    monkeypatch.setattr(_plans, "_REPLAY", True)
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)  # (a CPU-only torch raises)
    destroyed = []
    monkeypatch.setattr(_plans, "_destroy", destroyed.extend)

    def make(cap):
        r, ctx, ran = _plans.Replay(cap), FakeContext(), []

        def go(key):
            r.run(ctx, key, lambda: ran.append(key))
        return r, ctx.lib, go, ran, destroyed
    return make


def test_a_key_is_recorded_on_its_second_call_and_replayed_after(replay):
    r, lib, go, ran, _ = replay(4)
    go("a")
    assert ran == ["a"] and lib.recorded == 0 and not lib.replays
    go("a")  # (the calls run once, inside the recording, then the graph replays)
    assert ran == ["a", "a"] and lib.recorded == 1 and lib.replays == [0x1001]
    for _ in range(3):
        go("a")
    assert ran == ["a", "a"] and lib.replays == [0x1001] * 4


def test_a_graph_that_fails_to_replay_is_recorded_again(replay):
    r, lib, go, ran, destroyed = replay(4)
    go("a")
    go("a")
    lib.fail_replay = True
    go("a")  # (stale: the calls run as usual, the graph goes)
    assert ran == ["a"] * 3 and [g.value for g in destroyed] == [0x1001]
    lib.fail_replay = False
    go("a")
    assert lib.recorded == 2 and ran == ["a"] * 4


@pytest.mark.parametrize("keys,cap,records", [(4, 4, 4), (5, 4, 0), (8, 4, 0), (3, 256, 3)])
def test_calls_that_cycle_through_more_keys_than_the_cap_never_record(replay, keys, cap, records):
    r, lib, go, ran, _ = replay(cap)
    for _ in range(5):
        for k in range(keys):
            go(k)
    assert lib.recorded == records
    assert len(ran) == 5 * keys - (3 * keys if records else 0)  # (recorded keys replay from round 3)


def test_run_kept_makes_its_replay_once_with_the_plan_cap(monkeypatch):
    """run_kept asks replay_for once per call object, for _MAX_PLAN_REPLAYS keys (enough for the
    four attention projections of 32 layers), and runs the call as usual where it gets none."""
    assert _plans._MAX_PLAN_REPLAYS >= 128
    asked = []
    monkeypatch.setattr(_plans, "replay_for", lambda tensors, cap=None: asked.append(cap))

    class Call:
        replay, runs = None, 0

        def run(self, ref, tensors):
            self.runs += 1
    call = Call()
    for _ in range(3):
        _plans.run_kept(call, None, ())
    assert asked == [_plans._MAX_PLAN_REPLAYS] and call.replay is False and call.runs == 3
