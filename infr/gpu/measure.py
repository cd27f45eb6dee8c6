"""Small GPU measurements for the notebooks: the adapter's read bandwidth and
one kernel's time across shapes and quant types.

Times come from timestamp queries: pass-level (`timestamp-query`, written at
the beginning and end of a compute pass) for the bandwidth probe, and one
per dispatch (`timestamp-query-inside-passes`, through infr.gpu.profile's
Timer) for kernels. Without those features the host clock of a synchronous
submit -> readback stands in, and `source` says which one was used.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from types import SimpleNamespace

import numpy as np

from infr.gpu import kernels_matmul as KM
from infr.gpu import profile
from infr.gpu.device import Device
from infr.gpu.runtime import Dispatch, Kernels, Recording, read, storage

# A grid-stride read of every 16-byte word, XOR-folded so the loads cannot be dropped.
READ_WGSL = """
@group(0) @binding(0) var<storage, read> src: array<vec4<u32>>;
@group(0) @binding(1) var<storage, read_write> dst: array<u32>;
@compute @workgroup_size(256)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let stride = nwg.x * 256u;
    var acc = vec4<u32>(0u);
    for (var i = gid.x; i < arrayLength(&src); i += stride) {
        acc ^= src[i];
    }
    dst[gid.x] = acc.x ^ acc.y ^ acc.z ^ acc.w;
}
"""


@dataclass
class Bandwidth:
    gbps: float
    nbytes: int
    seconds: float
    source: str  # "pass timestamps" or "host clock"


def _pass_seconds(dev: Device, encode, reps: int) -> tuple[float, str]:
    """Best-of-`reps` seconds of one compute pass filled by `encode(cpass)`."""
    BU = dev.api.BufferUsage
    q = dev.device.queue
    stamped = dev.has("timestamp-query")
    if stamped:
        qs = dev.device.create_query_set(type="timestamp", count=2)
        resolve = dev.device.create_buffer(size=16, usage=BU.QUERY_RESOLVE | BU.COPY_SRC)
    best = float("inf")
    for _ in range(reps):
        enc = dev.device.create_command_encoder()
        writes = {"query_set": qs, "beginning_of_pass_write_index": 0, "end_of_pass_write_index": 1} if stamped else None
        cp = enc.begin_compute_pass(timestamp_writes=writes)
        encode(cp)
        cp.end()
        if stamped:
            enc.resolve_query_set(qs, 0, 2, resolve, 0)
        t0 = time.perf_counter()
        q.submit([enc.finish()])
        if stamped:
            ts = np.frombuffer(q.read_buffer(resolve), np.uint64)
            sec = (int(ts[1]) - int(ts[0])) / 1e9
        else:
            q.on_submitted_work_done_sync()
            sec = time.perf_counter() - t0
        best = min(best, sec)
    return best, "pass timestamps" if stamped else "host clock"


def read_bandwidth(dev: Device, nbytes: int | None = None, reps: int = 3) -> Bandwidth:
    """GB/s of a streaming read of `nbytes` (default: 64 MiB on a CPU adapter,
    512 MiB capped by the binding limit elsewhere). The ceiling a weight-bound
    kernel can reach on this adapter through WGSL."""
    if nbytes is None:
        nbytes = (64 << 20) if dev.is_cpu else (512 << 20)
    nbytes = min(nbytes, dev.max_binding) // 16 * 16
    mod = dev.device.create_shader_module(label="read_bandwidth", code=READ_WGSL)
    pipe = dev.device.create_compute_pipeline(label="read_bandwidth", layout="auto",
                                              compute={"module": mod, "entry_point": "main"})
    src = storage(dev, nbytes, label="bandwidth.src")
    groups = 1024
    dst = storage(dev, groups * 256 * 4, label="bandwidth.dst")
    bind = Kernels(dev).bind(pipe, [src, dst])

    def encode(cp):
        cp.set_pipeline(pipe)
        cp.set_bind_group(0, bind)
        cp.dispatch_workgroups(groups, 1, 1)

    _pass_seconds(dev, encode, 1)  # warm-up
    sec, source = _pass_seconds(dev, encode, reps)
    return Bandwidth(nbytes / sec / 1e9, nbytes, sec, source)


def time_dispatches(dev: Device, dispatches: list[Dispatch], reps: int = 5) -> tuple[dict[str, float], str]:
    """µs of the fastest of `reps` runs of `dispatches` (encoded in one pass), per
    label, from timestamps around each dispatch; without `timestamp-query-inside-passes`
    the whole pass's time / reps under the label "pass"."""
    rec = Recording(dispatches)
    _pass_seconds(dev, lambda cp: rec.encode(cp), 1)  # warm-up: lavapipe compiles a shader at its first dispatch
    if dev.has("timestamp-query-inside-passes"):
        timer = profile.Timer(dev)
        enc = dev.device.create_command_encoder()
        cp = enc.begin_compute_pass()
        rec.encode(cp, times=reps, timer=timer)
        cp.end()
        dev.device.queue.submit([profile.finish_encoder(enc, timer, 0)])
        spans = timer.spans()
        n = len(dispatches)
        runs = [spans[i * n:(i + 1) * n] for i in range(reps)]
        best = min(runs, key=lambda r: sum(ns for _, ns in r))  # the fastest run: a shared CPU adapter is noisy
        out: dict[str, float] = {}
        for d, ns in best:
            out[d.label] = out.get(d.label, 0.0) + ns / 1e3
        return out, "dispatch timestamps"
    sec, source = _pass_seconds(dev, lambda cp: rec.encode(cp, times=reps), 1)
    return {"pass": sec * 1e6 / reps}, source


