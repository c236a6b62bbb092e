"""Bit packing of quantizer codes: LSB-first layout in int32 words, checked against a pure-Python reference."""
from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from ds_gravac.compress import bitpack

WIDTHS = (1, 2, 4, 8, 16)


def reference_words(codes: list[int], bits: int) -> list[int]:
    """Element j at bit (j·b) mod 32 of word floor(j·b/32), tail bits 0, words read as signed int32."""
    words = [0] * ((len(codes) * bits + 31) // 32)
    for j, c in enumerate(codes):
        words[(j * bits) // 32] |= c << ((j * bits) % 32)
    return [w - (1 << 32) if w >= 1 << 31 else w for w in words]


def random_codes(n: int, bits: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 1 << bits, (n,), generator=g, dtype=torch.int64)


@pytest.mark.parametrize("bits", WIDTHS)
@pytest.mark.parametrize("n", [1, 2, 3, 7, 15, 16, 17, 31, 32, 33, 63, 64, 65, 1000, 4097])
def test_layout_matches_reference_and_round_trips(bits: int, n: int) -> None:
    codes = random_codes(n, bits, seed=n * 31 + bits)
    words = torch.full((bitpack.packed_words(n, bits),), -1, dtype=torch.int32)   # garbage: must be overwritten
    bitpack.pack(codes, bits, words)
    assert words.tolist() == reference_words(codes.tolist(), bits)
    back = bitpack.unpack(words, bits, n)
    assert back.dtype == (torch.int32 if bits == 16 else torch.uint8)
    assert torch.equal(back.long(), codes)


@pytest.mark.parametrize("bits", WIDTHS)
def test_word_count_and_all_ones(bits: int) -> None:
    for n in (1, 5, 32, 100):
        assert bitpack.packed_words(n, bits) == -(-n * bits // 32)
    n = 70
    words = torch.zeros(bitpack.packed_words(n, bits), dtype=torch.int32)
    bitpack.pack(torch.full((n,), (1 << bits) - 1), bits, words)
    full, tail = divmod(n * bits, 32)
    assert (words[:full] == -1).all()                     # every bit of a full word set
    if tail:
        assert int(words[full]) == (1 << tail) - 1        # only the used low bits of the last word


@pytest.mark.parametrize("bits", WIDTHS)
def test_pack_writes_only_its_view_of_a_larger_buffer(bits: int) -> None:
    n = 45
    w = bitpack.packed_words(n, bits)
    buf = torch.full((w + 6,), 0x5A5A5A5A, dtype=torch.int32)
    codes = random_codes(n, bits, seed=bits)
    bitpack.pack(codes, bits, buf[3:3 + w])
    assert (buf[:3] == 0x5A5A5A5A).all() and (buf[3 + w:] == 0x5A5A5A5A).all()
    assert torch.equal(bitpack.unpack(buf[3:3 + w], bits, n).long(), codes)


def test_bool_and_narrow_inputs_and_float_output() -> None:
    mask = torch.tensor([True, False, True, True] * 9)
    words = torch.empty(bitpack.packed_words(36, 1), dtype=torch.int32)
    bitpack.pack(mask, 1, words)
    assert words.tolist() == reference_words(mask.long().tolist(), 1)
    out = torch.full((36,), 9.0, dtype=torch.float64)
    assert bitpack.unpack(words, 1, 36, out=out) is out
    assert torch.equal(out, mask.double())
    codes = torch.tensor([65535, 0, 32768, 32767, 1], dtype=torch.int32)   # 16-bit: the sign bit of an int16
    words16 = torch.empty(bitpack.packed_words(5, 16), dtype=torch.int32)
    bitpack.pack(codes, 16, words16)
    assert words16.tolist() == reference_words(codes.tolist(), 16)
    assert bitpack.unpack(words16, 16, 5).tolist() == codes.tolist()


def test_unpacked_codes_never_alias_the_payload() -> None:
    words = torch.zeros(2, dtype=torch.int32)
    bitpack.pack(torch.arange(8), 8, words)
    codes = bitpack.unpack(words, 8, 8)
    codes.zero_()
    assert bitpack.unpack(words, 8, 8).tolist() == list(range(8))


@pytest.mark.parametrize("bits", [1, 2, 8])
def test_unpack_rows_equals_per_row_unpack(bits: int) -> None:
    n, r = 77, 4
    w = bitpack.packed_words(n, bits)
    rows = torch.empty(r, w, dtype=torch.int32)
    codes = [random_codes(n, bits, seed=10 + i) for i in range(r)]
    for i in range(r):
        bitpack.pack(codes[i], bits, rows[i])
    got = bitpack.unpack_rows(rows, bits, n)
    assert got.shape == (r, n) and torch.equal(got.long(), torch.stack(codes))


def test_invalid_widths_and_sizes_are_refused() -> None:
    with pytest.raises(ValueError):
        bitpack.packed_words(10, 3)
    with pytest.raises(ValueError):
        bitpack.pack(torch.zeros(10, dtype=torch.int64), 32, torch.zeros(10, dtype=torch.int32))
    with pytest.raises(ValueError):   # one word too many
        bitpack.pack(torch.zeros(33, dtype=torch.int64), 1, torch.zeros(3, dtype=torch.int32))
    with pytest.raises(ValueError):   # not int32 words
        bitpack.unpack(torch.zeros(2, dtype=torch.float32), 1, 64)
    with pytest.raises(ValueError):
        bitpack.unpack_rows(torch.zeros(2, 3, dtype=torch.int32), 1, 200)


@settings(max_examples=150, deadline=None, database=None)
@given(bits=st.sampled_from(WIDTHS), data=st.data())
def test_round_trip_fuzz(bits: int, data: st.DataObject) -> None:
    codes = data.draw(st.lists(st.integers(0, (1 << bits) - 1), min_size=1, max_size=300))
    words = torch.full((bitpack.packed_words(len(codes), bits),), -7, dtype=torch.int32)
    bitpack.pack(torch.tensor(codes), bits, words)
    assert words.tolist() == reference_words(codes, bits)
    assert bitpack.unpack(words, bits, len(codes)).tolist() == codes
