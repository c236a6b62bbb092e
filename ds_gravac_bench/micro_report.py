"""What the micro-benchmark reports besides its rows: the machine and library versions the numbers were taken on,
and the printed tables (quantizer rows are printed by ``micro_quantizers``)."""
from __future__ import annotations

import os
import platform
import subprocess
import time
from importlib import metadata
from pathlib import Path
from typing import Any, Optional

import torch

from . import micro_quantizers as mq
from .micro_settings import PHASES, TARGET_EXTRA_X

ROOT = Path(__file__).resolve().parents[1]


def environment() -> dict[str, Any]:
    """Library versions, CPU, threads, git commit and date of the run."""
    def version(pkg: str) -> Optional[str]:
        try:
            return metadata.version(pkg)
        except metadata.PackageNotFoundError:
            return None

    cpu = platform.processor()
    try:
        with open("/proc/cpuinfo") as fh:
            cpu = next((ln.split(":", 1)[1].strip() for ln in fh if ln.startswith("model name")), cpu)
    except OSError:
        pass
    try:
        commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                                timeout=10).stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        commit = None
    return {"torch": torch.__version__, "deepspeed": version("deepspeed"), "numpy": version("numpy"),
            "torchvision": version("torchvision"), "python": platform.python_version(), "cpu_model": cpu,
            "cores": os.cpu_count(), "omp_num_threads": os.environ.get("OMP_NUM_THREADS"),
            "torch_threads": torch.get_num_threads(), "git_commit": commit,
            "date": time.strftime("%Y-%m-%dT%H:%M:%S%z")}


def print_table(report: dict[str, Any]) -> None:
    """The rows of every set as tables on stdout."""
    ms = 1e3
    for set_name, info in report["sets"].items():
        print(f"\n== {set_name}: {info['numel'] / 1e6:.1f}M elements in {info['tensors']} tensors, "
              f"t_pass {info['t_pass']['median'] * ms:.1f} ms (x.abs()), "
              f"{info['t_pass_out']['median'] * ms:.1f} ms (abs into preallocated buffers)")
        print(f"{'compressor':<18}{'level':>7}{'payload MB':>11}{'compress ms':>13}{'passes':>8}{'p/out':>7}"
              f"{'dec2 ms':>9}{'dec4 ms':>9}{'resid ms':>9}{'stage ms':>9}{'norm ms':>9}{'GB/s':>7}")
        for r in (r for r in report["results"] if r["set"] == set_name and "world_size" not in r):
            if "t_compress" not in r:
                print(f"{r['compressor']:<18}{r.get('level', 0):>7g}  {r.get('error') or r.get('skipped')}")
                continue
            print(f"{r['compressor']:<18}{r['level']:>7g}{r['payload_bytes'] / 2**20:>11.2f}"
                  f"{r['t_compress']['median'] * ms:>13.1f}{r['passes']['t_compress']:>8.2f}"
                  f"{r['passes_out']['t_compress']:>7.2f}"
                  f"{r['t_decompress_n2']['median'] * ms:>9.1f}{r['t_decompress_n4']['median'] * ms:>9.1f}"
                  f"{r['t_residual']['median'] * ms:>9.1f}{r['t_stage']['median'] * ms:>9.1f}"
                  f"{r['t_norm']['median'] * ms:>9.1f}{r['gbps_compress']:>7.2f}")
        print("passes (t / t_pass) per phase: stage, norm, compress, round 2, decode N=2, decode N=4, residual")
        for r in (r for r in report["results"] if r["set"] == set_name and "passes" in r and "world_size" not in r):
            print(f"{r['compressor']:<18}{r['level']:>7g}  " + "".join(f"{r['passes'][k]:>7.2f}" for k in PHASES))
        mq.print_rows(report, set_name)
        for key, label in (("naive_topk", "naive topk"), ("sampled_threshold", "1% sample thr")):
            for r in (r for r in report[key] if r["set"] == set_name):
                print(f"{label:<18}{r['level']:>7g}{'':>11}{r['t']['median'] * ms:>13.1f}{r['passes']:>8.2f}"
                      f"{r['passes_out']:>7.2f}")
        for r in (r for r in report["multilevel"] if r["set"] == set_name):
            print(f"multi-level {r['compressor']}: {' -> '.join(f'{lv:g}' for lv in r['levels'])}: "
                  f"{r['t_multi'] * ms:.1f} ms vs direct {r['t_direct'] * ms:.1f} ms (ratio {r['ratio']:.2f})")
        rows = [r for r in report["memory"] if r["set"] == set_name]
        if rows:
            print(f"extra memory per rank, x the model's fp32 gradient bytes ({info['grad_bytes'] / 2**20:.1f} MiB); "
                  f"target: Top-k with error feedback <= {TARGET_EXTRA_X:g} extra copies")
            print(f"{'compressor':<18}{'send':>6}  {'probes':<18}{'N':>3}{'memory':>8}{'codec':>7}{'recv':>7}"
                  f"{'total':>7}{'target':>8}   uncounted: {'bulk idx':>8}{'cache':>7}{'incl.':>7}"
                  f"{'dec peak':>9}  dense-classified")
        for r in rows:
            if "x" not in r:
                print(f"{r['compressor']:<18}  {r.get('error')}")
                continue
            x, u, g = r["x"], r["uncounted"], r["grad_bytes"]
            probes = ",".join(f"{p:g}" for p in r["probes"]) or "-"
            dc = r["dense_classified"]
            dense = (f"{dc['tensors']} tensors, {dc['flatten_transient_bytes'] / g:.3f} transient" if dc["tensors"]
                else "none")
            print(f"{r['compressor']:<18}{r['send_level']:>6g}  {probes:<18}{r['world_size']:>3}{x['memory']:>8.3f}"
                  f"{x['codec']:>7.3f}{x['recv']:>7.3f}{x['total']:>7.3f}"
                  f"{('<=' if r['within_target'] else '> ') + format(r['target_x'], 'g'):>8}   "
                  f"{'':>11}{u['bulk_index_bytes'] / g:>8.3f}{u['compressor_tensor_bytes'] / g:>7.3f}"
                  f"{r['x_incl_uncounted']:>7.3f}{u['decode_transient_peak_bytes_est'] / g:>9.3f}  {dense}")

