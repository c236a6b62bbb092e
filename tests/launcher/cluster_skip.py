"""Whether the emulated cluster can run here, asked the way the cluster itself would build one."""
from __future__ import annotations

import os
from pathlib import Path


def emulated_cluster_unavailable(where: Path, tag: int) -> str:
    """Why a test on the emulated cluster cannot run here ("" when it can): it needs root and a namespace with a
    veth pair and a tbf qdisc, built (and removed) under ``tag`` in ``where``."""
    if os.geteuid() != 0:
        return "needs root (CAP_NET_ADMIN) to create network namespaces"
    from ds_gravac_bench import netns
    from ds_gravac_bench.netns import ClusterError
    try:
        netns.check_prereqs()
        reason = netns.probe(where, tag)
    except ClusterError as err:
        reason = str(err)
    return f"cannot create network namespaces here: {reason}" if reason else ""
