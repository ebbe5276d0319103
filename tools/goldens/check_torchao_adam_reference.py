"""Issue 36 survey tool (not in the suite): torchao 0.18 low-bit AdamW (torch.compile on the CPU) against an
independent NumPy float32 reference of docs/torchao_lowbit.md, every param bit, code byte and scale bit over 3 steps.
    PYTHONPATH=<torchao 0.18 source> python tools/goldens/check_torchao_adam_reference.py"""
# Bit-exact check: torchao 0.18 low-bit AdamW (torch.compile on CPU) vs an independent numpy float32 reference.
import sys, time, numpy as np, torch
torch.set_num_threads(1)
import torchao.optim as O
from torchao.optim import subclass_8bit as S8, subclass_4bit as S4
from torchao.optim.subclass_8bit import OptimState8bit
from torchao.optim.subclass_4bit import OptimState4bit
from torchao.optim.subclass_fp8 import OptimStateFp8

f32 = np.float32
Q8S = np.array(S8.get_qmap_signed(), dtype=f32); Q8U = np.array(S8.get_qmap_unsigned(), dtype=f32)
Q4S = np.array(S4.get_qmap_signed(), dtype=f32); Q4U = np.array(S4.get_qmap_unsigned(), dtype=f32)

def bf16_to_f32(u16): return (u16.astype(np.uint32) << 16).view(f32)
def f32_to_bf16_rne(x):
    b = x.astype(f32).view(np.uint32).astype(np.uint64)
    r = ((b + 0x7FFF + ((b >> 16) & 1)) >> 16).astype(np.uint16)
    nan = np.isnan(x); r[nan] = ((b[nan] >> 16) | 0x40).astype(np.uint16)
    return r

# FP8 e4m3fn: value table for codes 0..126 (positive finite)
def e4m3_val(c):
    e = (c >> 3) & 0xF; m = c & 7
    return (m / 8.0) * 2.0**-6 if e == 0 else (1 + m / 8.0) * 2.0**(e - 7)
E4 = np.array([e4m3_val(c) for c in range(127)], dtype=np.float64)
def f32_to_e4m3fn(x):
    x = x.astype(f32); out = np.zeros(x.shape, np.uint8)
    sign = (x.view(np.uint32) >> 31).astype(np.uint8) << 7
    a = np.abs(x).astype(np.float64)
    idx = np.searchsorted(E4, a)  # E4[idx-1] < a <= E4[idx]
    idx = np.clip(idx, 1, 126)
    lo, hi = E4[idx - 1], E4[idx]
    pick_hi = (a - lo > hi - a) | ((a - lo == hi - a) & (idx % 2 == 0))
    mag = np.where(pick_hi, idx, idx - 1).astype(np.uint8)
    mag = np.where(a <= E4[0], 0, mag)
    # c10: |x| >= 480 -> NaN (0x7F); 464 <= |x| < 480 rounds to 0x7F as well
    mag = np.where(a >= 464.0, 0x7F, np.where(a > 448.0, 0x7E, mag)).astype(np.uint8)
    mag = np.where(np.isnan(a), 0x7F, mag).astype(np.uint8)
    return mag | sign
def e4m3fn_to_f32(c):
    mag = c & 0x7F; v = np.where(mag == 0x7F, np.nan, E4[np.minimum(mag, 126)])
    return np.where(c & 0x80, -v, v).astype(f32)

def quant_qmap(x, q):
    n = len(q); code = np.zeros(x.shape, np.int64); k = n // 2
    while k >= 1:
        code = code + np.where(x >= q[code + k], k, 0); k //= 2
    up = np.minimum(code + 1, n - 1)
    vd, vu = q[code], q[up]
    code = np.where((x - vd) >= (vu - vd) * f32(0.5), up, code)
    return code.astype(np.uint8)

