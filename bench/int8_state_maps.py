#!/usr/bin/env python3
# Measures the choice of the int8 Adam moments' maps and block size (docs/design.md, "Int8 moments").
# Run: python3 bench/int8_state_maps.py  (numpy; about a minute)
# Which 8-bit map for Adam's moments: one-shot quantization error of the update m/sqrt(v)
# on moments from a simulated Adam run (heterogeneous per-row gradient scales).
import numpy as np
rng = np.random.default_rng(0)
N, ROW = 1 << 20, 768
scale = np.repeat(np.exp(rng.normal(0, 1.5, N // ROW + 1)), ROW)[:N] * np.exp(rng.normal(0, 0.5, N))
sig = rng.normal(0, 0.3, N)
m = np.zeros(N, np.float64); v = np.zeros(N, np.float64)
b1, b2 = 0.9, 0.999
for t in range(1, 201):
    g = scale * (sig + rng.normal(0, 1, N)) * (rng.random(N) > 0.05)  # a few zero grads
    m = b1 * m + (1 - b1) * g; v = b2 * v + (1 - b2) * g * g
bc1, bc2 = 1 - b1 ** 200, 1 - b2 ** 200
def upd(m, v): return (m / bc1) / (np.sqrt(v / bc2) + 1e-8)
ref = upd(m, v)

def fp_map(x, e_bits, m_bits, signed):  # value set of sign/E/M relative to absmax, E=0 -> 0
    vals = [0.0]
    for e in range(1, 2 ** e_bits):
        for f in range(2 ** m_bits):
            vals.append(2.0 ** (e - (2 ** e_bits - 1)) * (1 + f / 2 ** m_bits))
    vals = np.array(sorted(vals))
    return np.concatenate([-vals[::-1][:-1], vals]) if signed else vals
def linear(signed): return np.linspace(-1, 1, 255) if signed else np.linspace(0, 1, 256)
def dyn_tree(signed):  # Dettmers' dynamic map (bitsandbytes create_dynamic_map)
    data, non_sign_bits = [], 7 if signed else 8
    max_exp = 7
    for i in range(max_exp):
        fb = 2 ** (i + non_sign_bits - max_exp) + 1 if signed else 2 ** (i + non_sign_bits - max_exp + 1) + 1
        bnd = np.linspace(0.1, 1, fb); means = (bnd[:-1] + bnd[1:]) / 2.0
        data += (10 ** (-(max_exp - 1) + i) * means).tolist()
        if signed: data += (-(10 ** (-(max_exp - 1) + i)) * means).tolist()
    data += [0, 1.0]
    if signed: data += [-1.0]
    return np.array(sorted(set(data)))
def quant(x, table, block):
    xb = x.reshape(-1, block); am = np.abs(xb).max(1, keepdims=True); am[am == 0] = 1
    y = xb / am; idx = np.clip(np.searchsorted(table, y), 1, len(table) - 1)
    lo, hi = table[idx - 1], table[idx]
    q = np.where(np.abs(y - lo) <= np.abs(hi - y), lo, hi)
    return (q * am).reshape(-1)
def report(name, mq, vq):
    rel = np.abs(upd(mq, vq) - ref) / (np.abs(ref) + 1e-3)
    zero_v = np.mean((vq == 0) & (v > 0))
    print(f"{name:34s} median {np.median(rel):.4f}  p99 {np.quantile(rel,0.99):.3f}  v->0 {zero_v:.2e}")
B = 2048
for mname, mt in [("m e4m3", fp_map(None, 4, 3, True)), ("m e3m4", fp_map(None, 3, 4, True)),
                  ("m e5m2", fp_map(None, 5, 2, True)), ("m dynamic tree", dyn_tree(True)),
                  ("m linear", linear(True))]:
    report(mname + " / v exact", quant(m, mt, B), v)
for vname, f in [("sqrt(v) e4m4", lambda: quant(np.sqrt(v), fp_map(None, 4, 4, False), B) ** 2),
                 ("v e4m4", lambda: quant(v, fp_map(None, 4, 4, False), B)),
                 ("v e5m3", lambda: quant(v, fp_map(None, 5, 3, False), B)),
                 ("v dynamic tree (unsigned)", lambda: quant(v, dyn_tree(False), B)),
                 ("sqrt(v) dynamic tree", lambda: quant(np.sqrt(v), dyn_tree(False), B) ** 2)]:
    report("m exact / " + vname, m, f())
for blk in [256, 2048, 16384, 131072]:
    report(f"e4m3 + sqrt e4m4, block {blk}", quant(m, fp_map(None, 4, 3, True), blk),
           quant(np.sqrt(v), fp_map(None, 4, 4, False), blk) ** 2)
