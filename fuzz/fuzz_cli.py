#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Fuzzes the `bie` program through its public behaviour: generated argument vectors and bench
shape files, run on the ASan/UBSan build of the program in a bounded loop.

The options are read from each subcommand's --help, so the fuzzer follows the option parser
whatever it becomes. Values come from hostile pools (0, -1, 2^63, 1e308, nan, '', junk, very long
strings; missing, empty, special and hostile files: a FIFO, /dev/zero, a directory, a sparse 5 GiB
file, corrupted model files) and from a small valid world (a tiny IDX data set, a trained model), so
that runs get past the parser too. A run must end with exit status 0, 1 or 2, without a signal and
without a sanitizer report; running past the time limit is counted, not a finding (a valid training
or benchmark can be long). Findings are written to WORK/findings/ and make the exit status 1.

    fuzz/fuzz_cli.py --bie build-fuzz/bie --seconds 60 [--runs N] [--seed S] [--work DIR]
"""
import argparse
import gzip
import os
import random
import re
import shutil
import struct
import subprocess
import sys
import time

SANITIZER_MARKS = ("AddressSanitizer", "LeakSanitizer", "UndefinedBehaviorSanitizer", "runtime error:")
COMMANDS = ["train", "eval", "info", "bench", "version", "help", "--help", "-h", "--version"]


def idx_file(path, dims, data, compress):
    head = struct.pack(">BBBB", 0, 0, 8, len(dims)) + b"".join(struct.pack(">I", d) for d in dims)
    raw = head + bytes(data)
    with open(path, "wb") as f:
        f.write(gzip.compress(raw) if compress else raw)


def make_world(work, bie, rng):
    """The valid world (a tiny data set and a trained model) and the hostile files."""
    w = {}
    data = os.path.join(work, "data")
    os.makedirs(data, exist_ok=True)
    for split, n in (("train", 64), ("t10k", 32)):
        idx_file(os.path.join(data, f"{split}-images-idx3-ubyte.gz"), (n, 28, 28),
                 (rng.randrange(256) for _ in range(n * 784)), True)
        idx_file(os.path.join(data, f"{split}-labels-idx1-ubyte.gz"), (n,), (i % 10 for i in range(n)), True)
    w["data"] = data
    model = os.path.join(work, "model.safetensors")
    subprocess.run([bie, "train", "--model", "bmlp", "--hidden", "32", "--epochs", "1", "--threads", "1",
                    "--data", data, "--out", model], capture_output=True, timeout=600)
    files = {"model": model, "checkpoint": model + ".ckpt"}
    hostile = os.path.join(work, "hostile")
    os.makedirs(hostile, exist_ok=True)
    fifo = os.path.join(hostile, "fifo")
    if not os.path.exists(fifo):
        os.mkfifo(fifo)
    files["fifo"] = fifo
    files["dir"] = hostile
    files["zero"] = "/dev/zero"
    files["missing"] = os.path.join(hostile, "no-such-file")
    sparse = os.path.join(hostile, "sparse")
    with open(sparse, "wb") as f:
        f.truncate(5 << 30)
    files["sparse"] = sparse
    with open(os.path.join(hostile, "empty"), "wb"):
        pass
    files["empty"] = os.path.join(hostile, "empty")
    if os.path.exists(model):
        blob = open(model, "rb").read()
        for i in range(8):  # damaged copies: bit flips, truncations, header length changes
            b = bytearray(blob)
            kind = i % 4
            if kind == 0:
                for _ in range(rng.randrange(1, 20)):
                    b[rng.randrange(len(b))] ^= 1 << rng.randrange(8)
            elif kind == 1:
                b = b[:rng.randrange(len(b))]
            elif kind == 2:
                b[0:8] = struct.pack("<Q", rng.choice([0, 1, len(b), 1 << 40, (1 << 64) - 1]))
            else:
                b = b.replace(b"input 1 28 28", b"input 1 4096 4096", 1)
            p = os.path.join(hostile, f"damaged-{i}.safetensors")
            open(p, "wb").write(bytes(b))
            files[f"damaged{i}"] = p
    w["files"] = files
    return w


def options_of(bie, cmd):
    out = subprocess.run([bie, cmd, "--help"], capture_output=True, text=True, timeout=60)
    opts = sorted(set(re.findall(r"(?<![\w-])(--[a-z][a-z0-9-]*|-[a-z])\b", out.stdout + out.stderr)))
    return [o for o in opts if o not in ("--help", "-h")] or ["--help"]


NUMBERS = ["0", "1", "2", "3", "-1", "-5", "7", "64", "128", "1000", "65536", "2147483647", "2147483648",
           "4294967296", "9223372036854775807", "9223372036854775808", "-9223372036854775808", "1e308", "1e-308",
           "0.5", "-0.0", "nan", "inf", "-inf", "0x10", "1e3", " 3", "3 ", "+4", "1.5.2", ""]
WORDS = ["bmlp", "bcnn", "q4cnn", "f32", "int8", "8", "32", "cpu", "ref", "cuda", "lin", "conv", "x" * 5000,
         "\u00e9\u00e8", "--", "-", "%s%n", "input 1 28 28; linear b1 10"]


def value_for(opt, w, rng):
    files = w["files"]
    r = rng.random()
    if r < 0.05:
        return rng.choice(NUMBERS + WORDS)
    if any(k in opt for k in ("data", "dir")):
        return rng.choice([w["data"]] * 6 + [files["dir"], files["missing"], files["zero"], files["fifo"]])
    if any(k in opt for k in ("out", "checkpoint", "model-file", "file", "shapes", "path")):
        return rng.choice(list(files.values()) + [os.path.join(files["dir"], "out.safetensors")])
    if opt in ("--model",):
        return rng.choice(["bmlp", "bcnn", "q4cnn", "nope"] + list(files.values()))
    if "arch" in opt:
        return rng.choice(["input 1 28 28; linear b1 10", "input 1 28 28; conv b1 2500 1" + "; relu" * 60,
                           "input 4096 4096 4096; linear b1 1", "", "junk", "input 1 28 28; " * 200])
    if any(k in opt for k in ("latent", "backend")):
        return rng.choice(["f32", "int8", "cpu", "ref", "cuda", "nope", ""])
    return rng.choice(NUMBERS)


def shapes_file(path, rng):
    kinds = ["linear", "gemm", "conv", "train", "matmul"]
    keys = ["M", "N", "K", "B", "C", "H", "W", "O", "k", "s", "p", "quant", "X"]
    lines = []
    for _ in range(rng.randrange(1, 5)):
        toks = [rng.choice(kinds), "case%d" % rng.randrange(100)]
        for _ in range(rng.randrange(0, 9)):
            v = rng.choice(NUMBERS) if rng.random() < 0.5 else str(rng.randrange(1, 9))
            toks.append(rng.choice(keys) + "=" + v if rng.random() < 0.95 else "junk")
        lines.append(" ".join(toks) if rng.random() < 0.95 else "#" + " ".join(toks))
    open(path, "w").write("\n".join(lines) + "\n")


def argv_for(bie, w, opts, rng, work):
    cmd = rng.choice(COMMANDS + ["train", "eval", "info", "bench"] * 3 + ["", "nope"])
    argv = [bie] + ([cmd] if cmd else [])
    for _ in range(rng.randrange(0, 7)):
        o = rng.choice(opts.get(cmd, ["--x"]) + ["--nope", "-z"])
        argv.append(o)
        if rng.random() < 0.93:
            argv.append(value_for(o, w, rng))
    files = w["files"]
    if rng.random() < 0.85:  # keep valid runs short
        if cmd == "train":
            argv += ["--data", w["data"], "--epochs", "1", "--limit", "64", "--test-limit", "32", "--threads", "1",
                     "--out", os.path.join(work, "run.safetensors")]
        elif cmd == "eval":
            argv += ["--data", w["data"], "--limit", "32"]
            if rng.random() < 0.5:
                argv.append(rng.choice(list(files.values())))
        elif cmd == "info":
            argv.append(rng.choice(list(files.values())))
        elif cmd == "bench":
            shapes = os.path.join(work, "shapes.txt")
            shapes_file(shapes, rng)
            argv += ["--shapes", shapes, "--repeat", "1", "--threads", "1"]
            if rng.random() < 0.8:
                argv += ["--case", "no-such-case"]
    return argv


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bie", required=True)
    ap.add_argument("--seconds", type=float, default=60)
    ap.add_argument("--runs", type=int, default=1 << 60)
    ap.add_argument("--seed", type=int, default=None)
    ap.add_argument("--work", default="build-fuzz/cli")
    ap.add_argument("--timeout", type=float, default=20)
    a = ap.parse_args()
    seed = a.seed if a.seed is not None else int(time.time())
    rng = random.Random(seed)
    os.makedirs(a.work, exist_ok=True)
    bie = os.path.abspath(a.bie)
    env = dict(os.environ, ASAN_OPTIONS="detect_leaks=1:abort_on_error=0",
               UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1", OMP_NUM_THREADS="1")
    w = make_world(os.path.abspath(a.work), bie, rng)
    opts = {c: options_of(bie, c) for c in ("train", "eval", "info", "bench")}
    findings_dir = os.path.join(a.work, "findings")
    runs = timeouts = findings = 0
    codes = {}
    end = time.time() + a.seconds
    while runs < a.runs and time.time() < end:
        argv = argv_for(bie, w, opts, rng, os.path.abspath(a.work))
        try:
            limit = min(a.timeout, max(3.0, end - time.time()))  # a short budget is not spent on one run
            # (in the work folder: an output option given a plain word, such as --log 0.5, writes there)
            p = subprocess.run(argv, capture_output=True, timeout=limit, env=env, stdin=subprocess.DEVNULL,
                               cwd=a.work)
            rc, err = p.returncode, p.stderr.decode(errors="replace")
        except subprocess.TimeoutExpired:
            timeouts += 1
            runs += 1
            continue
        runs += 1
        codes[rc] = codes.get(rc, 0) + 1
        bad = rc not in (0, 1, 2) or any(m in err for m in SANITIZER_MARKS)
        if bad:
            findings += 1
            os.makedirs(findings_dir, exist_ok=True)
            with open(os.path.join(findings_dir, f"finding-{findings}.txt"), "w") as f:
                f.write("argv: %r\nexit: %d\n%s\n" % (argv, rc, err[-4000:]))
            print(f"fuzz_cli: finding: exit {rc} for {argv!r}\n{err[-1500:]}", file=sys.stderr)
    for f in ("sparse",):
        try:
            os.remove(w["files"][f])
        except OSError:
            pass
    shutil.rmtree(os.path.join(a.work, "hostile"), ignore_errors=True)
    print(f"fuzz_cli: {runs} runs in {a.seconds:.0f} s (seed {seed}): exit codes {dict(sorted(codes.items()))}, "
          f"{timeouts} stopped at the time limit, {findings} findings")
    return 1 if findings else 0


if __name__ == "__main__":
    sys.exit(main())
