"""Where the Q4_K GEMV's bandwidth goes: the platform's read ceiling through
wgpu, the GEMV's access pattern without its arithmetic, and the GEMV itself.

    source .gpu/setup.sh && python3 perf/bw_probe.py        # H200
    PROBE_SMALL=1 python3 perf/bw_probe.py                   # a smoke run on lavapipe

Rows printed (GB/s of weight bytes, host-timed over 200 dispatches in one
pass rotating over > 300 MB of copies, best of 3):
  read Lk      a grid-stride vec4 read of 4 x 256 MB with k loads in flight per thread
  loads        the gemv_q4_k access pattern (header + nibbles per row, R = 2), XOR only
  loads+x      the same plus its activation loads
  gemv         the shipped kernel (kernels_matmul.matmul_dispatches)
  q8 Rr        the activations quantized to int8 per 32 (scale, scaled sum) and the
               nibbles multiplied by dot4I8Packed (the error vs f32 is printed)
Writes bw-probe.json to $OUT (or perf/).
"""

from __future__ import annotations

import datetime as dt
import json
import os
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gemv_bench import _Tensor, random_q4_k
from timing import seconds_per_rep

from infr.gpu import kernels_matmul as KM
from infr.gpu.device import get_device
from infr.gpu.runtime import Dispatch, Kernels, storage

SMALL = bool(os.environ.get("PROBE_SMALL"))
REPS = 20 if SMALL else 200

READ = """
@group(0) @binding(0) var<storage, read> src: array<vec4<u32>>;
@group(0) @binding(1) var<storage, read_write> dst: array<u32>;
const L: u32 = {L}u;
@compute @workgroup_size(256)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {{
    let n = arrayLength(&src);
    let stride = nwg.x * 256u;
    var acc = vec4<u32>(0u);
    for (var i = gid.x; i + (L - 1u) * stride < n; i += L * stride) {{
        for (var k = 0u; k < L; k++) {{
            acc ^= src[i + k * stride];
        }}
    }}
    dst[gid.x % 1024u] = acc.x ^ acc.y ^ acc.z ^ acc.w;
}}
"""

# The gemv_q4_k loop with the arithmetic replaced by XOR (R = 2 rows per team, U = 1).
LOADS = """
struct P {{ K: u32, N: u32, rowv: u32, pad: u32 }}
@group(0) @binding(0) var<uniform> p: P;
@group(0) @binding(1) var<storage, read> w: array<vec4<u32>>;
@group(0) @binding(2) var<storage, read> x: array<vec4<f32>>;
@group(0) @binding(3) var<storage, read_write> y: array<u32>;
const WITH_X: bool = {WITH_X};
@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) tid: u32) {{
    let team = tid / 32u;
    let lane = tid % 32u;
    let part = lane % 8u;
    let first = (wid.x * 8u + team) * 2u;
    let b0 = min(first, p.N - 1u) * p.rowv;
    let b1 = min(first + 1u, p.N - 1u) * p.rowv;
    let nb = p.K / 256u;
    var acc = vec4<u32>(0u);
    for (var b = lane / 8u; b < nb; b += 4u) {{
        acc ^= w[b0 + b * 9u] ^ w[b0 + b * 9u + 1u + part] ^ w[b1 + b * 9u] ^ w[b1 + b * 9u + 1u + part];
        if (WITH_X) {{
            let xo = (b * 256u + 32u * part) / 4u;
            for (var j = 0u; j < 8u; j++) {{
                acc ^= bitcast<vec4<u32>>(x[xo + j]);
            }}
        }}
    }}
    let s = acc.x ^ acc.y ^ acc.z ^ acc.w;
    if (s == 0x12345678u) {{
        y[first] = s;
    }}
}}
"""


# x quantized per 32 values: xq (8 u32 of int8 per block), xs (d, d * sum(q)) per block.
QUANT = """
@group(0) @binding(0) var<storage, read> x: array<f32>;
@group(0) @binding(1) var<storage, read_write> xq: array<u32>;
@group(0) @binding(2) var<storage, read_write> xs: array<vec2<f32>>;
@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {{
    let j = gid.x;
    if (j >= arrayLength(&xs)) {{
        return;
    }}
    var amax = 0.0;
    for (var i = 0u; i < 32u; i++) {{
        amax = max(amax, abs(x[32u * j + i]));
    }}
    let d = amax / 127.0;
    let inv = select(0.0, 1.0 / d, d > 0.0);
    var s = 0i;
    for (var k = 0u; k < 8u; k++) {{
        var word = 0u;
        for (var i = 0u; i < 4u; i++) {{
            let q = i32(round(x[32u * j + 4u * k + i] * inv));
            s += q;
            word |= (u32(q) & 0xFFu) << (8u * i);
        }}
        xq[8u * j + k] = word;
    }}
    xs[j] = vec2<f32>(d, d * f32(s));
}}
"""

