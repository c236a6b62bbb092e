"""The codec part of the device check: every registered compressor's encode and decode on the device against its
CPU result on the same inputs, and its throughput against the device's copy bandwidth.

The reference is the CPU path (host kernels, CPU generators). The device run takes the device path (with
``--device cpu``: forced, so the torch kernels and counter-based draws a GPU runs are what is compared).
Deterministic compressors must match bit for bit; compressors that draw random numbers (or whose generator
differs between devices) must decode to an approximation as good as the CPU one: relative error
``‖D(p) − x‖/‖x‖`` at most ``1.25×`` the CPU's plus ``0.02`` (``TOLERANCE``), on inputs of odd sizes, as fp32
values and as bf16 values.
"""
from __future__ import annotations

import time
from typing import Any, Callable

import torch

from ds_gravac.compress.base import CompressCtx, Kind, Payload
from ds_gravac.compress.device_path import force_device_path
from ds_gravac.compress.registry import lookup

LEVELS = {"cf": 16.0, "rank": 4.0}
TOLERANCE = (1.25, 0.02)
# draws or data-dependent sampling whose stream is not the CPU's on another device (or on the device path)
RANDOM = frozenset({"randomk", "terngrad", "ternary", "qsgd", "powersgd", "acpsgd", "graddrop", "dgc", "redsync",
                    "sidco"})


def _level(comp: Any) -> float:
    if comp.kind == Kind.QUANTIZED:
        return float(comp.default_cf())
    return LEVELS[comp.level_kind]


def _ctx(comp: Any, shape: tuple[int, ...], device: torch.device) -> CompressCtx:
    n = 1
    for d in shape:
        n *= d
    ctx = CompressCtx(key="w", step=3, rank=0, world_size=2, seed=7, shape=shape,
                      param=torch.nn.Parameter(torch.zeros(shape, device=device)), lr=0.1, momentum=0.9)
    ctx.memory = {slot: torch.zeros(n, device=device) for slot in comp.Memory.slots}
    return ctx


class Roundtrip:
    """One compressor's encode and decode of one gradient ``g`` (flat fp32) of ``shape`` on ``device``: the
    compressor, plans and buffers are made once, so calling it again times the codec alone."""

    def __init__(self, name: str, g: torch.Tensor, shape: tuple[int, ...], device: torch.device) -> None:
        self.comp = comp = lookup(name)()
        self.g = g.to(device)
        self.ctx = _ctx(comp, shape, device)
        self.plan = plan = comp.tensor_plan(shape, _level(comp))
        dtype = torch.float32 if comp.kind == Kind.SUMMABLE else torch.int32
        self.p = Payload(plan, torch.zeros(plan.words, dtype=dtype, device=device))
        second = plan.get("round2") if comp.rounds > 1 else None     # PowerSGD: Q from P; a 1-D tensor is plain
        self.p2 = None if second is None else Payload(second, torch.zeros(second.words, dtype=dtype, device=device))
        self.x = torch.empty_like(self.g)
        self.out = torch.zeros(self.g.numel(), device=device)

    def __call__(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(payload words, decoded output), left on the device."""
        comp, ctx, x = self.comp, self.ctx, self.x
        if comp.owns_state:
            comp.memory.compensate(self.g, x, ctx)
        else:
            x.copy_(self.g)
        comp.compress(x, self.plan, self.p, ctx, update_state=False)
        if comp.rounds > 1:
            if self.p2 is not None:
                comp.next_round(x, self.p, self.p2, ctx)
            comp.decompress_rounds(self.p, self.p2, self.out, 1.0, ctx)
        else:
            comp.decompress(self.p, self.out, accumulate=False, scale=1.0, ctx=ctx)
        return self.p.words, self.out


def roundtrip(name: str, g: torch.Tensor, shape: tuple[int, ...], device: torch.device) -> tuple[torch.Tensor,
                                                                                                 torch.Tensor]:
    """(payload words, decoded output) of a fresh compressor's encode and decode, copied to the CPU."""
    words, out = Roundtrip(name, g, shape, device)()
    return words.cpu(), out.cpu()


def _rel_err(out: torch.Tensor, x: torch.Tensor) -> float:
    return float((out.double() - x.double()).norm() / x.double().norm().clamp_min(1e-30))


def compare(name: str, device: torch.device, shapes: list[tuple[int, ...]]) -> dict[str, Any]:
    """Per dtype and shape: bitwise equality of payload and decode, or the relative errors within tolerance."""
    rows, ok = [], True
    for dtype in (torch.float32, torch.bfloat16):
        for shape in shapes:
            n = 1
            for d in shape:
                n *= d
            gen = torch.Generator().manual_seed(n)
            g = torch.randn(n, generator=gen).to(dtype).float()
            ref_w, ref_out = roundtrip(name, g, shape, torch.device("cpu"))
            with force_device_path():
                dev_w, dev_out = roundtrip(name, g, shape, device)
            bitwise = torch.equal(ref_w, dev_w) and torch.equal(ref_out, dev_out)
            e_ref, e_dev = _rel_err(ref_out, g), _rel_err(dev_out, g)
            within = e_dev <= TOLERANCE[0] * e_ref + TOLERANCE[1] and bool(torch.isfinite(dev_out).all())
            passed = bitwise or (name in RANDOM and within)
            ok = ok and passed
            rows.append({"dtype": str(dtype).replace("torch.", ""), "shape": list(shape), "bitwise": bitwise,
                         "rel_err_cpu": e_ref, "rel_err_device": e_dev, "passed": passed})
    return {"expect": "tolerance" if name in RANDOM else "bitwise", "passed": ok, "cases": rows}


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed(fn: Callable[[], Any], device: torch.device, repeats: int) -> float:
    """Median seconds of ``fn`` (after one warm-up call); the device is synchronized around each call."""
    fn()
    times = []
    for _ in range(repeats):
        _sync(device)
        t0 = time.perf_counter()
        fn()
        _sync(device)
        times.append(time.perf_counter() - t0)
    return sorted(times)[len(times) // 2]


def copy_bandwidth(device: torch.device, numel: int, repeats: int) -> float:
    """Bytes per second of ``dst.copy_(src)`` counting the read and the write (what one memory pass costs)."""
    src = torch.randn(numel, device=device)
    dst = torch.empty_like(src)
    return 2 * src.numel() * 4 / timed(lambda: dst.copy_(src), device, repeats)


def throughput(name: str, device: torch.device, shape: tuple[int, ...], bandwidth: float, repeats: int
               ) -> dict[str, Any]:
    """Encode + decode of one tensor of ``shape`` on the device path: GB/s of fp32 input and memory passes (the
    time over one read of the input at the measured copy bandwidth)."""
    n = 1
    for d in shape:
        n *= d
    g = torch.randn(n, generator=torch.Generator().manual_seed(1))
    with force_device_path():
        t = timed(Roundtrip(name, g, shape, device), device, repeats)
    nbytes = 4 * n
    return {"numel": n, "seconds": t, "gb_per_s": nbytes / t / 1e9, "memory_passes": t / (nbytes / bandwidth)}


__all__ = ["compare", "throughput", "copy_bandwidth", "roundtrip", "Roundtrip", "TOLERANCE", "RANDOM"]
