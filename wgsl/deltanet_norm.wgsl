// A DeltaNet layer's output (qwen35; CPU reference infr/cpu/deltanet.py): the delta rule's o
// (deltanet_rule.wgsl) RMS-normalised over each V-head's DK values, times norm and silu(z):
//   dst = o / sqrt(mean(o^2) + eps) * norm * silu(z);
// with Q8 "on" also rounded to 8 bits per 32 values (attn_q8_on.wgsl) for the int8 GEMV of the
// output projection, which then needs no quantize dispatch of its own.
// One workgroup per (V-head, row), invocation tid holding the head's values 4 tid .. 4 tid + 3
// (256 invocations: q8_store's shape; DK <= 256). Rows past live[1] are padding.
// Dispatch (H_v, T, 1).
// #include attn_q8_{{Q8}}

struct Params {
    h_v: u32,
    eps: f32,
}

const DK: u32 = {{DK}}u;
const WG: u32 = 256u;
const LANES: u32 = 64u;  // invocations that can hold values: 4 * 64 = 256 >= DK

@group(0) @binding(0) var<uniform> params: Params;
@group(0) @binding(1) var<storage, read> o: array<f32>;  // [T, H_v * DK]
@group(0) @binding(2) var<storage, read> z: array<f32>;  // [T, H_v * DK]
@group(0) @binding(3) var<storage, read> consts: array<f32>;  // [dt_bias | a | norm (DK)]
@group(0) @binding(4) var<storage, read> live: array<u32>;
@group(0) @binding(5) var<storage, read_write> dst: array<f32>;  // [T, H_v * DK]

var<workgroup> red: array<f32, LANES>;

@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) tid: u32) {
    let h = wid.x;
    let t = wid.y;
    if (t >= live[1]) {
        return;
    }
    let H = params.h_v;
    let base = t * H * DK + h * DK;
    var vals = vec4<f32>(0.0);
    for (var c = 0u; c < 4u; c++) {
        if (4u * tid + c < DK) {
            vals[c] = o[base + 4u * tid + c];
        }
    }
    if (tid < LANES) {
        red[tid] = dot(vals, vals);
    }
    workgroupBarrier();
    for (var s = LANES / 2u; s > 0u; s >>= 1u) {
        if (tid < s) {
            red[tid] += red[tid + s];
        }
        workgroupBarrier();
    }
    let inv = 1.0 / sqrt(red[0] / f32(DK) + params.eps);
    var y = vec4<f32>(0.0);
    for (var c = 0u; c < 4u; c++) {
        let i = 4u * tid + c;
        if (i < DK) {
            let zz = z[base + i];
            y[c] = vals[c] * inv * consts[2u * H + i] * (zz / (1.0 + exp(-zz)));
            dst[base + i] = y[c];
        }
    }
    q8_out(y, h * DK + 4u * tid, tid, 4u * tid < DK, t);
}
