# SPDX-License-Identifier: Apache-2.0
"""Planned libbie calls (bie_plan_*), cached per thread by the metadata of their tensors.

A layer call is planned once per layer kind, shapes, strides, dtypes and device: libbie validates
it, chooses its route and sizes its workspace. Later calls with the same metadata only patch the
data pointers of the cached argument structs and execute the plan, which keeps the host cost of a
call to a few microseconds. BIE_PLAN_LOG=1 in the environment logs each new plan (its route in
libbie's words) through the `logging` module, logger "bie.plans", at INFO level.
"""
import ctypes
import logging
import os
import threading

from . import _lib

_log = logging.getLogger("bie.plans")
_LOG = os.environ.get("BIE_PLAN_LOG", "") not in ("", "0")
if _LOG and not _log.handlers and not logging.getLogger().handlers:
    logging.basicConfig(level=logging.INFO)
_MAX_PLANS = 1024  # per thread; the oldest half is dropped when full


class Call:
    """A libbie call (a function taking the context, then `pre`, then its argument struct, or with
    args None only `pre`) whose arguments are kept by the metadata of their tensors: a later call
    with the same metadata only patches the views' data pointers. `views` are the tensor views the
    arguments point to, in the order of the tensors given to run() (None: absent)."""

    __slots__ = ("fn", "name", "args", "argv", "live", "replay")

    def __init__(self, function, pre, args, views):
        self.name, self.fn = function, getattr(_lib.context().lib, function)
        self.args = args
        self.replay = None  # run_kept's Replay of this call (False: none), made on its first use
        self.argv = tuple(pre) if args is None else (*pre, ctypes.byref(args))
        self.live = tuple((i, v) for i, v in enumerate(views) if v is not None)  # the views run() patches

    def run(self, ref, tensors):
        """Calls the function on `tensors` (torch tensors or None, one per view) on the device of `ref`
        (CUDA: on its current stream)."""
        ctx = bound_context(ref)
        if ctx is None:  # (a device other than the current one)
            import torch
            with torch.cuda.device(ref.get_device()):
                self.run_bound(bound_context(ref), tensors)
            return
        self.run_bound(ctx, tensors)

    def run_bound(self, ctx, tensors):
        """run() with the context that bound_context() gave for the device of the tensors; a tensor
        may be given as its data address (an int: a view into a tensor that the caller holds, made
        without building the view), with the metadata the call was made for."""
        for i, v in self.live:
            t = tensors[i]
            v.data = t if t.__class__ is int else t.data_ptr()
        self._call(ctx)

    def _call(self, ctx):
        status = self.fn(ctx.handle, *self.argv)
        if status:
            ctx.check(self.name, status)


def bound_context(ref):
    """This thread's context, pointed at the current stream of ref's CUDA device (ref a tensor);
    None when that device is not the current one (the caller then enters it and asks again)."""
    ctx = _lib.context()
    index = ref.get_device()  # (-1 on the CPU; cheaper than ref.device, which builds an object)
    if index >= 0:
        import torch
        if index != torch.cuda.current_device():
            return None
        _lib.bind_stream_index(ctx, index)
    return ctx


class Plan(Call):
    """One plan: its handle, and as a Call, bie_plan_forward or _backward on the argument struct its
    executions pass (whose tensor views' data pointers are replaced on each call)."""

    __slots__ = ("handle", "views", "keep", "backward", "lib", "text", "out")

    def __init__(self, function, desc, args, views, keep, backward):
        ctx = _lib.context()
        self.lib = ctx.lib
        self.handle = ctypes.c_void_p()
        self.views, self.keep, self.backward = views, keep, backward
        self.out = None
        ctx.check(function, getattr(ctx.lib, function)(ctx.handle, ctypes.byref(desc), ctypes.byref(args),
                                                       ctypes.byref(self.handle)))
        self.text = ctx.lib.bie_plan_describe(self.handle).decode(errors="replace")
        super().__init__("bie_plan_backward" if backward else "bie_plan_forward", (self.handle,), args, views)
        if _LOG:
            _log.info("bie plan: %s", self.text)

    def __del__(self):
        h = getattr(self, "handle", None)
        if h is not None and h.value:
            self.lib.bie_plan_destroy(h)
            self.handle = None


