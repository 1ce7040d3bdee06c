#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""perf-report.py: docs/performance.md from the benchmarks' JSON results (bench/results/*.json).

Every *.json file of the results folder holds rows of one benchmark run, either as a JSON list or
as one JSON object per line (what the benchmarks print with --json; other lines are skipped).
A file's kind is read from its rows' keys:
  case, backend          `bie bench --json` (backend cpu or ref) or `bie_bench_cuda --json` (cuda):
                         bie_ms, baseline, baseline_ms, speedup, gops, device, date, ...
  layer, shape, mode     `python3 python/bench_modules.py --json`: bie_ms, baseline, baseline_ms,
                         speedup, device, threads, dtype, torch, date
  model, batch, mode     `python3 python/bench_networks.py --json`: bie_ms, baseline, baseline_ms,
                         speedup (or ratio), peak_mib (and baseline_peak_mib), device, date
A row that holds a "note" (alone or beside the above) adds that sentence to its section, and a
"transcribed" field says where figures come from that were not printed as JSON by the run.
speedup (ratio) is always baseline_ms / bie_ms: above 1, bie is faster.

Usage:
  scripts/perf-report.py [--results DIR] [--output FILE]   write docs/performance.md
  scripts/perf-report.py --check                           exit 1 if the committed page differs
  scripts/perf-report.py --table FILE...                   print result files' rows as plain text