class RefState:
    """kind: '8bit' | '4bit' | 'fp8' | 'plain'"""
    def __init__(self, kind, n, bs, signed, plain_dtype):
        self.kind, self.bs, self.signed = kind, bs, signed
        if kind == 'plain':
            self.dt = plain_dtype
            self.v = np.zeros(n, np.uint16 if plain_dtype == 'bf16' else f32)
        else:
            self.scale = np.zeros(n // bs, f32)
            self.q = (Q8S if signed else Q8U) if kind == '8bit' else (Q4S if signed else Q4U)
            self.codes = np.zeros(n, np.uint8)  # unpacked codes (4bit) / bit patterns (fp8)
    def deq(self):
        if self.kind == 'plain':
            return bf16_to_f32(self.v) if self.dt == 'bf16' else self.v.copy()
        if self.kind == 'fp8':
            return (e4m3fn_to_f32(self.codes).reshape(-1, self.bs) * self.scale[:, None]).reshape(-1)
        return (self.q[self.codes.astype(np.int64)].reshape(-1, self.bs) * self.scale[:, None]).reshape(-1)
    def store(self, x):
        if self.kind == 'plain':
            self.v = f32_to_bf16_rne(x) if self.dt == 'bf16' else x.copy(); return
        xb = x.reshape(-1, self.bs)
        amax = np.max(np.abs(xb), axis=1).astype(f32)
        amax = np.maximum(amax, f32(1e-12))
        if self.kind == 'fp8':
            sc = (amax / f32(448.0)).astype(f32)
            self.codes = f32_to_e4m3fn((xb / sc[:, None]).astype(f32)).reshape(-1)
        else:
            sc = amax
            self.codes = quant_qmap((xb / sc[:, None]).astype(f32).reshape(-1), self.q)
        self.scale = sc
    def packed(self):  # torchao's storage layout of codes
        if self.kind == '4bit':
            c = self.codes
            return ((c[0::2] << 4) | c[1::2]).astype(np.uint8)
        return self.codes

def ref_step(p, g, st, t, lr, b1, b2, wd, eps, adamw):
    # p, g: float32 arrays (already upcast); t: float32 step; lr: float32
    if adamw:
        p = p - f32(lr * f32(wd)) * p
    else:
        g = g + f32(wd) * p
    bc1 = f32(1) - np.power(f32(b1), f32(t)); bc2 = f32(1) - np.power(f32(b2), f32(t))
    def lerp(start, end, w):
        diff = end - start
        if w >= 0.5 or w <= -0.5:
            return end + diff * f32(-(1.0 - w))
        return start + diff * f32(w)
    m = lerp(st['m'].deq(), g, 1 - b1)
    v = lerp(st['v'].deq(), g * g, 1 - b2)
    st['m'].store(m); st['v'].store(v)
    denom = np.sqrt(v) / np.sqrt(bc2) + f32(eps)
    return p - (lr * (m / bc1)) / denom

def run(cls_name, pdtype, shape, steps=3, **kw):
    torch.manual_seed(1234)
    n = int(np.prod(shape))
    tdt = dict(f32=torch.float32, bf16=torch.bfloat16)[pdtype]
    p = torch.nn.Parameter(torch.randn(shape).to(tdt))
    opt = getattr(O, cls_name)([p], **kw)
    g0 = opt.param_groups[0]
    b1, b2 = g0['betas']; wd = g0['weight_decay']; eps = g0['eps']; adamw = opt.is_adamw; bs = opt.block_size
    kind = '8bit' if '8bit' in cls_name else '4bit' if '4bit' in cls_name else 'fp8'
    quant = n >= 4096 and n % bs == 0
    k = kind if quant else 'plain'
    st = {'m': RefState(k, n, bs, True, pdtype), 'v': RefState(k, n, bs, False, pdtype)}
    # reference param in f32 bits (or bf16 bits)
    if pdtype == 'bf16': rp = p.detach().view(torch.uint16).numpy().reshape(-1).copy()
    else: rp = p.detach().numpy().reshape(-1).copy()
    ok = True; times = []
    for s in range(1, steps + 1):
        g = torch.randn(shape).to(tdt) * (10.0 ** (s - 2))
        p.grad = g
        if s == 3 and 'lr_change' in sys.argv: g0['lr'].fill_(3e-4)
        t0 = time.time(); opt.step(); times.append(time.time() - t0)
        lr = f32(g0['lr'].item())
        gn = (bf16_to_f32(g.view(torch.uint16).numpy().reshape(-1)) if pdtype == 'bf16' else g.numpy().reshape(-1).copy())
        pf = bf16_to_f32(rp) if pdtype == 'bf16' else rp
        newp = ref_step(pf, gn, st, f32(s), lr, b1, b2, wd, eps, adamw).astype(f32)
        rp = f32_to_bf16_rne(newp) if pdtype == 'bf16' else newp
        S = opt.state[p]
        # compare param bits
        tp = p.detach().view(torch.uint16 if pdtype == 'bf16' else torch.int32).numpy().reshape(-1)
        rpb = rp.view(np.uint16 if pdtype == 'bf16' else np.int32)
        res = {'param': int((tp != rpb).sum())}
        for key, r in (('exp_avg', st['m']), ('exp_avg_sq', st['v'])):
            T = S[key]
            if k == 'plain':
                tv = T.detach().view(torch.uint16 if pdtype == 'bf16' else torch.int32).numpy().reshape(-1)
                res[key] = int((tv != r.v.view(np.uint16 if pdtype == 'bf16' else np.int32)).sum())
            else:
                tc = T.codes.view(torch.uint8).numpy().reshape(-1)
                res[key + '.codes'] = int((tc != r.packed()).sum())
                res[key + '.scale'] = int((T.scale.numpy().view(np.int32) != r.scale.view(np.int32)).sum())
        bad = any(v for v in res.values()); ok &= not bad
        print(f"  step {s}: mismatches {res}  ({times[-1]:.2f}s)")
    print(f"{cls_name} {pdtype} {shape} kw={kw} state={'quantized '+kind if quant else 'plain '+pdtype}: {'BIT-EXACT' if ok else 'MISMATCH'}", flush=True)
    return ok

if __name__ == '__main__':
    cfgs = {
        'a': [('AdamW8bit', 'f32', (4096,), {}), ('AdamW8bit', 'bf16', (64, 128), {}),
              ('Adam8bit', 'f32', (4096,), {'weight_decay': 0.01}),
              ('AdamW8bit', 'f32', (8192,), {'betas': (0.3, 0.6), 'lr': 1e-2, 'eps': 1e-6})],
        'b': [('AdamW4bit', 'f32', (4096,), {}), ('AdamW4bit', 'bf16', (32, 128), {}),
              ('AdamWFp8', 'f32', (4096,), {}), ('AdamWFp8', 'bf16', (16, 256), {})],
        'c': [('AdamW8bit', 'f32', (1000,), {}), ('AdamW8bit', 'bf16', (1000,), {}),
              ('AdamW8bit', 'f32', (4160,), {}), ('AdamW4bit', 'bf16', (4096 + 64,), {})],
    }
    allok = True
    for c in cfgs[sys.argv[1]]:
        allok &= run(c[0], c[1], c[2], **c[3])
    print("ALL OK" if allok else "SOME MISMATCH")
