#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Draws the JSON-lines log of `bie train --log FILE` as a PNG: loss on the left, accuracy on
the right, against epochs. Periodic "step" lines (the mean over the batches since the previous
line) are drawn as thin lines, the "epoch" lines as points: train loss, train accuracy and test
accuracy after each epoch. A log appended to by --resume is drawn as one run.

Usage: scripts/plot-training.py LOG [-o OUT.png] [--title TEXT]
Needs matplotlib (Debian: python3-matplotlib).
"""
import argparse
import json
import sys


def read_log(path):
    steps, epochs, start, end = [], {}, None, None
    with open(path) as f:
        for n, line in enumerate(f, 1):
            line = line.strip()
            if not line:
                continue
            try:
                rec = json.loads(line)
            except json.JSONDecodeError as e:
                sys.exit(f"plot-training: {path}:{n}: not a JSON line ({e})")
            event = rec.get("event")
            if event == "step":
                steps.append(rec)
            elif event == "epoch":
                epochs[rec["epoch"]] = rec  # a resumed run repeats no epoch; the last one wins
            elif event == "start" and start is None:
                start = rec
            elif event == "end":
                end = rec
    if not steps and not epochs:
        sys.exit(f"plot-training: {path} holds no step or epoch lines (write it with bie train --log)")
    # A resumed run appends: keep each step once, in training order.
    steps = sorted({(s["epoch"], s["batch"]): s for s in steps}.values(), key=lambda s: s["epoch_progress"])
    return steps, [epochs[k] for k in sorted(epochs)], start, end


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("log")
    ap.add_argument("-o", "--out", help="the PNG to write (default: LOG with .png)")
    ap.add_argument("--title", help="the figure's title (default: the model and its final accuracy)")
    args = ap.parse_args()
    steps, epochs, start, end = read_log(args.log)
    try:
        import matplotlib
    except ImportError:
        sys.exit("plot-training: matplotlib is missing (apt-get install python3-matplotlib)")
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax_loss, ax_acc) = plt.subplots(1, 2, figsize=(11, 4.2))
    x = [s["epoch_progress"] for s in steps]
    ax_loss.plot(x, [s["loss"] for s in steps], color="tab:blue", lw=1, alpha=0.7, label="train loss (batches)")
    ax_acc.plot(x, [100 * s["accuracy"] for s in steps], color="tab:blue", lw=1, alpha=0.7,
                label="train accuracy (batches)")
    ex = [e["epoch"] for e in epochs]
    ax_loss.plot(ex, [e["train_loss"] for e in epochs], "o", color="tab:blue", label="train loss (epoch)")
    ax_acc.plot(ex, [100 * e["train_accuracy"] for e in epochs], "o", color="tab:blue", label="train accuracy (epoch)")
    ax_acc.plot(ex, [100 * e["test_accuracy"] for e in epochs], "s-", color="tab:orange", label="test accuracy")
    for e in epochs[-1:]:
        ax_acc.annotate(f"{100 * e['test_accuracy']:.2f}%", (e["epoch"], 100 * e["test_accuracy"]),
                        textcoords="offset points", xytext=(-8, -14), ha="right", color="tab:orange")
    ax_loss.set(xlabel="epoch", ylabel="cross-entropy loss", title="loss")
    ax_acc.set(xlabel="epoch", ylabel="accuracy (%)", title="accuracy")
    for ax in (ax_loss, ax_acc):
        ax.set_xlim(left=0)
        ax.grid(alpha=0.3)
        ax.legend(loc="best", fontsize="small")
    title = args.title
    if title is None:
        title = start["model"] if start else "bie train"
        if end:
            seconds = sum(e["epoch_s"] for e in epochs)  # (a resumed run's "end" counts its own part only)
            title += f": test accuracy {100 * end['test_accuracy']:.2f}% after {seconds:.0f} s of training"
        if start:
            title += f"\n{start['arch']}"
    fig.suptitle(title, fontsize="medium")
    fig.tight_layout()
    out = args.out or (args.log.rsplit(".", 1)[0] if "." in args.log else args.log) + ".png"
    fig.savefig(out, dpi=110)
    print(f"plot-training: wrote {out}")


if __name__ == "__main__":
    main()