`make perf-doc` runs the first form.
"""
import argparse
import glob
import json
import os
import sys
import textwrap

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

BASELINES = {
    "openblas-sgemm": "OpenBLAS sgemm",
    "im2col+openblas-sgemm": "im2col + OpenBLAS sgemm",
    "openblas-sgemm-step": "the float step (3 OpenBLAS sgemm)",
    "openblas-sgemv": "OpenBLAS sgemv",
    "cublas-fp16": "cuBLAS fp16",
    "cublas-int8": "cuBLAS int8",
    "cublas-fp16x3": "3 cuBLAS fp16 GEMMs",
    "cudnn-fp16": "cuDNN fp16 NHWC",
}
ISA_ORDER = ["scalar", "avx2", "avx512", "avx512vpopcnt"]


def load(path):
    """The rows of one result file (a JSON list, one object, or one object per line)."""
    with open(path, encoding="utf-8") as f:
        text = f.read()
    try:
        data = json.loads(text)
        rows = data if isinstance(data, list) else [data]
    except json.JSONDecodeError:
        rows = []
        for n, line in enumerate(text.splitlines(), 1):
            if line.lstrip().startswith("{"):
                try:
                    rows.append(json.loads(line))
                except json.JSONDecodeError as e:
                    sys.exit(f"perf-report: {path}:{n}: {e}")
    return [r for r in rows if isinstance(r, dict)]


def kind_of(rows):
    for r in rows:
        if "case" in r and "backend" in r:
            return "cuda" if r["backend"] == "cuda" else "cpu"
        if "layer" in r:
            return "modules"
        if "model" in r:
            return "networks"
    return None


def ms(v):
    """A time in milliseconds, with about four significant digits."""
    if v is None or v < 0:
        return "-"
    return f"{v:.1f}" if v >= 100 else f"{v:.2f}" if v >= 10 else f"{v:.3f}" if v >= 1 else f"{v:.4f}"


def ratio(r):
    v = r.get("speedup", r.get("ratio"))
    if v is None and r.get("bie_ms") and r.get("baseline_ms"):
        v = r["baseline_ms"] / r["bie_ms"]
    return "-" if v is None or v <= 0 else f"{v:.2f}x"  # (0: no baseline time in the run)


def baseline(name):
    return BASELINES.get(name, name)


def para(*texts):
    """A paragraph wrapped at 100 columns, then a blank line."""
    text = " ".join(t for t in texts if t)
    return textwrap.wrap(text, 100, break_long_words=False, break_on_hyphens=False) + [""]


def table(header, rows):
    numeric = ("ms", "OPS", "MiB", "baseline)", "ratio", "float/bie", "GB/s", "of copy", "threads")
    out = ["| " + " | ".join(header) + " |",
           "|" + "|".join("---:" if i and h.endswith(numeric) else "---" for i, h in enumerate(header)) + "|"]
    out += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return out


def dates(rows):
    ds = sorted({r["date"] for r in rows if r.get("date")})
    return "unknown date" if not ds else ds[0] if len(ds) == 1 else f"{ds[0]} to {ds[-1]}"


def notes(rows):
    seen, out = set(), []
    for key in ("transcribed", "note"):
        for r in rows:
            t = r.get(key)
            if t and t not in seen:
                seen.add(t)
                out.append(t)
    return out


def note_lines(rows):
    n = notes(rows)
    return para(*n) if n else []


def group_by(rows, key):
    groups = {}
    for r in rows:
        groups.setdefault(key(r), []).append(r)
    return groups


def cpu_shapes():
    """Case name -> shape words, from bench/shapes/*.txt."""
    shapes = {}
    for path in sorted(glob.glob(os.path.join(ROOT, "bench", "shapes", "*.txt"))):
        with open(path, encoding="utf-8") as f:
            for line in f:
                w = line.split("#", 1)[0].split()
                if len(w) < 2:
                    continue
                kv = dict(x.split("=", 1) for x in w[2:] if "=" in x)
                if w[0] == "conv":
                    s = f"B={kv.get('B')} C={kv.get('C')} {kv.get('H')}x{kv.get('W')} O={kv.get('O')} k{kv.get('k')}"
                    if kv.get("s", "1") != "1":
                        s += f" s{kv['s']}"
                else:
                    s = f"M={kv.get('M')} K={kv.get('K')} N={kv.get('N')}"
                shapes.setdefault(w[1], s)
    return shapes


def text(key):
    """Entry key of scripts/perf-report-text.json (the page's fixed prose)."""
    with open(os.path.join(ROOT, "scripts", "perf-report-text.json"), encoding="utf-8") as f:
        return json.load(f)[key]


def intro(part):
    """The paragraphs that open a part of the page."""
    return [" ".join(lines) for lines in text("intro")[part]]


def sections(part, rows):
    """The sections of part ("cpu" or "cuda") that select some of rows (by case prefix): each as its
    heading and description lines, and the rows it selects."""
    for s in text(part):
        sel = [r for r in rows if r["case"].startswith(tuple(s["prefixes"]))]
        if sel:
            yield [f"### {s['title']}", ""] + para(" ".join(s["text"])), sel


def cpu_part(rows, files):
    out = []
    shapes = cpu_shapes()
    for device, drows in group_by(rows, lambda r: r.get("device", "unknown CPU")).items():
        isas = sorted({r.get("isa", "") for r in drows}, key=lambda i: ISA_ORDER.index(i) if i in ISA_ORDER else -1)
        top, low = isas[-1], isas[-2::-1]  # the best level, then the lower ones from the top down
        main = [r for r in drows if r.get("isa", "") == top]
        threads = sorted({r["threads"] for r in main})
        r0 = main[0]
        out += [f"## CPU: {device}", ""]
        out += para(f"Measured {dates(drows)} on {device} ({r0.get('cpus', '?')} logical CPUs), bie at its ISA "
                    f"level {top}" + (f", against {r0['blas']}" if r0.get("blas") else "") + ". Command: "
                    "`bie bench --json --repeat 5` (1 thread and all threads; medians of 5 timed runs after a "
                    "warm-up)" + (f", and with `BIE_CPU_ISA` capping bie at {' and '.join(low)} (1 thread, the "
                                  "baseline timed again in each run)" if low else "") + ".",
                    f"Files: {', '.join(files)}.")
        out += note_lines(drows)
        for head, sel in sections("cpu", main):
            out += head
            header = ["case", "shape", "baseline"]
            for t in threads:
                header += [f"{t} thr: bie ms", "baseline ms", "ratio"] + (["GOPS"] if t == threads[0] else [])
            for i in low:
                header += [f"{i}: bie ms", "ratio"]
            body = []
            for case, crows in group_by(sel, lambda r: r["case"]).items():
                by_t = {r["threads"]: r for r in crows}
                line = [f"`{case}`", shapes.get(case, ""), baseline(crows[0]["baseline"])]
                for t in threads:
                    r = by_t.get(t)
                    line += [ms(r["bie_ms"]), ms(r["baseline_ms"]), ratio(r)] if r else ["-"] * 3
                    if t == threads[0]:
                        line.append(f"{r['gops']:.0f}" if r else "-")
                for i in low:
                    lr = [x for x in drows if x.get("isa") == i and x["case"] == case]
                    lr = min(lr, key=lambda x: x["threads"]) if lr else None
                    line += [ms(lr["bie_ms"]), ratio(lr)] if lr else ["-", "-"]
                body.append(line)
            out += table(header, body) + [""]
    return out


def llm_rows(rows, ms_of_m):
    """The LLM rows the page shows: those of the row counts M its targets name (ms_of_m); the result
    files keep every row of the run."""
    return [r for r in rows if any(r["case"].endswith(f" M={m}") for m in ms_of_m)]


def cpu_llm_part(rows, files):
    """`bie bench --llm`'s CPU rows (cases wq...): one table per CPU, with the achieved weight bandwidth
    and its ratio to the machine's, measured in the same run."""
    out = []
    for device, drows in group_by(rows, lambda r: r.get("device", "unknown CPU")).items():
        r0 = drows[0]
        out += [f"## CPU: {device}, LLM layers", ""]
        out += para(f"Measured {dates(drows)} on {device} ({r0.get('cpus', '?')} logical CPUs), bie at its ISA level "
                    f"{r0.get('isa', '?')}" + (f", against {r0['blas']}" if r0.get("blas") else "") + ".",
                    " ".join(text("intro")["cpu-llm"]), f"Files: {', '.join(files)}.")
        out += note_lines(drows)
        body = []
        for r in llm_rows(drows, (1,)):
            name, shape = case_split(r["case"])
            body.append([f"`{name}`", shape, r.get("threads", "-"), ms(r["bie_ms"]), baseline(r["baseline"]),
                         ms(r["baseline_ms"]), ratio(r), f"{r['gbs']:.1f}", f"{100 * r['bw_ratio']:.0f}%"])
        out += table(["case", "shape", "threads", "bie ms", "baseline", "baseline ms", "ratio", "GB/s", "of copy"],
                      body) + [""]
    return out


def cuda_part(rows):
    out = []
    # one part per device for bie_bench_cuda's rows and one for `bie bench --llm`'s (wq), timed differently
    for (device, llm), drows in group_by(rows, lambda r: (r.get("device", "unknown GPU"),
                                                          r["case"].startswith("wq"))).items():
        r0 = drows[0]
        libs = ", ".join(f"{k} {r0[k]}" for k in ("cublas", "cudnn") if r0.get(k) not in (None, "none"))
        files = sorted({r["_file"] for r in drows})
        out += [f"## CUDA: {device}" + (", LLM layers" if llm else ""), ""]
        head = f"Measured {dates(drows)} on one {device}, CUDA {r0.get('cuda', '?')}" + (f" ({libs})" if libs else "")
        if llm:  # timed as their section says
            out += para(head + f". Files: {', '.join(files)}.")
        else:
            out += para(head + ". Command: `bie_bench_cuda --json` (the CUDA cases of `bie bench --backend cuda`).",
                        f"Files: {', '.join(files)}.",
                        "Each side is timed two ways, medians of 21: CUDA events around one call on an idle "
                        "stream, and replays of a captured CUDA graph of consecutive calls (time per call); each "
                        "side is credited with its lower median. Inputs rotate over copies that together exceed "
                        "the L2 cache. bie's time holds every kernel of the call (packing, popcounts, GEMM, "
                        "epilogue).")
        out += note_lines(drows)
        for head, sel in sections("cuda", llm_rows(drows, (1, 16, 4096)) if llm else drows):
            out += head
            body = []
            bw = any("bw_ratio" in r for r in sel)
            for r in sel:
                name, shape = case_split(r["case"])
                last = f"{100 * r['bw_ratio']:.0f}%" if bw else f"{r['gops'] / 1000:.0f}" if r.get("gops") else "-"
                body.append([f"`{name}`", shape, ms(r["bie_ms"]), baseline(r["baseline"]), ms(r["baseline_ms"]),
                             ratio(r), last])
            out += table(["case", "shape", "bie ms", "baseline", "baseline ms", "ratio",
                          "of copy" if bw else "bie TOPS"], body) + [""]
    return out


def case_split(case):
    """'binary-gemm b1->f16 8192x8192x8192' -> ('binary-gemm b1->f16', '8192x8192x8192')."""
    words = case.split(" ")
    for i, w in enumerate(words):
        if i and (w[:1].isdigit() or (w[:1] == "N" and w[1:2].isdigit())):
            return " ".join(words[:i]), " ".join(words[i:])
    return case, ""


def modules_part(rows, files):
    out = ["## PyTorch modules", ""]
    out += para(*intro("modules"))
    for device, drows in group_by(rows, lambda r: r.get("device", "unknown device")).items():
        r0 = drows[0]
        src = [f for f, frows in files if any(r in frows for r in drows)]
        thr = r0.get("threads") if r0.get("dtype") == "float32" else None
        out += [f"### {device}", ""]
        out += para(f"Measured {dates(drows)}, {r0.get('dtype', '?')}, torch {r0.get('torch', '?')}"
                    + (f", {thr} CPU thread{'s' if thr != 1 else ''} for both sides" if thr else "") + ".",
                    f"Files: {', '.join(src)}.")
        out += note_lines(drows)
        # one line per layer and shape: the forward and the training step side by side, other modes after
        by = {}
        for r in drows:
            by.setdefault((r["layer"], r["shape"]), []).append(r)

        def cell(r):
            return ("-", "-") if r is None else (f"{ms(r['bie_ms'])} / {ms(r['baseline_ms'])}", ratio(r))

        body = []
        for (layer, shape), rs in by.items():
            fwd = next((r for r in rs if r["mode"] == "forward"), None)
            step = next((r for r in rs if r["mode"] == "train step"), None)
            more = "; ".join(f"{r['mode']}: {ms(r['bie_ms'])} / {ms(r['baseline_ms'])}, {ratio(r)}"
                             for r in rs if r not in (fwd, step))
            body.append([layer, shape, *cell(fwd), *cell(step), more or "-"])
        out += table(["layer", "shape", "forward ms (bie / float)", "float/bie", "train step ms (bie / float)",
                      "float/bie", "other"], body) + [""]
    return out


def networks_part(rows, files):
    out = ["## Whole networks", ""]
    out += para(*intro("networks"))
    explained = False
    for device, drows in group_by(rows, lambda r: r.get("device", "unknown device")).items():
        src = [f for f, frows in files if any(r in frows for r in drows)]
        if all(r["mode"] not in ("inference", "inference fused", "train step") for r in drows):
            # (a device with single figures only, e.g. a run on several GPUs: one line each)
            out += [f"- {device}, {r['model']}, batch {r['batch']}, {r['mode']}: {ms(r.get('bie_ms'))} ms against "
                    f"{r.get('baseline', 'the baseline')} {ms(r.get('baseline_ms'))} ms, {ratio(r)} (measured "
                    f"{r.get('date', '?')}; {', '.join(src)})." for r in drows] + [""]
            continue
        out += [f"### {device}", ""] + para(f"Measured {dates(drows)}.", f"Files: {', '.join(src)}.")
        out += note_lines(drows)
        def peak(r):
            p, b = r.get("peak_mib"), r.get("baseline_peak_mib")
            return "-" if p is None else f"{p:.0f}" + (f" / {b:.0f}" if b is not None else "")
        # one line per model, batch and timing (eager or graphs): inference and training step side by side
        runs, other = {}, []
        for r in drows:
            if r["mode"] in ("inference", "inference fused", "train step", "train step fused"):
                runs.setdefault((r["model"], r["batch"], bool(r.get("graphs"))), {})[r["mode"]] = r
            else:
                other.append(r)

        def pair(r):
            return "-" if r is None else f"{ms(r.get('bie_ms'))} / {ms(r.get('baseline_ms'))}"

        body = []
        for (model, batch, graphs), m in runs.items():
            inf, fused, step = m.get("inference"), m.get("inference fused"), m.get("train step")
            fstep = m.get("train step fused")
            fold = fused.get("baseline_folded_ms") if fused else None
            body.append([model, batch, "CUDA graphs" if graphs else "eager", pair(inf), ratio(inf) if inf else "-",
                         pair(fused), ratio(fused) if fused else "-", "-" if fold is None else ms(fold),
                         "-" if fold is None else f"{fold / fused['bie_ms']:.2f}x", pair(step),
                         ratio(step) if step else "-", peak(step or inf), pair(fstep),
                         ratio(fstep) if fstep else "-", "-" if fstep is None else peak(fstep)])
        if body and not explained:  # (the columns, said once for every device)
            explained = True
            base = ", ".join(sorted({r.get("baseline", "float") for m in runs.values() for r in m.values()}))
            out += para(f"Baseline: {base}. fused: after bie.fuse (each block's Hardtanh, conv, BatchNorm and "
                        "shortcut add one libbie call, in training one autograd node; the stem's BatchNorm, "
                        "ReLU and max-pool one pass after its conv; docs/decisions.md has the details), "
                        "against the same plain float network; folded: the float network with its BatchNorms "
                        "folded by torch.fx, and the fused network's ratio against it.")
        if body:
            out += table(["model", "batch", "timing", "inference ms (bie / baseline)", "ratio",
                          "fused inference ms (bie / baseline)", "ratio", "folded ms", "ratio",
                          "train step ms (bie / baseline)", "ratio", "peak MiB (bie / baseline)",
                          "fused train step ms (bie / baseline)", "ratio", "fused peak MiB (bie / baseline)"], body)
        for r in other:
            out += ["", f"- {r['model']}, batch {r['batch']}, {r['mode']}: {ms(r.get('bie_ms'))} ms against "
                    f"{r.get('baseline', 'the baseline')} {ms(r.get('baseline_ms'))} ms, {ratio(r)}."]
        out += [""]
    return out


HEADER = """# Performance

<!-- Generated by scripts/perf-report.py from bench/results/*.json: edit those, not this page. -->

The current figures of each benchmark target. bie and its baseline (the library a user would
otherwise call) are timed in the same process over repeated runs (medians; means for the PyTorch
modules); "ratio" is the baseline's time over bie's (above 1: bie is faster). How the kernels
reach these figures is in the code's comments and in docs/decisions.md.

To refresh a figure, run its benchmark with `--json` into `bench/results/`, then `make perf-doc`:

    build/bie bench --json --repeat 5 > bench/results/cpu.json
    BIE_CPU_ISA=avx2 build/bie bench --json --repeat 5 --threads 1 > bench/results/cpu-avx2.json
    build/bie bench --llm --json --repeat 5 > bench/results/llm-cpu.json
    BIE_LIBRARY=build/libbie.so PYTHONPATH=python python3 python/bench_modules.py --device cpu --json \\
        > bench/results/modules-cpu.json
    scripts/gpu-check.sh --out DIR     # on a GPU machine: DIR/bench-cuda.json, DIR/bench-modules.json,
                                       # DIR/bench-networks-*.json
    scripts/ddp-check.sh --out DIR     # on a machine of several GPUs: DIR/bench-ddp.json
                                       # (--graphs: each side's step replayed from a CUDA graph)

`make test` checks that this page is what the result files give.
"""


def render(results_dir):
    paths = sorted(glob.glob(os.path.join(results_dir, "*.json")))
    parts = {"cpu": [], "cuda": [], "modules": [], "networks": []}
    for p in paths:
        rows = load(p)
        k = kind_of(rows)
        if k is None:
            continue
        note_rows = [r for r in rows if set(r) <= {"note"}]
        data = [r for r in rows if r not in note_rows]
        for r in data:
            if note_rows and "note" not in r:
                r["note"] = " ".join(n["note"] for n in note_rows)
        rel = os.path.relpath(p, ROOT)
        parts[k].append((f"`{rel}`", data))
    out = [HEADER]
    # `bie bench --llm`'s CPU rows (cases wq...) have their own part
    llm = [(f, [r for r in rows if r["case"].startswith("wq")]) for f, rows in parts["cpu"]]
    rest = [(f, [r for r in rows if not r["case"].startswith("wq")]) for f, rows in parts["cpu"]]
    if any(rows for _, rows in rest):
        out += cpu_part([r for _, rows in rest for r in rows], [f for f, rows in rest if rows])
    if any(rows for _, rows in llm):
        out += cpu_llm_part([r for _, rows in llm for r in rows], [f for f, rows in llm if rows])
    if parts["cuda"]:
        for f, rows in parts["cuda"]:
            for r in rows:
                r["_file"] = f
        out += cuda_part([r for _, rows in parts["cuda"] for r in rows])
    if parts["modules"]:
        out += modules_part([r for _, rows in parts["modules"] for r in rows], parts["modules"])
    if parts["networks"]:
        out += networks_part([r for _, rows in parts["networks"] for r in rows], parts["networks"])
    while out and out[-1] == "":
        out.pop()
    return "\n".join(out) + "\n"


def print_rows(paths):
    for p in paths:
        print(f"== {p}")
        for r in load(p):
            name = r.get("case") or " ".join(str(r.get(k, "")) for k in ("layer", "model", "shape", "batch", "mode"))
            if r.get("backend") in ("cpu", "ref"):
                name += f" [{r.get('isa', '?')}, {r.get('threads')} thr]"
            print(f"  {name:<56} bie {ms(r.get('bie_ms')):>9} ms  {r.get('baseline', ''):<20} "
                  f"{ms(r.get('baseline_ms')):>9} ms  {ratio(r):>8}")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--results", default=os.path.join(ROOT, "bench", "results"))
    ap.add_argument("--output", default=os.path.join(ROOT, "docs", "performance.md"))
    ap.add_argument("--check", action="store_true", help="compare with --output instead of writing it")
    ap.add_argument("--table", nargs="+", metavar="FILE", help="print the rows of these result files")
    args = ap.parse_args()
    if args.table:
        print_rows(args.table)
        return 0
    text = render(args.results)
    if args.check:
        try:
            with open(args.output, encoding="utf-8") as f:
                old = f.read()
        except OSError:
            old = None
        if old != text:
            print(f"perf-report: {os.path.relpath(args.output, ROOT)} is not what {os.path.relpath(args.results, ROOT)} "
                  "gives: run `make perf-doc` and commit the result", file=sys.stderr)
            return 1
        print("perf-report: the page matches its result files")
        return 0
    with open(args.output, "w", encoding="utf-8") as f:
        f.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
