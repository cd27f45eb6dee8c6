// Index of the largest of x[0..n) into out[0]; ties go to the lowest index,
// as numpy's argmax. One workgroup: dispatch (1, 1, 1).

struct Params {
    n: u32,
}

const WG: u32 = 256u;

@group(0) @binding(0) var<uniform> params: Params;
@group(0) @binding(1) var<storage, read> x: array<f32>;
@group(0) @binding(2) var<storage, read_write> out: array<u32>;

var<workgroup> best_v: array<f32, WG>;
var<workgroup> best_i: array<u32, WG>;

@compute @workgroup_size(WG)
fn main(@builtin(local_invocation_index) tid: u32) {
    var bv = -3.4028235e38;
    var bi = 0xffffffffu;
    // Each invocation scans a strided slice in increasing index order, so a
    // strict > keeps its first maximum.
    for (var i = tid; i < params.n; i += WG) {
        let v = x[i];
        if (v > bv || bi == 0xffffffffu) {
            bv = v;
            bi = i;
        }
    }
    best_v[tid] = bv;
    best_i[tid] = bi;
    workgroupBarrier();
    for (var stride = WG / 2u; stride > 0u; stride /= 2u) {
        if (tid < stride) {
            let ov = best_v[tid + stride];
            let oi = best_i[tid + stride];
            let mv = best_v[tid];
            let mi = best_i[tid];
            // An empty slot (index 0xffffffff) never wins; equal values keep the lower index.
            if (oi != 0xffffffffu && (mi == 0xffffffffu || ov > mv || (ov == mv && oi < mi))) {
                best_v[tid] = ov;
                best_i[tid] = oi;
            }
        }
        workgroupBarrier();
    }
    if (tid == 0u) {
        out[0] = best_i[0];
    }
}
