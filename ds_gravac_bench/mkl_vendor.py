"""Build the preload shim that lets MKL take its Intel kernels on an AMD CPU, so one machine can continue a seed
kept on another.

Why: a loss curve follows the kernels that made it, and MKL picks its kernels by vendor, not only by instruction
set. On an AMD EPYC with AVX-512 MKL takes a generic path whatever the caps (`MKL_ENABLE_INSTRUCTIONS`, `MKL_CBWR`),
so the machine cannot give back a curve kept on an Intel Xeon (docs/BENCHMARKS_LONG.md, "Cost"). MKL asks
``mkl_serv_intel_cpu_true`` whether the CPU is Intel's; libtorch exports that symbol without ``-Bsymbolic``, so a
preloaded library that answers 1 is the one MKL calls. Measured: with it, `resnet18_long` seed 0's dense run on an
AVX-512 AMD EPYC equals the Intel Xeon's bit for bit. Whether it does on a given machine is what the machine check
(``machine_check.py``) tells, never this module.

    python -m ds_gravac_bench.mkl_vendor            # builds runs/mkl_vendor/libmkl_as_intel.so, prints the export
    export LD_PRELOAD=$PWD/runs/mkl_vendor/libmkl_as_intel.so
"""
from __future__ import annotations

import argparse
import shutil
import subprocess
from pathlib import Path
from typing import Optional, Sequence

SOURCE = """/* ds_gravac_bench.mkl_vendor: MKL asks these whether the CPU is Intel's; answer yes. */
int mkl_serv_intel_cpu_true(void) { return 1; }
int mkl_serv_intel_cpu(void) { return 1; }
"""
LIBRARY = "libmkl_as_intel.so"
DEFAULT_DIR = Path("runs") / "mkl_vendor"


def build(out_dir: Path = DEFAULT_DIR, compiler: Optional[str] = None) -> Path:
    """Compile the shim into ``out_dir`` (``cc`` or ``gcc``) and return the library's absolute path."""
    cc = compiler or shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        raise SystemExit("mkl_vendor: no C compiler (cc or gcc) on PATH to build the shim with")
    out_dir.mkdir(parents=True, exist_ok=True)
    src = out_dir / "mkl_as_intel.c"
    src.write_text(SOURCE)
    lib = (out_dir / LIBRARY).resolve()
    subprocess.run([cc, "-shared", "-fPIC", "-O2", "-o", str(lib), str(src)], check=True)
    return lib


def main(argv: Optional[Sequence[str]] = None) -> None:
    p = argparse.ArgumentParser(prog="python -m ds_gravac_bench.mkl_vendor", description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, default=DEFAULT_DIR, help="directory for the library (default: %(default)s)")
    p.add_argument("--cc", default=None, help="C compiler (default: cc, else gcc)")
    a = p.parse_args(argv)
    print(f"export LD_PRELOAD={build(a.out, a.cc)}")


if __name__ == "__main__":
    main()
