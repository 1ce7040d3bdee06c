# SPDX-License-Identifier: Apache-2.0
"""bie._plans.Replay's policy, on a stand-in for libbie's recording calls (no GPU needed): a key's
calls run as usual the first time, are recorded and replayed the second, replayed after; a graph
that fails to replay is dropped and recorded again; a Replay keeps `cap` keys, and calls that cycle
through more keys than that never record (each key is dropped before it comes back); graphs
dropped while calls are recorded are destroyed after the recording, not during it."""
import pytest
import torch

from bie import _plans


class FakeLib:
    """libbie's record/replay entry points: each recording yields a new graph handle."""

    def __init__(self):
        self.recorded, self.replays, self.fail_replay = 0, [], False
        self.recording, self.destroyed, self.during = False, [], []

    def bie_cuda_record_begin(self, handle):
        self.recording = True
        return 0

    def bie_cuda_record_end(self, handle, graph):
        self.recording = False
        if graph is not None:
            self.recorded += 1
            graph._obj.value = 0x1000 + self.recorded
        return 0

    def bie_cuda_replay(self, handle, graph):
        self.replays.append(graph.value)
        return 1 if self.fail_replay else 0

    def bie_cuda_graph_destroy(self, graph):  # (a destruction during a recording would invalidate it)
        (self.during if self.recording else self.destroyed).append(graph.value)


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


def test_graphs_dropped_during_a_recording_are_destroyed_after_it(monkeypatch):
    """A Replay dropped while another records (the garbage collector may run anywhere) has its graph
    destroyed once the recording has ended, and the recording succeeds; nor is the current stream's
    capture state asked during it."""
    monkeypatch.setattr(_plans, "_REPLAY", True)
    ctx = FakeContext()
    monkeypatch.setattr(_plans._lib, "context", lambda: ctx)
    asked = []
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: asked.append(ctx.lib.recording) or False)
    old, new = _plans.Replay(4), _plans.Replay(4)
    for _ in range(2):
        old.run(ctx, "a", lambda: None)
    assert ctx.lib.recorded == 1 and len(old.graphs) == 1
    new.run(ctx, "b", lambda: None)
    new.run(ctx, "b", old._drop)  # (recorded: old's graph goes while the calls are recorded)
    assert ctx.lib.recorded == 2 and new.graphs["b"]
    assert ctx.lib.during == [] and ctx.lib.destroyed == [0x1001] and True not in asked