Q8 = """
struct P {{ K: u32, N: u32, rowv: u32, pad: u32 }}
@group(0) @binding(0) var<uniform> p: P;
@group(0) @binding(1) var<storage, read> w: array<vec4<u32>>;
@group(0) @binding(2) var<storage, read> xq: array<vec4<u32>>;
@group(0) @binding(3) var<storage, read> xs: array<vec2<f32>>;
@group(0) @binding(4) var<storage, read_write> y: array<f32>;
const R: u32 = {R}u;
const M: u32 = 0x0F0F0F0Fu;
const SG32: bool = {SG32};
var<workgroup> red: array<f32, 256>;

fn bytes6(v: u32) -> vec4<f32> {{
    return vec4<f32>((vec4<u32>(v) >> vec4<u32>(0u, 8u, 16u, 24u)) & vec4<u32>(0xFFu));
}}

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) tid: u32) {{
    let team = tid / 32u;
    let lane = tid % 32u;
    let part = lane % 8u;
    let c = part / 2u;
    let half = part % 2u;
    let first = (wid.x * 8u + team) * R;
    var base: array<u32, R>;
    for (var i = 0u; i < R; i++) {{
        base[i] = min(first + i, p.N - 1u) * p.rowv;
    }}
    let nb = p.K / 256u;
    var acc: array<f32, R>;
    for (var b = lane / 8u; b < nb; b += 4u) {{
        let ja = b * 8u + 2u * c;  // the 32-value x blocks of sub-blocks 2c and 2c + 1
        let xa = xq[2u * ja + half];
        let xb = xq[2u * ja + 2u + half];
        let sa = xs[ja];
        let sb = xs[ja + 1u];
        for (var i = 0u; i < R; i++) {{
            let hd = w[base[i] + b * 9u];
            let q = w[base[i] + b * 9u + 1u + part];
            let dm = unpack2x16float(hd.x);
            let sc_lo = bytes6(hd.y & 0x3F3F3F3Fu);
            let sc_hi = bytes6((hd.w & 0x0F0F0F0Fu) | ((hd.y >> 2u) & 0x30303030u));
            let mn_lo = bytes6(hd.z & 0x3F3F3F3Fu);
            let mn_hi = bytes6(((hd.w >> 4u) & 0x0F0F0F0Fu) | ((hd.z >> 2u) & 0x30303030u));
            let i0 = 2u * c;
            let i1 = i0 + 1u;
            let sca = select(sc_lo[i0 & 3u], sc_hi[i0 & 3u], i0 >= 4u);
            let scb = select(sc_lo[i1 & 3u], sc_hi[i1 & 3u], i1 >= 4u);
            let ma = select(mn_lo[i0 & 3u], mn_hi[i0 & 3u], i0 >= 4u);
            let mb = select(mn_lo[i1 & 3u], mn_hi[i1 & 3u], i1 >= 4u);
            let ia = dot4I8Packed(q.x & M, xa.x) + dot4I8Packed(q.y & M, xa.y) + dot4I8Packed(q.z & M, xa.z) + dot4I8Packed(q.w & M, xa.w);
            let ib = dot4I8Packed((q.x >> 4u) & M, xb.x) + dot4I8Packed((q.y >> 4u) & M, xb.y) + dot4I8Packed((q.z >> 4u) & M, xb.z) + dot4I8Packed((q.w >> 4u) & M, xb.w);
            var v = dm.x * (sca * sa.x * f32(ia) + scb * sb.x * f32(ib));
            if (half == 0u) {{
                v -= dm.y * (ma * sa.y + mb * sb.y);
            }}
            acc[i] += v;
        }}
    }}
    for (var i = 0u; i < R; i++) {{
        var s = 0.0;
        if (SG32) {{
            s = subgroupAdd(acc[i]);
        }} else {{  // any other subgroup size (lavapipe's 8): through shared memory
            red[tid] = acc[i];
            workgroupBarrier();
            if (lane == 0u) {{
                for (var k = 0u; k < 32u; k++) {{
                    s += red[tid + k];
                }}
            }}
            workgroupBarrier();
        }}
        if (lane == 0u && first + i < p.N) {{
            y[first + i] = s;
        }}
    }}
}}
"""


def _pipe(dev, src: str):
    m = dev.device.create_shader_module(code=src)
    return dev.device.create_compute_pipeline(layout="auto", compute={"module": m, "entry_point": "main"})


def _bind(dev, pipe, bufs):
    entries = [{"binding": i, "resource": {"buffer": b}} for i, b in enumerate(bufs)]
    return dev.device.create_bind_group(layout=pipe.get_bind_group_layout(0), entries=entries)


