// The shared expert's gate (ffn_gate_inp_shexp): y[t] = buf[t] * sigmoid(src[t] . weight), one
// scalar per row. One workgroup per row: the dot product summed in a shared-memory tree.
// dispatch (T, 1, 1).

struct Params {
    D: u32,
    T: u32,
}

const WG: u32 = 64u;

@group(0) @binding(0) var<uniform> params: Params;
@group(0) @binding(1) var<storage, read> buf: array<f32>;
@group(0) @binding(2) var<storage, read> src: array<f32>;
@group(0) @binding(3) var<storage, read> weight: array<f32>;
@group(0) @binding(4) var<storage, read_write> y: array<f32>;

var<workgroup> part: array<f32, WG>;

@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) tid: u32) {
    let t = wid.x;
    if (t >= params.T) {
        return;
    }
    let row = t * params.D;
    var acc = 0.0;
    for (var c = tid; c < params.D; c += WG) {
        acc += src[row + c] * weight[c];
    }
    part[tid] = acc;
    workgroupBarrier();
    for (var s = WG / 2u; s > 0u; s >>= 1u) {
        if (tid < s) {
            part[tid] += part[tid + s];
        }
        workgroupBarrier();
    }
    let g = 1.0 / (1.0 + exp(-part[0]));
    for (var c = tid; c < params.D; c += WG) {
        y[row + c] = buf[row + c] * g;
    }
}
