"""wgsl/f16_bits.wgsl rounds f32 to f16 exactly as numpy does (round to nearest, ties to even;
subnormals; overflow to inf): the KV cache, q and the attention probabilities are f16 values the
CPU reference computes with numpy, whichever WebGPU implementation runs the kernel."""

from __future__ import annotations

import numpy as np

from infr.gpu.runtime import Dispatch, read, render_source, run, storage

KERNEL = """
@group(0) @binding(0) var<storage, read> x: array<f32>;
@group(0) @binding(1) var<storage, read_write> y: array<u32>;
// #include f16_bits
@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) g: vec3<u32>) {
    let i = g.x;
    if (2u * i + 1u < arrayLength(&x)) {
        y[i] = pack_f16(x[2u * i], x[2u * i + 1u]);
    }
}
"""


def _values() -> np.ndarray:
    rng = np.random.default_rng(0)
    f16 = np.arange(0, 0x7C00, dtype=np.uint16).view(np.float16).astype(np.float32)  # every finite f16
    mid = (f16[:-1] + f16[1:]) / 2  # exact ties between neighbours: ties go to the even one
    near = np.concatenate([np.nextafter(mid, 0, dtype=np.float32), np.nextafter(mid, 1e9, dtype=np.float32)])
    wide = (rng.standard_normal(20000) * np.exp(rng.uniform(-25, 12, 20000))).astype(np.float32)
    edge = np.array([65504, 65519.99, 65520, 7e4, 1e-8, 2.0**-25, 3 * 2.0**-26, 2.0**-14, 2.0**-24], np.float32)
    v = np.concatenate([f16, mid, near, wide, edge])
    return np.concatenate([v, -v])


def test_f16_bits_rounds_as_numpy(gpu):
    x = _values()
    if x.size % 2:
        x = np.append(x, np.float32(0))
    module = gpu.device.create_shader_module(code=render_source(KERNEL))
    pipe = gpu.device.create_compute_pipeline(layout="auto", compute={"module": module, "entry_point": "main"})
    y = storage(gpu, x.size * 2)
    xb = storage(gpu, x)
    bind = gpu.device.create_bind_group(layout=pipe.get_bind_group_layout(0), entries=[
        {"binding": 0, "resource": {"buffer": xb, "offset": 0, "size": x.nbytes}},
        {"binding": 1, "resource": {"buffer": y, "offset": 0, "size": y.size}}])
    run(gpu, [Dispatch(pipe, bind, (-(-x.size // 128), 1, 1))])
    got = read(gpu, y, np.uint16, x.size)
    want = x.astype(np.float16).view(np.uint16)
    bad = np.flatnonzero(got != want)
    assert bad.size == 0, [(float(x[i]), hex(got[i]), hex(want[i])) for i in bad[:8]]