def _time(dev, ds: list[Dispatch], sync_buf) -> float:
    """Seconds per dispatch, best of 3 after a warm-up."""
    return seconds_per_rep(dev, [[d] for d in ds], REPS, sync_buf)


def read_ceiling(dev, rows: list) -> None:
    size = (16 if SMALL else 256) * 2**20
    bufs = [storage(dev, size) for _ in range(4)]
    dst = storage(dev, 4096)
    for L in (1, 4, 8):
        pipe = _pipe(dev, READ.format(L=L))
        for groups in (1024, 4096):
            ds = [Dispatch(pipe, _bind(dev, pipe, [b, dst]), (groups, 1, 1), "read") for b in bufs]
            sec = _time(dev, ds, dst)
            rows.append({"probe": f"read L{L} groups{groups}", "gbps": size / sec / 1e9, "us": sec * 1e6})
            print(rows[-1], flush=True)


def gemv_probes(dev, rows: list) -> None:
    kern = Kernels(dev)
    shapes = [(512, 1024)] if SMALL else [(14336, 4096), (4096, 14336), (4096, 4096), (128256, 4096)]
    rng = np.random.default_rng(0)
    for N, K in shapes:
        rb = K // 256 * 144
        copies = 2 if SMALL else max(2, -(-300_000_000 // (N * rb)))
        raw = random_q4_k(rng, N, K)
        bufs = [storage(dev, raw.reshape(-1)) for _ in range(copies)]
        x = storage(dev, rng.standard_normal(K).astype(np.float32))
        y = storage(dev, 4 * N)
        nbytes = N * rb
        params = storage(dev, np.array([K, N, rb // 16, 0], np.uint32), uniform=True)
        for with_x in (False, True):
            pipe = _pipe(dev, LOADS.format(WITH_X=str(with_x).lower()))
            ds = [Dispatch(pipe, _bind(dev, pipe, [params, b, x, y]), (-(-N // 16), 1, 1), "loads") for b in bufs]
            sec = _time(dev, ds, y)
            rows.append({"probe": f"loads{'+x' if with_x else ''} {N}x{K}", "gbps": nbytes / sec / 1e9, "us": sec * 1e6})
            print(rows[-1], flush=True)
        t = _Tensor(N, K)
        ds = []
        for b in bufs:
            ds += KM.matmul_dispatches(kern, t, [(b, 0, N)], x, y, None, 1)
        sec = _time(dev, ds, y)
        rows.append({"probe": f"gemv {N}x{K}", "gbps": nbytes / sec / 1e9, "us": sec * 1e6})
        print(rows[-1], flush=True)
        if dev.subgroup_size:
            q8_probe(dev, rows, N, K, raw, bufs, x, y, params, nbytes)


def q8_probe(dev, rows, N, K, raw, bufs, x, y, params, nbytes) -> None:
    from gguf import GGMLQuantizationType, dequantize

    xq = storage(dev, K)
    xs = storage(dev, K // 32 * 8)
    qp = _pipe(dev, QUANT.format())
    quant = Dispatch(qp, _bind(dev, qp, [x, xq, xs]), (-(-K // 32 // 64), 1, 1), "quant")
    sec = _time(dev, [quant], xs)
    rows.append({"probe": f"quantize x {K}", "us": sec * 1e6})
    print(rows[-1], flush=True)
    from infr.gpu.runtime import run
    run(dev, [quant])
    xv = np.frombuffer(dev.device.queue.read_buffer(x), np.float32)[:K]
    ref = dequantize(raw.reshape(N, -1), GGMLQuantizationType.Q4_K).reshape(N, K) @ xv
    for R in (1, 2, 4):
        pipe = _pipe(dev, Q8.format(R=R, SG32=str(dev.subgroup_size == 32).lower()))
        ds = [Dispatch(pipe, _bind(dev, pipe, [params, b, xq, xs, y]), (-(-N // (8 * R)), 1, 1), "q8") for b in bufs]
        run(dev, ds[:1])  # copy 0 holds `raw`: every copy is the same matrix
        got = np.frombuffer(dev.device.queue.read_buffer(y), np.float32)[:N]
        err = float(np.abs(got - ref).max() / np.abs(ref).max())
        sec = _time(dev, ds, y)
        rows.append({"probe": f"q8 R{R} {N}x{K}", "gbps": nbytes / sec / 1e9, "us": sec * 1e6, "max_rel_err": err})
        print(rows[-1], flush=True)


def main() -> None:
    dev = get_device()
    out = {"adapter": dev.name, "date": dt.date.today().isoformat(), "command": "python3 perf/bw_probe.py", "rows": []}
    read_ceiling(dev, out["rows"])
    gemv_probes(dev, out["rows"])
    Path(os.environ.get("OUT") or Path(__file__).parent, "bw-probe.json").write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
