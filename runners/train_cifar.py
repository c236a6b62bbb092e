"""Image classification runner: ResNet101 / VGG16-bn (torchvision) on CIFAR-10/100 or synthetic images.

    deepspeed --num_gpus 2 runners/train_cifar.py --model resnet101 --deepspeed_config ds_configs/bench/gravac_topk.json
    torchrun --nproc_per_node 2 runners/train_cifar.py --model tiny_cnn --deepspeed_config ... --steps 20

``--system`` picks ds_gravac, plain DeepSpeed or torch DDP (+PowerSGD) with the same loop, data and optimizer.
Evaluation reports top-1 and top-5 accuracy on the held-out split (CIFAR test set, or unseen synthetic indices).
"""
from __future__ import annotations

import argparse
from typing import Any, Optional

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import Dataset, Subset

from runners import data as D
from runners.common import DistInfo, RunnerError, base_parser, finish_parser
from runners.loop import AllSum, Task, main
from runners.models import build_model
from runners.systems import System

CIFAR_CLASSES = {"cifar10": 10, "cifar100": 100}
CIFAR_MODELS = ("resnet101", "vgg16", "resnet18", "tiny_cnn", "mlp")


def parse_args(argv: Optional[list[str]] = None) -> argparse.Namespace:
    p = base_parser(__doc__.splitlines()[0])
    p.add_argument("--model", choices=CIFAR_MODELS, default="resnet101",
                   help="resnet101 / vgg16 (vgg16_bn) as in the paper; resnet18, tiny_cnn, mlp for quick runs, tests and the fidelity benchmark")
    p.add_argument("--dataset", choices=("synthetic", "cifar10", "cifar100"), default="synthetic")
    p.add_argument("--num-classes", type=int, default=10, help="classes of the synthetic dataset")
    p.add_argument("--image-size", type=int, default=32, help="side of synthetic images (CIFAR is 32)")
    p.add_argument("--synthetic-size", type=int, default=50000, help="synthetic training images (10000 held out)")
    p.add_argument("--synthetic-noise", type=float, default=4.0,
                   help="std of the Gaussian noise added to each unit-variance class template (the difficulty)")
    p.add_argument("--synthetic-shift", type=int, default=4, help="largest random shift of a template, in pixels")
    return finish_parser(p, argv)


class CifarTask(Task):
    name = "train_cifar"

    def __init__(self) -> None:
        self.train_set: Optional[Dataset] = None
        self.test_set: Optional[Dataset] = None
        self._orders: dict[int, list[int]] = {}

    def check_data(self, args: argparse.Namespace) -> None:
        """Real CIFAR is read before any distributed work, so missing files fail fast with one clear line.
        With --download the first local rank fetches in setup() while the others wait."""
        if args.dataset == "synthetic" or args.download:
            return
        try:
            self.train_set = D.load_cifar(args.data_dir, args.dataset, train=True)
            self.test_set = D.load_cifar(args.data_dir, args.dataset, train=False)
        except FileNotFoundError as exc:
            raise RunnerError(f"{exc} Or use --dataset synthetic.") from None

    def setup(self, args: argparse.Namespace, dist: DistInfo, micro_batch: int, device: torch.device) -> None:
        self.args, self.dist, self.device, self.mb = args, dist, device, micro_batch
        self.samples_per_micro_batch = micro_batch
        if args.dataset == "synthetic":
            self.num_classes = args.num_classes
            full = D.SyntheticImageDataset(args.num_classes, args.synthetic_size + 10000, seed=args.seed,
                                           image_size=args.image_size, noise=args.synthetic_noise,
                                           max_shift=args.synthetic_shift)
            self.train_set = Subset(full, range(args.synthetic_size))
            self.test_set = Subset(full, range(args.synthetic_size, args.synthetic_size + 10000))
        else:
            self.num_classes = CIFAR_CLASSES[args.dataset]
            if self.train_set is None:
                self._download(args, dist)
        self.shard = D.RankShard(dist.rank, dist.world_size)
        self.steps_per_epoch = len(self.train_set) // dist.world_size // micro_batch
        if self.steps_per_epoch < 1:
            raise RunnerError(f"{len(self.train_set)} training images are too few for {dist.world_size} ranks "
                              f"x micro batch {micro_batch}")

    def _download(self, args: argparse.Namespace, dist: DistInfo) -> None:
        """--download: the first local rank fetches the archive (it holds both splits), then everyone reads."""
        import torch.distributed as tdist

        if dist.local_rank == 0:
            D.load_cifar(args.data_dir, args.dataset, train=True, download=True)
        tdist.barrier()
        self.train_set = D.load_cifar(args.data_dir, args.dataset, train=True)
        self.test_set = D.load_cifar(args.data_dir, args.dataset, train=False)

    def build_model(self, args: argparse.Namespace) -> nn.Module:
        side = 32 if args.dataset != "synthetic" else args.image_size
        extra = {"in_features": 3 * side * side} if args.model == "mlp" else {}
        return build_model(args.model, num_classes=self.num_classes, **extra)

    def _order(self, epoch: int) -> list[int]:
        """This rank's shuffled shard for an epoch; one epoch cached (the loop walks forward)."""
        if epoch not in self._orders:
            self._orders = {epoch: self.shard.indices(len(self.train_set), epoch=epoch, seed=self.args.seed)}
        return self._orders[epoch]

    def micro_batch(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        epoch, b = divmod(index, self.steps_per_epoch)
        idx = self._order(epoch)[b * self.mb:(b + 1) * self.mb]
        return self._stack(self.train_set, idx)

    def _stack(self, dataset: Any, idx: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
        images, labels = zip(*(dataset[i] for i in idx))
        return torch.stack(images).to(self.device), torch.tensor(labels, dtype=torch.long).to(self.device)

    def loss(self, system: System, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        x, y = batch
        return F.cross_entropy(system.forward(x), y)

    def evaluate(self, module: nn.Module, max_batches: int, all_sum: AllSum) -> dict[str, float]:
        """Top-1/top-5 over this rank's shard of the held-out split, summed over ranks."""
        idx = self.shard.indices(len(self.test_set), shuffle=False, drop_last=True)
        if max_batches > 0:
            idx = idx[: max_batches * self.mb]
        sums = torch.zeros(4, dtype=torch.float64)
        k = min(5, self.num_classes)
        for start in range(0, len(idx), self.mb):
            x, y = self._stack(self.test_set, idx[start:start + self.mb])
            logits = module(x).float()
            top = logits.topk(k, dim=1).indices
            sums += torch.tensor([F.cross_entropy(logits, y, reduction="sum").item(),
                                  (top[:, 0] == y).sum().item(), (top == y[:, None]).any(dim=1).sum().item(),
                                  y.numel()], dtype=torch.float64)
        sums = all_sum(sums.to(self.device)).cpu()
        n = max(sums[3].item(), 1.0)
        return {"loss": sums[0].item() / n, "top1": sums[1].item() / n, "top5": sums[2].item() / n,
                "samples": sums[3].item()}


if __name__ == "__main__":
    main(CifarTask(), parse_args)
