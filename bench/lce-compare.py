#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Batch-1 latency and batch-64 throughput of the same binary networks in bie and in Larq Compute
Engine (LCE), on the CPU. Not part of `make test`: it downloads TensorFlow, larq and LCE.

    python3 bench/lce-compare.py [--models bcnn,quicknet] [--threads 1,2] [--out FILE.json]

What it does:
  1. Installs larq-compute-engine, larq and TensorFlow from PyPI into a virtual environment used
     for this benchmark only, outside the repository (--venv, default ~/.cache/bie-bench/lce-venv),
     with a Python that LCE publishes wheels for (--python; 3.10 to 3.12).
  2. In that environment: builds each network with larq (random weights), converts it with LCE's
     converter (batch 1 and batch 64 inputs) and times LCE's interpreter at each thread count:
     batch-1 latency (median, p99 over --reps calls) and images/s at batch 64. LCE runs with and
     without its XNNPACK delegate (float layers) and its indirect BGEMM (binary convs); the fastest
     of the four is LCE's figure.
  3. In this Python: builds the same architecture as a bie model (random weights, the scales set by
     one forward pass), saves it packed, loads the packed file, and times bie_model_forward through
     the C model API of build/libbie.so (ctypes; --lib), one process per thread count, with
     OPENBLAS_NUM_THREADS and OMP_NUM_THREADS set to the count.
     With more than one thread, bie runs with OMP_WAIT_POLICY=PASSIVE and =ACTIVE; the faster is
     bie's figure.
  The two sides run back to back, --rounds times in alternation, and the medians are over all
  rounds' calls.

