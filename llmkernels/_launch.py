"""The host path of an eager call: cached launch plans and direct launches of compiled Triton kernels.

Every public op validates its arguments and works out a launch configuration once per *plan key*: the shapes,
strides, dtypes, devices and 16-byte alignment of its tensors and the values (and types) of its other arguments.
A later call with the same key has passed the same checks (each check reads only what the key holds) and launches
the same compiled kernels, which specialise on exactly those properties (dtype, alignment, ints == 1 or divisible
by 16). So a cached plan skips the checks and Triton's per-launch argument binding (~0.6 us an argument), and an
eager call skips torch's custom-op dispatch (~18 us) where that dispatch would only run the implementation: no
torch.compile tracing, no dispatch or function mode, plain tensors, no autograd. Any other key runs the full checks:
a bad input always gets its error. Every op takes this path through one mechanism (kept_plan / keep_plan below)
over one plan cache.
"""
import itertools
import threading
from typing import Optional

import torch
from triton import knobs

from ._runtime import interpreting

_MAX_PLANS = 1024  # over all ops; a process sees few shapes, and a full cache is simply cleared


class PlanCache(dict):
    def get(self, key):
        try:
            return dict.get(self, key)
        except TypeError:  # an unhashable argument: never cached (the checks will refuse it)
            return None

    def put(self, key, plan):
        if len(self) >= _MAX_PLANS:
            self.clear()
        try:
            self[key] = plan
        except TypeError:
            pass
        return plan


_PLANS = PlanCache()  # the one plan cache: (site, device, key parts ...) -> plan, for every op


# The one eager host path every public op takes (see the module doc), over the one plan cache:
#
#     key = None if tracing() else (SITE, current_device(), tkey(x), skey(n), ...)  # SITE: the op's name
#     plan = kept_plan(key, (x, ...))         # what a checked call with this key kept, where this call may run
#     if plan is not None:                    # directly too (direct_ok over its tensors), else None
#         return run(plan, x, ...)
#     ...the checks: a bad input raises, naming the argument...
#     plan = keep_plan(key, lambda: make(...), (x, ...))   # made and kept where a direct call is allowed
#     return run(plan, x, ...) if plan is not None else the_custom_op(x, ...)
#
# (dynamo must not trace a key: data_ptr() breaks the graph.) Plan makers on checked arguments (a custom op's body)
# use cached_plan(key, make). Module functions and tuple arguments: each method call or star-pack costs ~0.05-0.1 us
# of a ~25 us call (benchmarks/notes/host_path.md, version 6).

def kept_plan(key, tensors):
    if key is None:
        return None
    plan = _PLANS.get(key)
    return plan if plan is not None and direct_ok(tensors) else None


def keep_plan(key, make, tensors):
    if key is None or not direct_ok(tensors):
        return None
    return _PLANS.put(key, make())


def cached_plan(key, make):
    plan = _PLANS.get(key)
    return plan if plan is not None else _PLANS.put(key, make())


def tkey(t):
    """What a tensor contributes to a plan key (None for an absent optional tensor). Not its type: plans are kept
    and hit only for plain tensors (direct_ok), and plan makers read shapes, strides and dtypes only."""
    if t is None:
        return None
    try:
        return t.shape, t.stride(), t.dtype, t.device, t.data_ptr() & 15
    except Exception:  # not a tensor, or one without storage: never cached (the checks refuse or route it)
        return type(t), id(t)


def skey(x):
    """A scalar's key: its type too (True == 1 and hash alike, but only one is a valid int argument)."""
    return type(x), x


_HAS_CUDA = []


def _has_cuda() -> bool:
    if not _HAS_CUDA:  # torch.cuda.is_available() reads the environment on every call (~5 us)
        _HAS_CUDA.append(torch.cuda.is_available())
    return _HAS_CUDA[0]


def current_device():
    """The current CUDA device (Triton loads a compiled kernel per device), -1 without CUDA."""
    return torch._C._cuda_getDevice() if _has_cuda() else -1


_TOKENS = itertools.count(1)
_STATE = threading.local()  # .token: the plan whose launches are being made, .n: how many so far


def new_token() -> int:
    """A fresh plan token: an op stores one with each checked key, and passes it to run_planned."""
    return next(_TOKENS)


def run_planned(token: int, fn, *args):
    """fn(*args), whose launch() calls are the same kernels, specialised alike, as on every call with this token (the
    token stands for a plan key: see the module doc). They are then found by (token, position) alone, without
    arg_key: the n-th launch of a call with a token is the n-th of its first call."""
    _STATE.token, _STATE.n = token, 0
    try:
        return fn(*args)
    finally:
        _STATE.token = None


