"""ds_gravac: gradient compression (GraVAC, Accordion, static) for DeepSpeed data-parallel training."""
import re
from pathlib import Path

from setuptools import find_packages, setup

VERSION = re.search(r'__version__ = "([^"]+)"', (Path(__file__).parent / "ds_gravac" / "version.py").read_text()).group(1)

setup(
    name="ds_gravac",
    version=VERSION,
    description="Compressed gradient synchronization for DeepSpeed: GraVAC adaptive compression, Accordion, "
                "static Top-k/DGC/RedSync/SIDCo/Random-k",
    long_description=open("README.md", encoding="utf-8").read(),
    long_description_content_type="text/markdown",
    # The library only: the training scripts (`runners/`) and the benchmark tools (`ds_gravac_bench/`) are examples
    # and development tools of the repository, not part of the installed package. `make setup` puts the
    # repository root on the development venv's path instead (a .pth file), so a script run as a file
    # (`deepspeed runners/train_cifar.py`) imports them there.
    packages=find_packages(include=["ds_gravac", "ds_gravac.*"]),
    python_requires=">=3.11",
    # Ranges, not pins: users keep their own CUDA builds of torch. constraints.txt pins the tested set.
    install_requires=["torch>=2.3", "deepspeed>=0.19.8,<0.20", "pydantic>=2", "tqdm"],
    extras_require={
        "hf": ["transformers>=5", "accelerate>=1.1"],
        "wandb": ["wandb>=0.31"],
        "bench": ["matplotlib", "torchvision", "psutil"],
        "test": ["pytest", "pytest-xdist", "hypothesis"],
    },
    entry_points={"ds_gravac.compressors": []},
    classifiers=["Programming Language :: Python :: 3.11", "Topic :: Scientific/Engineering :: Artificial Intelligence"],
)