# --- one matmul kernel across shapes and quant types


def random_weight(qtype, N: int, K: int, seed: int = 0) -> SimpleNamespace:
    """A random [N, K] matrix in `qtype`'s GGUF layout (quantized from normal floats)."""
    from infr import synth

    q = KM.as_qtype(qtype)
    values = np.random.default_rng([seed, int(q), N, K]).standard_normal((N, K)).astype(np.float32)
    if q.name == "F32":
        raw = values
    elif q.name == "F16":
        raw = values.astype(np.float16)
    else:
        raw = synth.encode(values, q)
    return SimpleNamespace(name=f"w_{q.name.lower()}_{N}x{K}", qtype=q, shape=(N, K), raw=raw)


@dataclass
class MatmulCase:
    qtype: str
    N: int
    K: int
    T: int
    us: float            # GPU µs per call: every dispatch of the op (Q4_K: the activations' quantization too)
    kernel_us: dict      # per dispatch label
    weight_bytes: int
    max_err: float       # max |got - want| / (|x| |W[r]|) against the numpy reference
    source: str

    @property
    def gbps(self) -> float:
        return self.weight_bytes / self.us / 1e3

    @property
    def gflops(self) -> float:
        return 2.0 * self.N * self.K * self.T / self.us / 1e3


def matmul_case(dev: Device, kern: Kernels, qtype, N: int, K: int, T: int = 1, reps: int = 5) -> MatmulCase:
    """Run the backend's matmul dispatches for one weight (the same ones a model
    gets), check the output against the numpy reference, and time them."""
    from infr.numerics import matmul_input

    w = random_weight(qtype, N, K)
    x = np.random.default_rng([1, N, K, T]).standard_normal((T, K)).astype(np.float32)
    chunks = KM.upload_weight(dev, w)
    y = storage(dev, 4 * N * T, label="y")
    ds = KM.matmul_dispatches(kern, w, chunks, storage(dev, x), y, None, T)
    per_label, source = time_dispatches(dev, ds, reps)
    got = read(dev, y, count=N * T).reshape(T, N)
    W = _dequant(w)
    xin = matmul_input(x, w.qtype)  # the activations as the kernel multiplies them (Q4_K: 8-bit)
    want = xin.astype(np.float64) @ W.T.astype(np.float64)
    scale = np.linalg.norm(xin, axis=1)[:, None] * np.linalg.norm(W, axis=1)[None, :]
    err = float(np.max(np.abs(got - want) / scale))
    nbytes = sum(d.bytes for d in ds)
    return MatmulCase(w.qtype.name, N, K, T, sum(per_label.values()), per_label, nbytes, err, source)


def _dequant(w) -> np.ndarray:
    """The reference values of a random_weight, through gguf's own dequantizer."""
    from gguf.quants import dequantize

    if w.qtype.name in ("F32", "F16"):
        return np.asarray(w.raw, np.float32).reshape(w.shape)
    return dequantize(np.ascontiguousarray(w.raw), w.qtype).reshape(w.shape).astype(np.float32)