class Replay:
    """A sequence of libbie calls on CUDA tensors that its caller makes again and again, replayed
    from a CUDA graph (bie_cuda_record_begin, bie_cuda_replay) where the same key comes back: the key
    names the data pointers of every tensor the calls read or write, and the calls' other arguments
    are the caller's constants. A key's calls run as usual the first time, are recorded and
    replayed the second, and are replayed from then on: one graph launch instead of each call's
    launches. A graph that libbie finds stale (a cuDNN plan it used was released) is recorded
    again. A training step's tensors come from PyTorch's caching allocator, which hands the
    same blocks to the same sequence of allocations, so a step's calls repeat their keys. At most
    `cap` keys (default _MAX_REPLAYS) are kept; a key whose calls cannot be recorded (or whose
    stream is being captured) runs them as usual. BIE_REPLAY=0 in the environment turns replays
    off."""

    __slots__ = ("graphs", "ctx", "cap")

    def __init__(self, cap=None):
        self.graphs, self.ctx = {}, None  # key -> graph (c_void_p), None (seen once) or False (no graph)
        self.cap = cap or _MAX_REPLAYS  # keys kept; a new key beyond them drops them all

    def run(self, ctx, key, calls):
        """calls() (the libbie calls, made with ctx) for this key: as usual, recorded or replayed."""
        g = self.graphs.get(key, _UNSEEN)
        if g is _UNSEEN:
            if len(self.graphs) >= self.cap or ctx is not self.ctx:
                self._drop()
                self.ctx = ctx
            self.graphs[key] = None
        elif ctx is self.ctx:
            if g is None:
                if _REPLAY and self._record(ctx, key, calls):
                    return
            elif g is not False:
                if not ctx.lib.bie_cuda_replay(ctx.handle, g):
                    return
                import torch
                if not torch.cuda.is_current_stream_capturing():  # (stale: recorded again next time)
                    _destroy([g])
                    self.graphs[key] = None
        calls()

    def _record(self, ctx, key, calls):
        """Records calls() as key's graph and replays it; False where it could not (calls not run).
        Graphs dropped while it records (by the garbage collector, say) are destroyed after it:
        destroying one during the recording would invalidate it (_destroy)."""
        lib = ctx.lib
        self.graphs[key] = False
        if lib.bie_cuda_record_begin(ctx.handle):
            return False
        g = ctypes.c_void_p()
        _tls.recording = True
        try:
            try:
                calls()
            except Exception:  # (nothing ran: the caller makes the calls again, and sees the error)
                lib.bie_cuda_record_end(ctx.handle, None)
                return False
            if lib.bie_cuda_record_end(ctx.handle, ctypes.byref(g)) or not g.value:
                return False
        finally:
            _tls.recording = False
            _destroy([])
        self.graphs[key] = g
        status = lib.bie_cuda_replay(ctx.handle, g)
        if status:
            ctx.check("bie_cuda_replay", status)
        return True

    def _drop(self):
        _destroy([g for g in self.graphs.values() if g])
        self.graphs = {}

    def __del__(self):
        try:
            self._drop()
        except Exception:  # (at interpreter exit the library may be gone)
            pass


_MAX_REPLAYS = 4
_UNSEEN = object()
_doomed = []  # graphs to destroy once this thread neither records libbie calls nor has its stream captured


def _destroy(graphs):
    """Destroys the graphs, or keeps them for later while this thread records libbie calls
    (Replay._record) or its current stream is being captured into a CUDA graph: destroying one then
    would invalidate that capture."""
    _doomed.extend(graphs)
    if not _doomed or getattr(_tls, "recording", False):
        return
    import torch
    if torch.cuda.is_current_stream_capturing():
        return
    lib = _lib.context().lib
    while _doomed:
        try:
            g = _doomed.pop()
        except IndexError:  # (another thread took the last one)
            break
        lib.bie_cuda_graph_destroy(g)


_REPLAY = os.environ.get("BIE_REPLAY", "1") != "0"


