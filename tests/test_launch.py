"""The direct-launch bookkeeping of llmkernels/_launch.py, on CPU with a stand-in compiled kernel.

On a GPU the first launch of a kernel goes through Triton and the compiled kernel is kept; later launches hand the
arguments straight to its launcher. These tests check, without a GPU, which launches reuse a kept kernel and what
the launcher receives: the argument layout, and that a change of specialisation never reuses one.
"""
from types import SimpleNamespace

import pytest
import torch

from llmkernels import _launch


class FakeKernel:
    """A @triton.jit stand-in: params (the last `n_const` constexpr), `kernel[grid](...)` compiles (counted)."""

    def __init__(self, n_args=3, n_const=2, const_positions=(), wrap=None):
        self.wrap = wrap or (lambda f: f)  # Triton wraps the launcher of a kernel with TMA descriptor arguments
        names = [f"a{i}" for i in range(n_args)] + [f"C{i}" for i in range(n_const)]
        self.params = [SimpleNamespace(name=n, is_constexpr=i >= n_args or i in const_positions, default=None)
                       for i, n in enumerate(names)]
        self.constexprs = [i for i, p in enumerate(self.params) if p.is_constexpr]
        self.compiles, self.direct = [], []

    def __getitem__(self, grid):
        def run(*args, **kwargs):
            self.compiles.append((grid, args, kwargs))
            launcher = SimpleNamespace(launch=self.wrap(lambda *a: self.direct.append(a)), global_scratch_size=0,
                                       profile_scratch_size=0, launch_cooperative_grid=0, launch_pdl=1)
            return SimpleNamespace(run=launcher, function=1234, packed_metadata=(4, 1, 0),
                                   metadata=SimpleNamespace(tensordesc_meta=None))
        return run


@pytest.fixture
def fake_gpu(monkeypatch):
    monkeypatch.setattr(_launch, "interpreting", lambda: False)
    monkeypatch.setattr(_launch, "_has_cuda", lambda: True)
    monkeypatch.setattr(torch._C, "_cuda_getDevice", lambda: 0, raising=False)
    monkeypatch.setattr(torch._C, "_cuda_getCurrentRawStream", lambda dev: 77, raising=False)
    _launch._SITES.clear()


def test_launch_object_keeps_the_compiled_kernel(fake_gpu):
    k = FakeKernel()
    ln = _launch.Launch(k, (5, 2), C0=16, C1=True, num_warps=4)
    x = torch.zeros(8)
    ln(x, 3, 0.5)
    ln(x, 3, 0.5)
    assert len(k.compiles) == 1 and k.compiles[0][2] == dict(C0=16, C1=True, num_warps=4)
    # grid padded to 3-d, the stream, the kernel handle, launch flags, no scratch, metadata, no hooks, args, constexprs
    assert k.direct == [(5, 2, 1, 77, 1234, 0, 1, None, None, (4, 1, 0), None, None, None, x, 3, 0.5, 16, True)]


def test_launch_direct_only_once_kept(fake_gpu, monkeypatch):
    # plans pass untyped tensors only when direct() says the kept launcher (addresses only) takes the call
    k = FakeKernel()
    ln = _launch.Launch(k, (1,), C0=1, C1=False)
    assert not ln.direct()
    ln(torch.zeros(4), 1, 1.0)
    assert ln.direct()
    monkeypatch.setattr(_launch, "_hooks", lambda: True)  # a profiler's launch hooks: Triton's path again
    assert not ln.direct()


def test_keyed_launch_never_reuses_another_specialisation(fake_gpu):
    k = FakeKernel()
    buf = torch.zeros(64)
    a, shifted = buf[:16], buf[1:17]  # 16-byte aligned, and 4 bytes past
    calls = [(a, 32, 1.0), (a, 32, 2.0), (a, 48, 1.0),     # same classes: one compile
             (shifted, 32, 1.0),                          # alignment
             (a, 1, 1.0), (a, 33, 1.0), (a, 2 ** 31, 1.0),  # == 1, not divisible by 16, 64-bit
             (a.double(), 32, 1.0)]                       # dtype
    for args in calls:
        _launch.launch(k, (1,), *args, C0=1, C1=False)
    assert len(k.compiles) == 6 and len(k.direct) == 2
    _launch.launch(k, (1,), a, 32, 1.0, C0=2, C1=False)  # another constexpr value
    assert len(k.compiles) == 7


