"""Runner datasets and models: local-file readers, synthetic data, sharding, learnability, sizes."""

from __future__ import annotations

import os
import pickle
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F

pytest.importorskip("torchvision")

from runners.data import (  # noqa: E402
    CIFAR_STATS,
    RankShard,
    RankShardSampler,
    SyntheticImageDataset,
    load_cifar,
    shard_indices,
)
from runners.text_data import SyntheticTokenStream, batchify, get_bptt_batch, load_ptb  # noqa: E402
from runners.models import LSTMLanguageModel, build_model, count_parameters, detach_hidden  # noqa: E402

# ----------------------------------------------------------------------------------------------
# Tiny CIFAR directories in torchvision's on-disk pickle layout
# ----------------------------------------------------------------------------------------------


def _dump(path: Path, obj: dict) -> None:
    with open(path, "wb") as f:
        pickle.dump(obj, f, protocol=2)


def _images(n: int, offset: int) -> np.ndarray:
    """Rows of 3072 uint8 (R plane, G plane, B plane; each 32x32 row-major) with a known pattern."""
    return ((np.arange(n * 3072).reshape(n, 3072) + offset) % 251).astype(np.uint8)


def _write_cifar10(root: Path, per_batch: int = 4) -> dict:
    base = root / "cifar-10-batches-py"
    base.mkdir(parents=True)
    batches = {}
    for b in range(1, 6):
        data, labels = _images(per_batch, b), [(b + i) % 10 for i in range(per_batch)]
        _dump(base / f"data_batch_{b}", {"batch_label": f"training batch {b} of 5", "data": data,
                                          "labels": labels, "filenames": [f"x{i}.png" for i in range(per_batch)]})
        batches[f"data_batch_{b}"] = (data, labels)
    data, labels = _images(3, 7), [9, 0, 4]
    _dump(base / "test_batch", {"batch_label": "testing batch 1 of 1", "data": data, "labels": labels,
                                "filenames": ["t0.png", "t1.png", "t2.png"]})
    batches["test_batch"] = (data, labels)
    _dump(base / "batches.meta", {"label_names": [f"c{i}" for i in range(10)], "num_cases_per_batch": per_batch,
                                  "num_vis": 3072})
    return batches