def replay_for(tensors, cap=None):
    """A new Replay (of `cap` keys) for a kept call on `tensors` (torch tensors or None), or None where
    its calls must run as usual: replays off, or a tensor not on a CUDA device (a host scale's value
    would be read once, when the graph is recorded)."""
    if not _REPLAY or not all(t is None or t.is_cuda for t in tensors):
        return None
    return Replay(cap)


def run_replayed(call, replay, ref, tensors):
    """call.run(ref, tensors), replayed by `replay` (a Replay of this call alone, or None: run as
    usual) under the key of the tensors' data pointers."""
    if replay is None:
        call.run(ref, tensors)
        return
    ctx = bound_context(ref)
    if ctx is None:  # (a device other than the current one)
        call.run(ref, tensors)
        return
    replay.run(ctx, tuple(0 if t is None else t.data_ptr() for t in tensors), lambda: call.run_bound(ctx, tensors))


# Keys of a planned call's own Replay (run_kept): a plan serves every layer of its metadata, and each
# layer's tensors are a key of their own. Calls that cycle through more keys than this never record
# (each key is dropped before it comes back), so it covers the layers of one shape in large models
# (the four attention projections of a 32-layer transformer: 128 keys for each of their plans).
_MAX_PLAN_REPLAYS = 256


def run_kept(call, ref, tensors):
    """call.run(ref, tensors), replayed by a Replay the call keeps for itself (made on its first use;
    none where replay_for says so). For the calls of a training step (the autograd Functions' forward
    and backward), whose tensors' pointers repeat from one step to the next."""
    r = call.replay
    if r is None:
        r = call.replay = replay_for(tensors, _MAX_PLAN_REPLAYS) or False
    if r is False:
        call.run(ref, tensors)
    else:
        run_replayed(call, r, ref, tensors)


class _CopiesEmpty:
    """What a module keeps of its earlier calls (plans, BlockRuns) holds libbie handles and data
    pointers of this process: a copy or a pickle of it is a new, empty one, so that a copy of the
    module starts without them."""

    __slots__ = ()

    def __deepcopy__(self, memo):
        return type(self)()

    def __reduce__(self):
        return type(self), ()


class Cache(_CopiesEmpty, dict):
    """A dict of what a module keeps of its earlier calls; copies empty (_CopiesEmpty)."""

    __slots__ = ()


class Kept(_CopiesEmpty):
    """The plans a module keeps for its calls, by what a call's own tensors are: their metadata and
    the identity of its operands, which each entry keeps alive so that their ids stay theirs. At most
    _MAX_KEPT, and only those made with the module's current weight: a repacked weight is a new
    tensor, and the first call with it lets the plans kept with the old one (and so the old weight)
    go. A copy or a pickle of it is empty (_CopiesEmpty)."""

    __slots__ = ("runs", "weight")

    def __init__(self):
        self.runs, self.weight = {}, None

    def __len__(self):
        return len(self.runs)

    def get(self, key):
        """What keep() stored for key, or None."""
        e = self.runs.get(key)
        return None if e is None else e[0]

    def keep(self, key, value, weight, operands):
        """Stores value for key, made with weight and the other operand tensors `operands`."""
        if weight is not self.weight or len(self.runs) >= _MAX_KEPT:
            self.runs, self.weight = {}, weight
        self.runs[key] = (value, operands)


_MAX_KEPT = 64
_tls = threading.local()


def cache():
    c = getattr(_tls, "plans", None)
    if c is None:
        c = _tls.plans = {}
    elif len(c) > _MAX_PLANS:
        for k in list(c)[: _MAX_PLANS // 2]:
            del c[k]
    return c


def meta(t):
    """What a plan fixes of a tensor (None: absent)."""
    return None if t is None else (t.shape, t.stride(), t.dtype, t.device)


def meta_fast(t):
    """meta(t) with the device as its index (-1: the CPU), cheaper to build."""
    return (t.shape, t.stride(), t.dtype, t.get_device())


def metas(*ts):
    """meta of each of ts, or None when all are absent (the optional tensors of a call, most often
    none of them)."""
    for t in ts:
        if t is not None:
            return tuple(meta(u) for u in ts)
    return None