def test_positional_constexpr_values_are_keyed(fake_gpu):
    k = FakeKernel(n_args=3, n_const=1, const_positions=(2,))  # a2 is a constexpr passed positionally
    x = torch.zeros(16)
    for v in (0, 32, 0):
        _launch.launch(k, (1,), x, 5, v, C0=3)
    assert len(k.compiles) == 2 and len(k.direct) == 1 and k.direct[0][-2:] == (0, 3)


def test_planned_launches_by_position(fake_gpu):
    k1, k2 = FakeKernel(), FakeKernel()
    x = torch.zeros(16)

    def call(n):
        _launch.launch(k1, (1,), x, n, 1.0, C0=1, C1=False)
        _launch.launch(k2, (2,), x, n, 1.0, C0=1, C1=False)

    token = _launch.new_token()
    _launch.run_planned(token, call, 16)
    _launch.run_planned(token, call, 16)
    assert len(k1.compiles) == len(k2.compiles) == 1 and len(k1.direct) == len(k2.direct) == 1
    assert getattr(_launch._STATE, "token", None) is None  # reset after the call
    with pytest.raises(ValueError):
        _launch.run_planned(token, lambda: (_ for _ in ()).throw(ValueError("boom")))
    assert getattr(_launch._STATE, "token", None) is None  # and after an error


def test_hooks_take_tritons_path(fake_gpu, monkeypatch):
    k = FakeKernel()
    ln = _launch.Launch(k, (1,), C0=1, C1=False)
    x = torch.zeros(16)
    ln(x, 1, 1.0)
    monkeypatch.setattr(_launch, "_hooks", lambda: True)
    ln(x, 1, 1.0)
    assert len(k.compiles) == 2 and not k.direct


def test_keys_of_unusual_arguments():
    assert _launch.tkey(None) is None
    assert _launch.tkey(3.0)[0] is float  # not a tensor: a key that is never cached
    assert _launch.skey(True) != _launch.skey(1)
    cache = _launch.PlanCache()
    cache.put((1, [2]), "x")  # unhashable: not cached, no error
    assert cache.get((1, [2])) is None and len(cache) == 0
    meta = torch.empty(4, device="meta")
    assert not _launch.direct_ok((meta,))  # meta tensors go through the custom op's fake kernel


def test_kernel_configs_are_typed():
    # one frozen config per kernel family: dicts of knobs override it, an unknown knob is an error, not ignored
    import dataclasses

    from llmkernels.ops.masked_decode.kernel import CONFIG, MASKED_CONFIG
    from llmkernels.ops.nvfp4.gemv import GemvConfig
    from llmkernels.ops.sparse_mla.fwd_wgmma import FwdWsConfig
    assert MASKED_CONFIG.with_({"block_n": 32}).block_n == 32 and MASKED_CONFIG.num_stages == 3
    assert CONFIG.with_(None) is CONFIG and dict(CONFIG)["block_n"] == 128 and "waves" in CONFIG
    with pytest.raises(TypeError, match="has no knob STAMP"):
        FwdWsConfig.of({"STAMP": 1})
    with pytest.raises(dataclasses.FrozenInstanceError):
        CONFIG.block_n = 1
    g = GemvConfig.of({"BM": 8, "pdl": True})
    assert (g.BM, g.pdl, g.trigger, {**g, "pre": 2}["pre"]) == (8, True, "entry", 2)


def test_tma_descriptor_arguments_encoded_once(fake_gpu):
    # Triton 3.6's launcher encodes each TMA descriptor argument on every call; a kept Launch can take them encoded
    from triton.backends.nvidia.driver import wrap_handle_tensordesc
    sig = {0: "tensordesc<bf16[8, 64]>", 1: "i32"}
    k = FakeKernel(n_args=2, n_const=0, wrap=lambda f: wrap_handle_tensordesc(f, sig, [None]))
    ln = _launch.Launch(k, (3,))
    base = torch.zeros(16, 64)
    desc = SimpleNamespace(base=base, shape=[16, 64], strides=[64, 1], padding="zero")
    assert ln.encode(0, desc) is None  # nothing kept yet
    ln(desc, 5)
    ln(desc, 5)  # kept: the wrapper encodes the descriptor
    enc = ln.encode(0, desc)
    assert enc is not None
    ln.direct_encoded(*enc, 5)
    assert len(k.compiles) == 1 and k.direct[-1] == k.direct[-2]
    assert k.direct[-1][13:] == (base, 16, 64, 64, 1, False, 16, 64, 64, 1, 5)
    assert _launch._unwrap_tma(lambda *a: a) is None
