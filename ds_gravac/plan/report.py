"""The plan as text (a table per bucket, a total row, the predicted exchange) or as JSON."""
from __future__ import annotations

import dataclasses
from typing import Any

from .compute import Plan

COLUMNS = ("bucket", "tensors", "numel", "family", "level", "exchange", "bytes sent", "dense bytes", "ratio")

LEGEND = {"dense": "tensors below min_compress_numel, or that the compressor does not take (or mode dense)",
          "dense (fallback)": "at this level the compressed exchange would not pay (sparse_fallback: at least "
                              "dense's bytes; cost_model: no predicted gain)",
          "dense (controller)": "the controller sends this step dense"}


def rate_text(rate_bit_s: float) -> str:
    for unit, size in (("Tbit/s", 1e12), ("Gbit/s", 1e9), ("Mbit/s", 1e6), ("kbit/s", 1e3)):
        if rate_bit_s >= size:
            return f"{rate_bit_s / size:g} {unit}"
    return f"{rate_bit_s:g} bit/s"


def _table(rows: list[tuple[str, ...]]) -> list[str]:
    """Columns right-aligned, except the text columns (family, level, exchange)."""
    widths = [max(len(r[i]) for r in rows) for i in range(len(COLUMNS))]
    left = {3, 4, 5}
    return ["  ".join(c.ljust(w) if i in left else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths))).rstrip()
            for r in rows]


def as_text(plan: Plan, title: str) -> str:
    lines = [title]
    if plan.mode:
        lines.append(f"mode {plan.mode}, compressor {plan.compressor}, selection {plan.selection}"
                     + (f", communication dtype {plan.comm_dtype}" if plan.comm_dtype else ""))
    if plan.start:
        lines.append(plan.start)
    lines += [f"note: {n}" for n in plan.notes]
    if plan.rows:
        lines.append(f"buckets at step {plan.step} as attach plans them (reverse registration order; step 0 "
                     f"re-plans them in backward order); bytes one rank sends:")
        lines.append("")
        rows = [COLUMNS]
        for r in plan.rows:
            rows.append((str(r.index), str(r.tensors), f"{r.numel:,}", r.family, r.level, r.exchange,
                         f"{r.bytes_sent:,.0f}", f"{r.dense_bytes:,.0f}",
                         f"{r.bytes_sent / r.dense_bytes:.3f}" if r.dense_bytes else "-"))
        rows.append(("total", str(sum(r.tensors for r in plan.rows)), f"{sum(r.numel for r in plan.rows):,}", "",
                     "", "", f"{plan.bytes_sent:,.0f}", f"{plan.dense_bytes:,.0f}", f"{plan.ratio:.3f}"))
        lines += _table(rows)
        families = {r.family for r in plan.rows}
        lines += [f"  {name}: {why}" for name, why in LEGEND.items() if name in families]
        fewer = f"{1.0 / plan.ratio:.2f}x fewer bytes" if plan.ratio > 0 else "nothing sent"
        lines.append(f"compression ratio: {plan.ratio:.3f} of dense's bytes ({fewer})")
        dense_s = sum(r.predicted_dense_s for r in plan.rows)
        plan_s = sum(r.predicted_s for r in plan.rows)
        lines.append("")
        lines.append(f"predicted exchange per step, nominal link {rate_text(plan.rate_bit_s)} + "
                     f"{plan.alpha_s * 1e3:g} ms per collective (cost model; wire time, no overlap):")
        lines.append(f"  dense {dense_s:.4f} s, this plan {plan_s:.4f} s"
                     + (f" ({dense_s / plan_s:.2f}x)" if plan_s > 0 else ""))
    lines.append("")
    if plan.refusals:
        lines.append(f"refused at attach ({len(plan.refusals)}):")
        lines += ["  " + msg.replace("\n", "\n    ") for msg in plan.refusals]
    else:
        lines.append("refusals: none")
    return "\n".join(lines)


def as_json(plan: Plan) -> dict[str, Any]:
    out = dataclasses.asdict(plan)
    out.update(bytes_sent=plan.bytes_sent, dense_bytes=plan.dense_bytes, ratio=plan.ratio,
               predicted_s=sum(r.predicted_s for r in plan.rows),
               predicted_dense_s=sum(r.predicted_dense_s for r in plan.rows))
    return out


__all__ = ["as_json", "as_text", "rate_text"]
