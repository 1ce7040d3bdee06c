#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""ncu-summary.py: one table per Nsight Compute CSV (`ncu --csv --page raw --print-units base`, as
scripts/gpu-profile.sh writes them): per kernel, the number of launches profiled and the medians of
their time (us), SM throughput, tensor-pipe busy share (the busiest of the wgmma, imma and hmma
pipes), DRAM and L2 throughput, issue-slot use, active warps, and the three largest warp-stall
reasons (warps stalled per issued instruction).

Usage: scripts/ncu-summary.py FILE.csv...
"""
import csv
import re
import statistics
import sys

STALL = re.compile(r"^smsp__average_warps_issue_stalled_(\w+)_per_issue_active\.ratio$")
TENSOR = ("sm__pipe_tensor_op_gmma_cycles_active", "sm__pipe_tensor_op_imma_cycles_active",
          "sm__pipe_tensor_op_hmma_cycles_active")
COLUMNS = (("SM %", "sm__throughput.avg.pct_of_peak_sustained_elapsed"),
           ("DRAM %", "dram__throughput.avg.pct_of_peak_sustained_elapsed"),
           ("L2 %", "lts__throughput.avg.pct_of_peak_sustained_elapsed"),
           ("issue %", "smsp__issue_active.avg.pct_of_peak_sustained_active"),
           ("warps %", "sm__warps_active.avg.pct_of_peak_sustained_active"))


def number(s):
    try:
        return float(s.replace(",", ""))
    except ValueError:
        return None


def short_name(name):
    """The kernel's name without its parameter list, shortened to 60 characters."""
    depth, end = 0, len(name)
    for i in range(len(name) - 1, -1, -1):  # the last top-level "(...)" is the parameter list
        if name[i] == ")":
            depth += 1
        elif name[i] == "(":
            depth -= 1
            if depth == 0:
                end = i
                break
    base = re.sub(r"\s+", " ", name[:end].replace("void ", "")).strip()
    return base if len(base) <= 60 else base[:57] + "..."


def rows_of(path):
    with open(path, newline="", errors="replace") as f:
        lines = [l for l in f if l.startswith('"')]  # the report; the program's own output is skipped
    table = list(csv.reader(lines))
    if len(table) < 3 or "Kernel Name" not in table[0]:
        return None, []
    head = table[0]
    return head, [dict(zip(head, r)) for r in table[2:] if len(r) == len(head)]  # row 1: units


def summarize(path):
    head, rows = rows_of(path)
    print(f"== {path}")
    if not rows:
        print("   (no kernels profiled)")
        return
    kernels = {}
    for r in rows:
        kernels.setdefault(short_name(r["Kernel Name"]), []).append(r)

    def med(rs, metric):
        vals = [v for v in (number(r.get(metric, "")) for r in rs) if v is not None]
        return statistics.median(vals) if vals else None

    stalls = [m for m in head if STALL.match(m)]
    tensor = [m for m in head if m.split(".")[0] in TENSOR]
    print(f"   {'kernel':60} {'n':>4} {'us':>8} {'SM %':>6} {'tensor %':>8} " +
          " ".join(f"{c:>7}" for c, _ in COLUMNS[1:]) + "  stalls (warps per issue)")
    for name, rs in sorted(kernels.items(), key=lambda kv: -(med(kv[1], "gpu__time_duration.sum") or 0)):
        t = med(rs, "gpu__time_duration.sum")
        vals = [med(rs, m) for _, m in COLUMNS]
        ten = max((v for v in (med(rs, m) for m in tensor) if v is not None), default=None)
        top = sorted(((med(rs, m) or 0.0, STALL.match(m).group(1)) for m in stalls), reverse=True)[:3]

        def fmt(v, w):
            return f"{v:{w}.1f}" if v is not None else f"{'-':>{w}}"
        print(f"   {name:60} {len(rs):4d} {fmt(t / 1e3 if t else None, 8)} {fmt(vals[0], 6)} {fmt(ten, 8)} " +
              " ".join(fmt(v, 7) for v in vals[1:]) + "  " + ", ".join(f"{n} {v:.2f}" for v, n in top))


def main():
    if len(sys.argv) < 2:
        print(__doc__.strip())
        return 2
    for p in sys.argv[1:]:
        summarize(p)
    return 0


if __name__ == "__main__":
    sys.exit(main())
