// A DeltaNet layer's output (qwen35; CPU reference infr/cpu/deltanet.py): the delta rule's o
// (deltanet_rule.wgsl) RMS-normalised over each V-head's DK values, times norm and silu(z):
//   dst = o / sqrt(mean(o^2) + eps) * norm * silu(z).
// One workgroup per (V-head, row); rows past live[1] are padding. Dispatch (H_v, T, 1).

struct Params {
    h_v: u32,
    eps: f32,
}

const DK: u32 = {{DK}}u;
const WG: u32 = {{WG}}u;  // a power of two

@group(0) @binding(0) var<uniform> params: Params;
@group(0) @binding(1) var<storage, read> o: array<f32>;  // [T, H_v * DK]
@group(0) @binding(2) var<storage, read> z: array<f32>;  // [T, H_v * DK]
@group(0) @binding(3) var<storage, read> consts: array<f32>;  // [dt_bias | a | norm (DK)]
@group(0) @binding(4) var<storage, read> live: array<u32>;
@group(0) @binding(5) var<storage, read_write> dst: array<f32>;  // [T, H_v * DK]

var<workgroup> red: array<f32, WG>;

@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) tid: u32) {
    let h = wid.x;
    let t = wid.y;
    if (t >= live[1]) {
        return;
    }
    let H = params.h_v;
    let base = t * H * DK + h * DK;
    var acc = 0.0;
    for (var i = tid; i < DK; i += WG) {
        let v = o[base + i];
        acc += v * v;
    }
    red[tid] = acc;
    workgroupBarrier();
    for (var s = WG / 2u; s > 0u; s >>= 1u) {
        if (tid < s) {
            red[tid] += red[tid + s];
        }
        workgroupBarrier();
    }
    let inv = 1.0 / sqrt(red[0] / f32(DK) + params.eps);
    for (var i = tid; i < DK; i += WG) {
        let y = o[base + i] * inv * consts[2u * H + i];
        let zz = z[base + i];
        dst[base + i] = y * (zz / (1.0 + exp(-zz)));
    }
}