The networks (bie's architecture strings; docs/model-format.md):
  bcnn      bie train's bcnn preset on 28x28 images: a float 3x3 conv, two binary 3x3 convs with
            max-pooling, a binary linear layer of 256 units, batch norm after each, a float classifier.
  quicknet  a QuickNet-sized network on 224x224 RGB images, as far as a sequential model goes (no
            residual additions): a float 3x3 stride-2 stem, then four sections of four binary 3x3
            convs (64, 128, 256, 512 channels at 56, 28, 14, 7 pixels), each section entered by
            max-pooling and a float 1x1 conv, batch norm after every conv, a 7x7 max-pool and a float
            classifier of 1000 classes (12.4 M binary weights; QuickNet has 12.7 M parameters).
In larq, each binary conv is QuantConv2D with ste_sign on its input and kernel and zero padding
(bie's convs pad with zero too), each float layer the Keras layer of the same shape.
"""
import argparse
import ctypes
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)

# Versions installed into the benchmark environment (LCE 0.16 is built against TensorFlow 2.16, and
# larq uses tf.keras 2: tf-keras with TF_USE_LEGACY_KERAS=1).
PACKAGES = ["larq-compute-engine==0.16.0", "larq==0.14.0", "tensorflow-cpu==2.16.2", "tf-keras==2.16.0"]

# (kind, filters or units, kernel, stride): the shared description both sides are built from.
def layers_of(model):
    if model == "bcnn":
        return (1, 28, 28), [("conv", "f32", 32, 3, 1), ("bn",), ("conv", "b1", 64, 3, 1), ("maxpool", 2), ("bn",),
                             ("conv", "b1", 64, 3, 1), ("maxpool", 2), ("bn",), ("linear", "b1", 256), ("bn",),
                             ("linear", "f32", 10)]
    if model == "quicknet":
        L = [("conv", "f32", 32, 3, 2), ("bn",), ("relu",), ("maxpool", 2)]
        for s, ch in enumerate((64, 128, 256, 512)):
            if s:
                L += [("maxpool", 2), ("conv", "f32", ch, 1, 1), ("bn",)]
            for _ in range(4):
                L += [("conv", "b1", ch, 3, 1), ("bn",)]
        L += [("maxpool", 7), ("linear", "f32", 1000)]
        return (3, 224, 224), L
    raise SystemExit(f"unknown model {model} (bcnn, quicknet)")


def bie_arch(model):
    (c, h, w), L = layers_of(model)
    items = [f"input {c} {h} {w}"]
    for l in L:
        if l[0] == "conv":
            items.append(f"conv {l[1]} {l[2]} {l[3]} {l[4]}")
        elif l[0] == "linear":
            items.append(f"linear {l[1]} {l[2]}")
        elif l[0] == "maxpool":
            items.append(f"maxpool {l[1]}")
        else:
            items.append(l[0])
    return "; ".join(items)


# LCE's interpreter options tried at every measurement: (use_xnnpack, use_indirect_bgemm). The
# indirect BGEMM is 5x faster than im2col + BGEMM on the bcnn convs of this benchmark on a Zen 4 core,
# XNNPACK speeds up the float layers; the fastest variant is LCE's figure.
LCE_VARIANTS = [(False, False), (False, True), (True, False), (True, True)]


# bie's OpenMP wait policies tried with more than one thread: PASSIVE (what the bie program sets,
# tools/bie.c: OpenBLAS's threads keep their cores) and ACTIVE (threads spin between parallel
# regions: less wake-up latency per layer); the faster is bie's figure.
BIE_POLICIES = ["PASSIVE", "ACTIVE"]


def variant_name(v):
    return f"xnnpack{int(v[0])}-indirect{int(v[1])}"


def summary(xs_ms):
    xs = sorted(xs_ms)
    p99 = xs[min(len(xs) - 1, int(round(0.99 * (len(xs) - 1))))]
    return {"median_ms": statistics.median(xs), "p99_ms": p99, "calls": len(xs)}


# --- LCE side (runs inside the benchmark environment) -----------------------------------------------

def lce_worker(args):
    os.environ["TF_USE_LEGACY_KERAS"] = "1"
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    import numpy as np
    import tensorflow as tf
    import larq as lq
    import larq_compute_engine as lce
    from larq_compute_engine.tflite.python.interpreter import Interpreter

    tf.random.set_seed(1)
    (c, h, w), L = layers_of(args.model)
    quant = dict(input_quantizer="ste_sign", kernel_quantizer="ste_sign", kernel_constraint="weight_clip",
                 use_bias=False)

    def build(batch):
        inp = tf.keras.Input((h, w, c), batch_size=batch)
        x = inp
        for l in L:
            if l[0] == "conv" and l[1] == "b1":
                x = lq.layers.QuantConv2D(l[2], l[3], strides=l[4], padding="same", pad_values=0.0, **quant)(x)
            elif l[0] == "conv":
                x = tf.keras.layers.Conv2D(l[2], l[3], strides=l[4], padding="same")(x)
            elif l[0] == "linear":
                if len(x.shape) > 2:
                    x = tf.keras.layers.Flatten()(x)
                x = (lq.layers.QuantDense(l[2], **quant) if l[1] == "b1" else tf.keras.layers.Dense(l[2]))(x)
            elif l[0] == "maxpool":
                x = tf.keras.layers.MaxPool2D(l[1])(x)
            elif l[0] == "bn":
                x = tf.keras.layers.BatchNormalization()(x)
            elif l[0] == "relu":
                x = tf.keras.layers.ReLU()(x)
        return tf.keras.Model(inp, x)

    from importlib.metadata import version
    out = {"model": args.model, "lce_version": version("larq-compute-engine"), "tensorflow": tf.__version__,
           "larq": version("larq"), "runs": {}}
    rng = np.random.default_rng(1)
    for batch in (1, 64):
        m = build(batch)
        if batch == 1:
            out["params"] = int(m.count_params())
            m2 = m
        else:  # the same weights at batch 64
            m.set_weights(m2.get_weights())
        fb = lce.convert_keras_model(m)
        x = rng.standard_normal((batch, h, w, c), dtype=np.float32)
        for t in args.threads:
            for variant in LCE_VARIANTS:
                xnn, ind = variant
                it = Interpreter(fb, num_threads=t, use_xnnpack=xnn, use_indirect_bgemm=ind)
                run = lambda: it.interpreter.predict([x])
                for _ in range(3 if batch == 1 else 1):
                    run()
                reps = args.reps if batch == 1 else args.reps64
                ts = []
                for _ in range(reps):
                    t0 = time.perf_counter_ns()
                    run()
                    ts.append((time.perf_counter_ns() - t0) / 1e6)
                out["runs"][f"b{batch}-t{t}-{variant_name(variant)}"] = ts
    json.dump(out, sys.stdout)


# --- bie side -----------------------------------------------------------------------------------------

class BieTensor(ctypes.Structure):  # struct bie_tensor
    _fields_ = [("data", ctypes.c_void_p), ("dtype", ctypes.c_int), ("ndim", ctypes.c_int32),
                ("shape", ctypes.c_int64 * 8), ("stride", ctypes.c_int64 * 8), ("device_type", ctypes.c_int),
                ("device_index", ctypes.c_int32)]


class BieForwardDesc(ctypes.Structure):  # struct bie_model_forward_desc
    _fields_ = [("training", ctypes.c_int32), ("float_layers", ctypes.c_int32)]


class BieForwardArgs(ctypes.Structure):  # struct bie_model_forward_args
    _fields_ = [("x", ctypes.POINTER(BieTensor)), ("logits", ctypes.POINTER(BieTensor))]


def bie_matrix(buf, rows, cols):
    """A dense f32 [rows, cols] CPU view of a ctypes float array."""
    return BieTensor(ctypes.cast(buf, ctypes.c_void_p), 0, 2, (ctypes.c_int64 * 8)(rows, cols),
                     (ctypes.c_int64 * 8)(cols, 1), 0, 0)


def bie_lib(path):
    lib = ctypes.CDLL(path)
    vp, i64, c_int = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int
    lib.bie_context_create.argtypes = [vp, ctypes.POINTER(vp)]
    lib.bie_context_last_error.restype = ctypes.c_char_p
    lib.bie_context_last_error.argtypes = [vp]
    lib.bie_context_set_num_threads.argtypes = [vp, ctypes.c_int32]
    lib.bie_model_create.argtypes = [vp, ctypes.c_char_p, c_int, ctypes.c_uint64, ctypes.POINTER(vp)]
    lib.bie_model_save.argtypes = [vp, vp, ctypes.c_char_p, c_int, vp, ctypes.c_size_t]
    lib.bie_model_load.argtypes = [vp, ctypes.c_char_p, ctypes.POINTER(vp), vp]
    lib.bie_model_forward.argtypes = [vp, vp, ctypes.POINTER(BieForwardDesc), ctypes.POINTER(BieForwardArgs)]
    lib.bie_model_destroy.argtypes = [vp]
    lib.bie_model_num_inputs.argtypes = [vp]
    lib.bie_model_num_inputs.restype = i64
    lib.bie_model_num_outputs.argtypes = [vp]
    lib.bie_model_num_outputs.restype = i64
    lib.bie_context_destroy.argtypes = [vp]
    return lib


def bie_worker(args):
    import random
    lib = bie_lib(args.lib)
    ctx = ctypes.c_void_p()
    if lib.bie_context_create(None, ctypes.byref(ctx)) != 0:
        raise SystemExit("bie: no context")
    t = args.threads[0]
    lib.bie_context_set_num_threads(ctx, t)

    def ok(s):
        if s != 0:
            raise SystemExit("bie: " + lib.bie_context_last_error(ctx).decode())

    arch = bie_arch(args.model).encode()
    m = ctypes.c_void_p()
    ok(lib.bie_model_create(ctx, arch, 0, 1, ctypes.byref(m)))
    n_in, n_out = lib.bie_model_num_inputs(m), lib.bie_model_num_outputs(m)
    random.seed(1)
    logits = (ctypes.c_float * (64 * n_out))()
    infer = BieForwardDesc(0, 0)
    xs, views, fargs = {}, {}, {}
    for batch in (1, 64):
        xs[batch] = (ctypes.c_float * (batch * n_in))(*[random.gauss(0.0, 1.0) for _ in range(batch * n_in)])
        views[batch] = (bie_matrix(xs[batch], batch, n_in), bie_matrix(logits, batch, n_out))
        fargs[batch] = BieForwardArgs(ctypes.pointer(views[batch][0]), ctypes.pointer(views[batch][1]))
    ok(lib.bie_model_forward(ctx, m, ctypes.byref(infer), ctypes.byref(fargs[64])))  # sets the scales
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "model.safetensors").encode()
        ok(lib.bie_model_save(ctx, m, path, 0, None, 0))
        lib.bie_model_destroy(m)
        m = ctypes.c_void_p()
        ok(lib.bie_model_load(ctx, path, ctypes.byref(m), None))
    out = {"model": args.model, "arch": arch.decode(), "runs": {}}
    for batch in (1, 64):
        for _ in range(3 if batch == 1 else 1):
            ok(lib.bie_model_forward(ctx, m, ctypes.byref(infer), ctypes.byref(fargs[batch])))
        ts = []
        for _ in range(args.reps if batch == 1 else args.reps64):
            t0 = time.perf_counter_ns()
            s = lib.bie_model_forward(ctx, m, ctypes.byref(infer), ctypes.byref(fargs[batch]))
            ts.append((time.perf_counter_ns() - t0) / 1e6)
            ok(s)
        out["runs"][f"b{batch}-t{t}"] = ts
    lib.bie_model_destroy(m)
    lib.bie_context_destroy(ctx)
    json.dump(out, sys.stdout)


# --- driver ---------------------------------------------------------------------------------------------

def venv_python(args):
    py = os.path.join(args.venv, "bin", "python")
    if os.path.exists(py):
        return py
    base = args.python or sys.executable
    ver = subprocess.run([base, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"], capture_output=True,
                         text=True, check=True).stdout.strip()
    if ver not in ("3.10", "3.11", "3.12"):
        raise SystemExit(f"{base} is Python {ver}: LCE 0.16 has wheels for 3.10-3.12 only (use --python)")
    print(f"creating {args.venv} with {base} (Python {ver}) and installing {' '.join(PACKAGES)}", file=sys.stderr)
    subprocess.run([base, "-m", "venv", args.venv], check=True)
    subprocess.run([py, "-m", "pip", "install", "--quiet", "--upgrade", "pip"], check=True)
    subprocess.run([py, "-m", "pip", "install", "--quiet"] + PACKAGES, check=True)
    return py


def run_json(cmd, env=None):
    r = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if r.returncode != 0:
        sys.stderr.write(r.stderr[-4000:])
        raise SystemExit(f"failed: {' '.join(cmd)}")
    return json.loads(r.stdout)


def cpu_name():
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default="bcnn,quicknet")
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--reps", type=int, default=200, help="batch-1 calls per round and side")
    ap.add_argument("--reps64", type=int, default=5, help="batch-64 calls per round and side")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--venv", default=os.path.expanduser("~/.cache/bie-bench/lce-venv"))
    ap.add_argument("--python", default=None, help="the Python that makes the environment (3.10-3.12)")
    ap.add_argument("--lib", default=os.path.join(REPO, "build", "libbie.so"))
    ap.add_argument("--out", default=None, help="write the results as JSON")
    ap.add_argument("--model", help=argparse.SUPPRESS)
    ap.add_argument("--worker", choices=("lce", "bie"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    args.threads_str = str(args.threads)
    args.threads = [int(t) for t in args.threads_str.split(",")]
    if args.worker == "lce":
        return lce_worker(args)
    if args.worker == "bie":
        return bie_worker(args)

    py = venv_python(args)
    me = os.path.abspath(__file__)
    common = ["--reps", str(args.reps), "--reps64", str(args.reps64)]
    results = {"cpu": cpu_name(), "cores": os.cpu_count(), "threads": args.threads, "models": {}}
    for model in args.models.split(","):
        lce_runs, bie_runs, info = {}, {}, {}
        for rnd in range(args.rounds):
            env = dict(os.environ, PYTHONPATH="")
            r = run_json([py, me, "--worker", "lce", "--model", model, "--threads", args.threads_str] + common,
                         env=env)
            info.update({k: r[k] for k in ("lce_version", "tensorflow", "larq", "params")})
            for k, v in r["runs"].items():
                lce_runs.setdefault(k, []).extend(v)
            for t in args.threads:
                for policy in BIE_POLICIES if t > 1 else BIE_POLICIES[:1]:
                    env = dict(os.environ, OMP_NUM_THREADS=str(t), OPENBLAS_NUM_THREADS=str(t), OMP_WAIT_POLICY=policy)
                    r = run_json([sys.executable, me, "--worker", "bie", "--model", model, "--threads", str(t),
                                  "--lib", args.lib] + common, env=env)
                    info["bie_arch"] = r["arch"]
                    for k, v in r["runs"].items():
                        bie_runs.setdefault(f"{k}-{policy}", []).extend(v)
        rows = []
        for t in args.threads:
            row = {"threads": t}
            for batch in (1, 64):
                bv = {p: summary(bie_runs[f"b{batch}-t{t}-{p}"]) for p in BIE_POLICIES if f"b{batch}-t{t}-{p}" in bie_runs}
                bbest = min(bv, key=lambda p: bv[p]["median_ms"])
                b = dict(bv[bbest], omp_wait_policy=bbest, all=bv)
                variants = {variant_name(v): summary(lce_runs[f"b{batch}-t{t}-{variant_name(v)}"]) for v in LCE_VARIANTS}
                best = min(variants, key=lambda v: variants[v]["median_ms"])
                l = dict(variants[best], variant=best, all=variants)
                if batch == 1:
                    row["bie_b1"], row["lce_b1"] = b, l
                    row["latency_ratio"] = b["median_ms"] / l["median_ms"]
                else:
                    row["bie_b64_img_s"] = 64e3 / b["median_ms"]
                    row["lce_b64_img_s"] = 64e3 / l["median_ms"]
                    row["lce_b64_variant"] = best
                    row["throughput_ratio"] = row["bie_b64_img_s"] / row["lce_b64_img_s"]
            rows.append(row)
        results["models"][model] = dict(info, rows=rows)
        print(f"{model}: bie arch '{info['bie_arch']}'")
        print(f"  {'thr':>3} {'bie b1 med/p99 ms':>20} {'LCE b1 med/p99 ms':>20} {'ratio':>6} "
              f"{'bie b64 img/s':>14} {'LCE b64 img/s':>14} {'ratio':>6}")
        for r in rows:
            print(f"  {r['threads']:>3} {r['bie_b1']['median_ms']:>10.3f}/{r['bie_b1']['p99_ms']:<9.3f}"
                  f" {r['lce_b1']['median_ms']:>10.3f}/{r['lce_b1']['p99_ms']:<9.3f} {r['latency_ratio']:>6.2f}"
                  f" {r['bie_b64_img_s']:>14.1f} {r['lce_b64_img_s']:>14.1f} {r['throughput_ratio']:>6.2f}")
        sys.stdout.flush()
    if args.out:
        with open(args.out, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
