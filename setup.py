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
    # `runners` (training scripts and their shared code) and `ds_gravac_bench` (benchmark tools, emulated
    # cluster) are listed so that `pip install -e .` (what `make setup` runs) makes them importable in every
    # process of the environment. A script run as a file gets its own directory as sys.path[0], not the
    # repository root (`deepspeed runners/train_cifar.py`, ranks launched by the benchmarks), so without this
    # `import runners.common` would need a sys.path edit or PYTHONPATH. `ds_gravac` itself never imports them.
    packages=find_packages(include=["ds_gravac", "ds_gravac.*", "runners", "ds_gravac_bench"]),
    python_requires=">=3.11",
    # Ranges, not pins: users keep their own CUDA builds of torch. constraints.txt pins the tested set.
    install_requires=["torch>=2.3", "deepspeed>=0.19.8,<0.20", "pydantic>=2", "tqdm"],
    extras_require={
        "hf": ["transformers>=5", "accelerate>=1.1"],
        "wandb": ["wandb>=0.31"],
        "bench": ["matplotlib", "torchvision"],
        "test": ["pytest", "pytest-xdist", "hypothesis"],
    },
    entry_points={"ds_gravac.compressors": []},
    classifiers=["Programming Language :: Python :: 3.11", "Topic :: Scientific/Engineering :: Artificial Intelligence"],
)
