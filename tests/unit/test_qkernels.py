"""The quantizers' block kernels (``ds_gravac.compress.qkernels``) against plain references written here: the
random stream, packing, table and affine decodes in every mode, and bounded scratch memory."""
from __future__ import annotations

import copy

import math

import pytest
import torch

from ds_gravac.compress import bitpack, qkernels
from ds_gravac.compress.base import CompressCtx, Payload
from ds_gravac.compress.qkernels import AffineDecoder, TableDecoder, Workspace, decode_sum, dither_, uniform_
from ds_gravac.compress.registry import lookup

WIDTHS = (1, 2, 4, 8)


def bits_of(t: torch.Tensor) -> torch.Tensor:
    """Bit patterns, so that −0.0 ≠ +0.0 and NaNs compare by payload."""
    return t.view(torch.int64 if t.dtype == torch.float64 else torch.int32)


def random_codes(n: int, bits: int, seed: int) -> torch.Tensor:
    return torch.randint(0, 1 << bits, (n,), generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("n", [1, 2, 3, 16, 1001, 70_000])
def test_uniform_is_torch_rand_with_neighbours_swapped(n: int) -> None:
    gen = torch.Generator()
    gen.manual_seed(11)
    ref = torch.rand(n, generator=gen)
    after = gen.get_state()
    gen.manual_seed(11)
    got = torch.empty(n)
    cut = n // 4 * 2                                        # two calls (an even first one) continue one stream
    uniform_(gen, got[:cut], Workspace())
    uniform_(gen, got[cut:], Workspace())
    pairs = n // 2 * 2
    swapped = ref.clone()
    swapped[:pairs] = ref[:pairs].view(-1, 2).flip(1).reshape(-1)
    assert torch.equal(got, swapped)
    assert torch.equal(gen.get_state(), after), "the generator advances exactly as torch.rand would"
    assert bool(((got >= 0) & (got < 1)).all())


def test_dither_is_uniform_on_its_grid_in_every_lane_and_continues_its_stream() -> None:
    """15-bit draws ``offset + (k + ½)/2^15``: on the grid, inside ``[offset, offset + 1)``, uniform in each of the
    four positions an int64 draw is cut into (the generator's int64 never sets its top bit: an unmasked top lane
    would only reach half the range), and two calls continue one stream."""
    n, offset = 1 << 20, 7.0
    gen = torch.Generator().manual_seed(3)
    u = dither_(gen, torch.empty(n), offset, Workspace()).double() - offset
    k = u * 2 ** 15 - 0.5
    assert torch.equal(k, k.round()) and float(k.min()) >= 0 and float(k.max()) <= 2 ** 15 - 1
    for lane in range(4):
        part = u[lane::4]
        assert abs(float(part.mean()) - 0.5) < 5 * math.sqrt(1 / 12 / part.numel()), lane
        counts = torch.histc(part, bins=16, min=0.0, max=1.0)
        expect = part.numel() / 16
        assert float(((counts - expect) ** 2 / expect).sum()) < 40.0, lane    # χ²(15): p ≈ 5e-4
    gen.manual_seed(9)
    whole = dither_(gen, torch.empty(1000), 0.0, Workspace())
    gen.manual_seed(9)
    parts = torch.cat([dither_(gen, torch.empty(400), 0.0, Workspace()), dither_(gen, torch.empty(600), 0.0,
                                                                                   Workspace())])
    assert torch.equal(whole, parts)


@pytest.mark.parametrize("bits", WIDTHS)
@pytest.mark.parametrize("n", [1, 15, 16, 17, 33, 1000, 300_017])
def test_encode_blocks_packs_like_bitpack(bits: int, n: int) -> None:
    codes = random_codes(n, bits, seed=n + bits)
    ref = torch.empty(bitpack.packed_words(n, bits), dtype=torch.int32)
    bitpack.pack(codes, bits, ref)
    words = torch.full_like(ref, -1)                        # garbage must be overwritten, tail included
    ws = Workspace()
    step = qkernels.chunk_size()
    floats = codes.to(torch.float64 if n % 2 else torch.float32)
    qkernels.encode_blocks(n, bits, words, step, lambda lo, hi: floats[lo:hi].clone(), ws)
    assert torch.equal(words, ref)


@pytest.mark.parametrize("bits", WIDTHS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("n", [4099, 300_001])
def test_table_decoder_matches_levels_in_every_mode(bits: int, dtype: torch.dtype, n: int) -> None:
    codes = random_codes(n, bits, seed=bits)
    words = torch.empty(bitpack.packed_words(n, bits), dtype=torch.int32)
    bitpack.pack(codes, bits, words)
    levels = torch.randn(1 << bits, dtype=dtype, generator=torch.Generator().manual_seed(3))
    levels[0] = -0.0                                        # "zero" mode must turn it into +0.0
    ref = levels[codes]
    ws = Workspace()
    src = words.view(torch.uint8)
    for offset in (0, 1, 3):                                # destinations not aligned to the gathered groups
        buf = torch.full((n + offset,), 5.0, dtype=dtype)
        out = buf[offset:]
        decode_sum([TableDecoder(levels, bits)], [src], n, out, "set", ws)
        assert torch.equal(bits_of(out), bits_of(ref))
        decode_sum([TableDecoder(levels, bits)], [src], n, out, "zero", ws)
        assert torch.equal(bits_of(out), bits_of(ref + 0.0))
        decode_sum([TableDecoder(levels, bits)], [src], n, out, "add", ws)
        assert torch.equal(bits_of(out), bits_of((ref + 0.0) + ref))


def test_decode_sum_rows_residual_and_strided_output() -> None:
    n, bits = 1000, 2
    ws = Workspace()
    rows, decs, ref = [], [], torch.zeros(n)
    for w in range(3):
        codes = random_codes(n, bits, seed=20 + w)
        words = torch.empty(bitpack.packed_words(n, bits), dtype=torch.int32)
        bitpack.pack(codes, bits, words)
        levels = torch.randn(4, generator=torch.Generator().manual_seed(w))
        rows.append(words.view(torch.uint8))
        decs.append(TableDecoder(levels, bits))
        ref += levels[codes]                                # zero, then accumulate in rank order
    res = torch.randn(n)
    out = torch.empty(2 * n)[::2]                           # not contiguous
    decode_sum(decs, rows, n, out, "zero", ws, residual=res)
    assert torch.equal(out, ref + res)


@pytest.mark.parametrize("block", [1, 10, 128])
@pytest.mark.parametrize("bits", [2, 4, 8])
def test_affine_decoder_is_the_elementwise_formula(block: int, bits: int) -> None:
    n, offset = 3001, -((1 << (bits - 1)) - 1)
    codes = random_codes(n, bits, seed=block)
    words = torch.empty(bitpack.packed_words(n, bits), dtype=torch.int32)
    bitpack.pack(codes, bits, words)
    nb = -(-n // block)
    factor = torch.rand(nb, generator=torch.Generator().manual_seed(1)) - 0.5
    factor[0] = 0.0                                         # (c + offset)·0 may be −0.0: "zero" mode lifts it
    ref = (codes.float() + offset) * factor.repeat_interleave(block)[:n]
    out = torch.empty(n)
    decode_sum([AffineDecoder(bits, float(offset), factor, block)], [words.view(torch.uint8)], n, out, "set",
               Workspace())
    assert torch.equal(bits_of(out), bits_of(ref))
    decode_sum([AffineDecoder(bits, float(offset), factor, block)], [words.view(torch.uint8)], n, out, "zero",
               Workspace())
    assert torch.equal(bits_of(out), bits_of(ref + 0.0))


def test_std64_is_the_population_std() -> None:
    x = torch.randn(100_003, generator=torch.Generator().manual_seed(4)) * 3 + 1e3
    assert float(qkernels.std64(x, Workspace())) == pytest.approx(float(x.double().std(correction=0)), rel=1e-12)


@pytest.mark.parametrize("name", ["onebit", "terngrad", "qsgd", "ternary", "tbq"])
def test_scratch_is_bounded_by_the_block_not_the_partition(name: str) -> None:
    """Per-call scratch lives in the compressor's workspace, sized by the block: a 4M-element partition needs no
    more than a 600k one, and a deep copy (the cost model's) starts empty."""
    cls = lookup(name)
    comp = cls()
    sizes = {}
    for n in (600_000, 4_000_000):
        x = torch.randn(n)
        plan = comp.plan(n, comp.cf_grid()[0])
        p = Payload.allocate(plan)
        ctx = CompressCtx(key="k", residual=x.clone(), memory={s: torch.zeros(n) for s in comp.Memory.slots})
        comp.compress(x, plan, p, ctx, update_state=True)
        y = torch.empty(n)
        comp.merge_decode([p, p], y, ctx)
        sizes[n] = comp.ws.nbytes()
    assert sizes[4_000_000] == sizes[600_000] <= 32 * qkernels.CHUNK * 4
    assert copy.deepcopy(comp).ws.nbytes() == 0