def _write_cifar100(root: Path) -> dict:
    base = root / "cifar-100-python"
    base.mkdir(parents=True)
    out = {}
    for name, n in (("train", 6), ("test", 2)):
        data, fine = _images(n, n), [(17 * i + 3) % 100 for i in range(n)]
        _dump(base / name, {"filenames": [f"{name}{i}.png" for i in range(n)], "batch_label": name,
                            "fine_labels": fine, "coarse_labels": [f // 5 for f in fine], "data": data})
        out[name] = (data, fine)
    _dump(base / "meta", {"fine_label_names": [f"f{i}" for i in range(100)],
                          "coarse_label_names": [f"k{i}" for i in range(20)]})
    return out


def _expected(row: np.ndarray, name: str) -> torch.Tensor:
    mean, std = CIFAR_STATS[name]
    x = torch.from_numpy(row.reshape(3, 32, 32).astype(np.float32) / 255.0)
    return (x - torch.tensor(mean).view(3, 1, 1)) / torch.tensor(std).view(3, 1, 1)


def test_cifar10_tiny_files_load_with_layout_and_labels(tmp_path: Path) -> None:
    batches = _write_cifar10(tmp_path)
    train = load_cifar(str(tmp_path), "cifar10", train=True)
    test = load_cifar(str(tmp_path), "cifar10", train=False)
    assert len(train) == 20 and len(test) == 3
    assert train.classes == [f"c{i}" for i in range(10)]
    assert [train[i][1] for i in range(len(train))] == sum((batches[f"data_batch_{b}"][1] for b in range(1, 6)), [])
    data, labels = batches["test_batch"]
    for i in range(3):
        x, y = test[i]
        assert x.shape == (3, 32, 32) and x.dtype == torch.float32 and y == labels[i]
        torch.testing.assert_close(x, _expected(data[i], "cifar10"), atol=1e-5, rtol=0)
    assert train[0][0].shape == (3, 32, 32)  # augmented path: crop+flip keep the shape
    clone = pickle.loads(pickle.dumps(test))  # spawn-based DataLoader workers pickle the dataset
    assert len(clone) == 3 and torch.equal(clone[2][0], test[2][0])


def test_cifar100_tiny_files_load_fine_labels(tmp_path: Path) -> None:
    out = _write_cifar100(tmp_path)
    train = load_cifar(str(tmp_path), "cifar100", train=True)
    test = load_cifar(str(tmp_path / "cifar-100-python"), "cifar100", train=False)  # sub-dir accepted
    assert len(train) == 6 and len(test) == 2 and len(train.classes) == 100
    assert [train[i][1] for i in range(6)] == out["train"][1]
    x, y = test[1]
    assert y == out["test"][1][1]
    torch.testing.assert_close(x, _expected(out["test"][0][1], "cifar100"), atol=1e-5, rtol=0)


def _no_network(monkeypatch: pytest.MonkeyPatch) -> None:
    import torchvision.datasets.cifar as tv_cifar

    def boom(*a, **k):
        raise AssertionError("download attempted")

    monkeypatch.setattr(tv_cifar, "download_and_extract_archive", boom)


@pytest.mark.parametrize(
    "name,folder,files",
    [
        ("cifar10", "cifar-10-batches-py", ["data_batch_1", "data_batch_5", "test_batch", "batches.meta"]),
        ("cifar100", "cifar-100-python", ["train", "test", "meta"]),
    ],
)
def test_cifar_missing_raises_clear_error(tmp_path: Path, monkeypatch, name, folder, files) -> None:
    _no_network(monkeypatch)
    with pytest.raises(FileNotFoundError) as exc:
        load_cifar(str(tmp_path), name, train=True)
    msg = str(exc.value)
    assert str(tmp_path / folder) in msg and "--download" in msg
    assert all(f in msg for f in files)


def test_cifar_partially_missing_names_the_file(tmp_path: Path, monkeypatch) -> None:
    _no_network(monkeypatch)
    _write_cifar10(tmp_path)
    os.remove(tmp_path / "cifar-10-batches-py" / "data_batch_3")
    with pytest.raises(FileNotFoundError, match=r"missing: data_batch_3"):
        load_cifar(str(tmp_path), "cifar10", train=False)
    with pytest.raises(ValueError):
        load_cifar(str(tmp_path), "svhn", train=True)


# ----------------------------------------------------------------------------------------------
# PTB and LM batching
# ----------------------------------------------------------------------------------------------


def _write_ptb(d: Path) -> None:
    (d / "ptb.train.txt").write_text(" the cat sat \n the dog <unk> ran \n")
    (d / "ptb.valid.txt").write_text(" the cat ran \n")
    (d / "ptb.test.txt").write_text(" a dog sat \n")


def test_ptb_reads_vocab_from_train_and_appends_eos(tmp_path: Path) -> None:
    _write_ptb(tmp_path)
    c = load_ptb(str(tmp_path))
    assert c.vocab == ["the", "cat", "sat", "<eos>", "dog", "<unk>", "ran"]
    words = lambda t: [c.vocab[i] for i in t.tolist()]  # noqa: E731
    assert words(c.train) == "the cat sat <eos> the dog <unk> ran <eos>".split()
    assert words(c.valid) == "the cat ran <eos>".split()
    assert words(c.test) == "<unk> dog sat <eos>".split()  # 'a' is not in the training vocabulary
    assert c.train.dtype == torch.long and c.vocab_size == 7 and c.word2idx["dog"] == 4


def test_ptb_missing_files_named(tmp_path: Path) -> None:
    (tmp_path / "ptb.train.txt").write_text("a b\n")
    with pytest.raises(FileNotFoundError, match=r"ptb\.valid\.txt, ptb\.test\.txt\)"):
        load_ptb(str(tmp_path))


def test_batchify_and_bptt_layout() -> None:
    tokens = torch.arange(103)
    src = batchify(tokens, 4)
    assert src.shape == (25, 4)
    assert torch.equal(src[:, 1], torch.arange(25, 50))  # column b is the b-th contiguous chunk
    x, y = get_bptt_batch(src, 0, 10)
    assert x.shape == y.shape == (10, 4) and torch.equal(y, src[1:11])
    x, y = get_bptt_batch(src, 20, 10)  # the last batch is shorter
    assert x.shape == (4, 4) and torch.equal(y[-1], src[-1])
    with pytest.raises(IndexError):
        get_bptt_batch(src, 24, 10)


# ----------------------------------------------------------------------------------------------
# Synthetic data: determinism
# ----------------------------------------------------------------------------------------------


def test_synthetic_images_deterministic_per_seed() -> None:
    a, b, c = (SyntheticImageDataset(10, 1000, seed=s) for s in (5, 5, 6))
    xa, ya = a[123]
    _ = b[7]  # access order must not matter
    xb, yb = b[123]
    assert xa.shape == (3, 32, 32) and xa.dtype == torch.float32 and isinstance(ya, int)
    assert torch.equal(xa, xb) and ya == yb and a.label(123) == ya
    assert not torch.equal(a.templates, c.templates) and not torch.equal(xa, c[123][0])
    assert not torch.equal(a[0][0], a[1][0])
    labels = torch.tensor([a.label(i) for i in range(1000)])
    assert labels.min() >= 0 and labels.max() <= 9 and torch.bincount(labels, minlength=10).min() > 50
    assert 0.8 < float(torch.stack([a[i][0] for i in range(64)]).std()) < 1.2  # roughly normalised
    with pytest.raises(IndexError):
        a[1000]


def test_token_stream_deterministic_and_follows_chain() -> None:
    a, b, c = (SyntheticTokenStream(64, 5000, seed=s, branching=3) for s in (1, 1, 2))
    assert a.tokens.dtype == torch.long and a.tokens.shape == (5000,)
    assert torch.equal(a.tokens, b.tokens) and not torch.equal(a.tokens, c.tokens)
    assert 0 <= int(a.tokens.min()) and int(a.tokens.max()) < 64
    prev, nxt = a.tokens[:-1], a.tokens[1:]
    legal = (a.successors[prev] == nxt.unsqueeze(1)).any(dim=1)
    assert int((~legal).sum()) <= 4  # only the junctions between parallel chains (5000 // 1024 = 4 chains)


def test_zipf_stream_skews_word_frequencies_and_keeps_the_chain() -> None:
    uniform = SyntheticTokenStream(500, 40000, seed=5)
    zipf = SyntheticTokenStream(500, 40000, seed=5, zipf=0.8)
    assert torch.equal(SyntheticTokenStream(500, 40000, seed=5, zipf=0.0).tokens, uniform.tokens)  # old stream kept

    def unigram_entropy(s: SyntheticTokenStream) -> float:
        p = torch.bincount(s.tokens, minlength=500).double() / s.num_tokens
        return float(-(p[p > 0] * p[p > 0].log()).sum())
    assert unigram_entropy(zipf) < unigram_entropy(uniform) - 0.3
    # successors are ranked: the most frequent successor ids are the low ones
    counts = torch.bincount(zipf.successors.reshape(-1), minlength=500)
    assert counts[:50].sum() > 2 * counts[250:300].sum()
    prev, nxt = zipf.tokens[:-1], zipf.tokens[1:]
    assert int((~(zipf.successors[prev] == nxt.unsqueeze(1)).any(dim=1)).sum()) <= 40000 // 1024
    with pytest.raises(ValueError, match="zipf"):
        SyntheticTokenStream(50, 500, seed=1, zipf=-1.0)


def test_entropy_floor_matches_oracle_cross_entropy() -> None:
    s = SyntheticTokenStream(40, 50000, seed=4, branching=4)
    trans = torch.zeros(40, 40, dtype=torch.float64)
    trans.index_put_((torch.arange(40).repeat_interleave(4), s.successors.reshape(-1)),
                     s.probs.reshape(-1).double(), accumulate=True)
    prev, nxt = s.tokens[:-1], s.tokens[1:]
    p = trans[prev, nxt]
    assert int((p == 0).sum()) < 50000 // 1024  # chain junctions only
    oracle = float(-torch.log(p[p > 0]).mean())
    floor = s.entropy_floor()
    assert 0.0 < floor < np.log(4) + 1e-9
    assert abs(oracle - floor) < 0.03
    corpus = s.corpus(0.1, 0.1)
    assert corpus.vocab_size == 40 and len(corpus.train) == 40000 and len(corpus.valid) == len(corpus.test) == 5000


# ----------------------------------------------------------------------------------------------
# Rank sharding
# ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("n,world", [(100, 4), (103, 3), (7, 2), (10, 1)])
def test_image_shards_disjoint_and_cover(n: int, world: int) -> None:
    shards = [shard_indices(n, r, world, epoch=2, seed=9) for r in range(world)]
    flat = sum(shards, [])
    assert len(set(flat)) == len(flat) == n - n % world  # disjoint; only a < world tail is dropped
    assert len({len(s) for s in shards}) == 1
    padded = [shard_indices(n, r, world, epoch=2, seed=9, drop_last=False) for r in range(world)]
    assert set(sum(padded, [])) == set(range(n)) and len({len(s) for s in padded}) == 1
    assert shards == [shard_indices(n, r, world, epoch=2, seed=9) for r in range(world)]


def test_shards_reshuffle_per_epoch_and_sampler() -> None:
    assert shard_indices(100, 0, 2, epoch=0) != shard_indices(100, 0, 2, epoch=1)
    assert shard_indices(10, 1, 2, shuffle=False) == [1, 3, 5, 7, 9]
    shard = RankShard(1, 2)
    sampler = shard.sampler(11, seed=3)
    assert isinstance(sampler, RankShardSampler) and len(sampler) == 5
    sampler.set_epoch(4)
    assert list(sampler) == shard_indices(11, 1, 2, epoch=4, seed=3)
    assert shard.indices(11, epoch=4, seed=3) == list(sampler)
    with pytest.raises(ValueError):
        RankShard(2, 2)


def test_token_shards_contiguous(monkeypatch) -> None:
    tokens = torch.arange(1003)
    parts = [RankShard(r, 4).tokens(tokens) for r in range(4)]
    assert all(p.numel() == 250 for p in parts)
    assert torch.equal(torch.cat(parts), tokens[:1000])
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "3")
    assert RankShard.from_env() == RankShard(1, 3)


# ----------------------------------------------------------------------------------------------
# Learnability
# ----------------------------------------------------------------------------------------------


def test_synthetic_images_are_learnable_by_tiny_cnn() -> None:
    torch.manual_seed(0)
    ds = SyntheticImageDataset(10, 80 * 32, seed=1)
    model = build_model("tiny_cnn", num_classes=10)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    losses, acc_first = [], None
    for step in range(80):
        xs, ys = zip(*(ds[i] for i in range(step * 32, (step + 1) * 32)))
        x, y = torch.stack(xs), torch.tensor(ys)
        out = model(x)
        loss = F.cross_entropy(out, y)
        if acc_first is None:
            acc_first = float((out.argmax(1) == y).float().mean())
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert acc_first < 1.0
    assert np.mean(losses[-10:]) < 0.8 * np.mean(losses[:10])


def test_token_stream_is_learnable_by_tiny_lstm() -> None:
    torch.manual_seed(0)
    stream = SyntheticTokenStream(50, 60000, seed=3, branching=3)
    src = batchify(stream.tokens, 20)
    model = build_model("lstm", vocab_size=50, size="tiny", dropout=0.0)
    opt = torch.optim.Adam(model.parameters(), lr=3e-2)
    hidden, losses = model.init_hidden(20), []
    for i in range(0, 80 * 35, 35):
        x, y = get_bptt_batch(src, i, 35)
        hidden = model.detach_hidden(hidden)
        out, hidden = model(x, hidden)
        loss = F.cross_entropy(out.reshape(-1, 50), y.reshape(-1))
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert np.mean(losses[-10:]) < 0.8 * np.mean(losses[:10])
    assert np.mean(losses[-10:]) > 0.9 * stream.entropy_floor()  # cannot beat the floor


# ----------------------------------------------------------------------------------------------
# Models
# ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "name,kw,millions",
    [
        ("resnet101", {"num_classes": 10}, 42.5),
        ("vgg16", {"num_classes": 100}, 134.7),
        ("resnet18", {"num_classes": 10}, 11.2),
        ("lstm", {"vocab_size": 10000, "size": "large"}, 66.0),
    ],
)
def test_parameter_counts_match_spec(name: str, kw: dict, millions: float) -> None:
    with torch.device("meta"):  # no memory, no init cost; counts are what matter
        model = build_model(name, **kw)
    assert round(count_parameters(model) / 1e6, 1) == millions


def test_lstm_shapes_hidden_carry_and_tying() -> None:
    model = LSTMLanguageModel(30, 16, 16, num_layers=2, dropout=0.0, tie_weights=True)
    assert count_parameters(model) == count_parameters(LSTMLanguageModel(30, 16, 16, dropout=0.0)) - 30 * 16
    h = model.init_hidden(3)
    assert h[0].shape == h[1].shape == (2, 3, 16)
    out, h = model(torch.randint(30, (5, 3)), h)
    assert out.shape == (5, 3, 30) and h[0].requires_grad
    h2 = detach_hidden(h)
    assert not h2[0].requires_grad and torch.equal(h2[0], h[0])
    with pytest.raises(ValueError):
        LSTMLanguageModel(30, 16, 8, tie_weights=True)


def test_small_models_forward_and_unknown_name() -> None:
    assert build_model("tiny_cnn", num_classes=7)(torch.randn(2, 3, 32, 32)).shape == (2, 7)
    assert count_parameters(build_model("tiny_cnn")) < 20000
    with pytest.raises(ValueError):
        build_model("alexnet")
    with pytest.raises(ValueError):
        build_model("lstm", size="huge")


def test_synthetic_noise_and_shift_are_the_difficulty_and_are_checked() -> None:
    """The long benchmark's images: same labels and templates at any noise; more noise moves a sample further from
    its template; a negative noise or a shift as wide as the image is refused."""
    quiet, loud = SyntheticImageDataset(100, 64, seed=1, noise=4.0), SyntheticImageDataset(100, 64, seed=1, noise=12.0)
    assert torch.equal(quiet.templates, loud.templates) and quiet.label(5) == loud.label(5)

    def template_share(d: SyntheticImageDataset) -> float:
        x = torch.stack([d[i][0] for i in range(64)]).flatten(1)
        t = torch.stack([torch.roll(d.templates[d._draw(i)[0]], shifts=(d._draw(i)[2], d._draw(i)[1]), dims=(1, 2))
                         for i in range(64)]).flatten(1)
        return float(F.cosine_similarity(x, t).mean())

    assert template_share(loud) < template_share(quiet) / 2      # 1/sqrt(1 + 144) against 1/sqrt(1 + 16)
    for kwargs in ({"noise": -1.0}, {"noise": float("nan")}, {"max_shift": 32}, {"max_shift": -1}):
        with pytest.raises(ValueError, match="noise >= 0"):
            SyntheticImageDataset(10, 8, seed=0, **kwargs)