def direct_ok(tensors) -> bool:
    """True where calling an op's implementation directly is what torch's dispatcher would do anyway (tensors: a
    tuple, None for absent optional ones). The first tensor is the op's leading input: on CUDA, or the CPU under the
    interpreter (meta tensors go to the fake kernel)."""
    if torch._C._len_torch_dispatch_stack() or torch._C._is_torch_function_mode_enabled():
        return False
    t0 = tensors[0]
    if not t0.is_cuda and (t0.device.type != "cpu" or not interpreting()):
        return False
    if torch.is_grad_enabled():
        for t in tensors:
            if t is not None and (type(t) is not torch.Tensor or t.requires_grad):
                return False
    else:
        for t in tensors:
            if t is not None and type(t) is not torch.Tensor:
                return False
    return True


def tracing() -> bool:
    """torch.compile (dynamo) tracing: keys would read fake tensors, so the op goes through its custom op."""
    return torch.compiler.is_compiling()


_SITES = {}  # (kernel, device, keywords, argument key) -> (direct tuple, constexpr tail) of a compiled kernel


def arg_key(args):
    """What Triton specialises a launch on, per positional argument: a tensor's dtype and 16-byte alignment, an int's
    == 1, divisibility by 16 and width; only the type of floats, bools and None. None for anything else."""
    key = []
    for a in args:
        t = type(a)
        if t is torch.Tensor:
            key.append((a.dtype, a.data_ptr() & 15 == 0))
        elif t is int:
            key.append((a == 1, a & 15 == 0, -0x80000000 <= a <= 0x7FFFFFFF, a >= 0x8000000000000000))
        elif t is float or t is bool or a is None:
            key.append(t)
        else:
            return None
    return tuple(key)


def launch(fn, grid, *args, **kwargs) -> None:
    """fn[grid](*args, **kwargs), with the compiled kernel kept per specialisation: a launch whose arguments
    specialise like an earlier one's (or the same launch of a planned call, see run_planned) goes straight to the
    compiled kernel's launcher (see Launch). Without CUDA (the interpreter, or scripts/sm90_offline.py compiling for
    sm_90 on a CPU-only machine) every launch takes Triton's path."""
    if interpreting() or _hooks() or not _has_cuda():
        fn[grid](*args, **kwargs)
        return
    token = getattr(_STATE, "token", None)
    hit = key = None
    if token is not None:
        n = _STATE.n
        _STATE.n = n + 1
        planned = _SITES.get((token, n))
        if planned is not None and planned[0] is fn:  # (the kernel is checked: a cheap guard on the order)
            hit = planned[1]
    if hit is None:
        ak = arg_key(args)
        # a constexpr passed positionally specialises on its value, not only on the classes arg_key records
        consts = tuple(args[i] for i in fn.constexprs if i < len(args))
        key = (fn, torch._C._cuda_getDevice(), tuple(kwargs.items()), consts, ak) if ak is not None else None
        try:
            hit = _SITES.get(key) if key is not None else None
        except TypeError:  # an unhashable keyword value: no caching for this call site
            key = None
    if hit is None:
        hit = _direct(fn, fn[grid](*args, **kwargs), len(args), kwargs)
        if hit is None:
            return
        if len(_SITES) >= 16 * _MAX_PLANS:
            _SITES.clear()
        if key is not None:
            _SITES[key] = hit
    else:
        _fire(hit, tuple(grid) + (1, 1), args)
    if token is not None:
        _SITES[(token, n)] = (fn, hit)


def keyed(fn, grid, **kwargs):
    """Launch's interface over launch(): a plan made for one call (kept=False) launches through the keyed path."""
    return lambda *args: launch(fn, grid, *args, **kwargs)


def _fire(kept, g, args) -> None:
    """Launch a kept compiled kernel (see _direct) on grid g (3 or more entries) on the current stream."""
    d, tail = kept
    d[0](g[0], g[1], g[2], torch._C._cuda_getCurrentRawStream(d[1]), *d[2:], *args, *tail)


def _direct(fn, ck, n_args, kwargs):
    """(direct launcher tuple, constexpr tail) of a compiled kernel, or None where Triton must prepare each launch."""
    run = getattr(ck, "run", None)
    params = getattr(fn, "params", None)
    if run is None or params is None or getattr(run, "global_scratch_size", 1) or \
            getattr(run, "profile_scratch_size", 1):
        return None  # scratch: Triton's launcher prepares it per call (TMA descriptors: run.launch encodes them)
    tail = []
    for p in params[n_args:]:  # the constexprs after the positional arguments, in the kernel's order
        if not p.is_constexpr:
            return None
        tail.append(kwargs.get(p.name, p.default))
    return ((run.launch, torch._C._cuda_getDevice(), ck.function, run.launch_cooperative_grid, run.launch_pdl, None,
             None, ck.packed_metadata, None, None, None), tuple(tail))


def _unwrap_tma(launcher):
    """(inner launcher, descriptor metadata) of a Triton 3.6 launcher that encodes its kernel's TMA descriptor
    arguments on every call (wrap_handle_tensordesc: ~7 us a call), else None."""
    names = getattr(getattr(launcher, "__code__", None), "co_freevars", ())
    if "launcher" not in names or "tensordesc_meta" not in names:
        return None
    cells = dict(zip(names, (c.cell_contents for c in launcher.__closure__)))
    return cells["launcher"], cells["tensordesc_meta"]


class Launch:
    """One kernel launch of a plan: grid, constexprs and options fixed. The first call goes through Triton (compile,
    specialise) and keeps the compiled kernel; later calls hand the arguments straight to its launcher. Correct while
    the arguments specialise as on the first call, which the plan's key guarantees. Arguments are positional, in the
    kernel's order; constexprs (and options such as num_warps) are keywords. Launch hooks (profilers), the
    interpreter and a machine without CUDA (sm90_offline.py) take Triton's path every time. A kernel with TMA
    descriptor arguments can also take them pre-encoded (encode, direct_encoded): a plan encodes a descriptor once
    per buffer address instead of once per call."""
    __slots__ = ("fn", "grid", "kwargs", "kept", "tma")

    def __init__(self, fn, grid, **kwargs):
        self.fn, self.kwargs, self.kept, self.tma = fn, kwargs, None, None
        self.grid = tuple(grid) + (1,) * (3 - len(grid))

    def encode(self, i: int, desc) -> Optional[list]:
        """The launcher arguments that TMA descriptor argument i (of the kernel's descriptors) expands to, or None
        where this launch cannot take them pre-encoded (not kept yet, launch hooks, another Triton)."""
        if not self.direct() or self.tma is None:
            return None
        from triton.backends.nvidia.driver import make_tensordesc_arg
        return make_tensordesc_arg(desc, self.tma[1][i])

    def direct_encoded(self, *args) -> None:
        """A direct launch (see direct) whose descriptor arguments are already expanded (encode)."""
        d, tail = self.kept
        g = self.grid
        self.tma[0](g[0], g[1], g[2], torch._C._cuda_getCurrentRawStream(d[1]), *d[2:], *args, *tail)

    def direct(self) -> bool:
        """The next call goes straight to the kept kernel's launcher, which reads only the addresses of tensor
        arguments (Triton's path would type them: a plan then passes correctly typed views)."""
        return self.kept is not None and not _hooks()

    def __call__(self, *args):
        if self.direct():
            _fire(self.kept, self.grid, args)
            return
        ck = self.fn[self.grid](*args, **self.kwargs)
        if self.kept is None and not interpreting() and _has_cuda():
            self.kept = _direct(self.fn, ck, len(args), self.kwargs)
            self.tma = _unwrap_tma(self.kept[0][0]) if self.kept is not None else None


_MEMSET = []


def zero_async(ptr: int, nbytes: int, device: int) -> None:
    """Zero nbytes (a multiple of 4) at device address ptr on the current stream of CUDA device `device`, through the
    driver's cuMemsetD32Async: ~1 us of host time against ~8 for tensor.zero_()'s dispatch and fill launch, and a
    memset node under CUDA-graph capture. For kept plans, which hand kernels addresses (see Launch.direct)."""
    if not _MEMSET:
        import ctypes
        f = ctypes.CDLL("libcuda.so.1").cuMemsetD32Async
        f.argtypes, f.restype = (ctypes.c_uint64, ctypes.c_uint, ctypes.c_size_t, ctypes.c_void_p), ctypes.c_int
        _MEMSET.append(f)
    rc = _MEMSET[0](ptr, 0, nbytes >> 2, torch._C._cuda_getCurrentRawStream(device))
    if rc:
        raise RuntimeError(f"cuMemsetD32Async failed with CUDA error {rc}")


def _hooks() -> bool:
    rt = knobs.runtime
    return bool(rt.launch_enter_hook.calls or rt.launch_exit_hook.calls)
