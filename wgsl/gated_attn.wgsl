// qwen35's gated attention, elementwise (CPU reference: infr/cpu/kinds.py).
// head_slice: dst[t, h * D + i] = src[t, h * 2D + part * D + i] (attn_q's rows are per head
//   [q_h | gate_h]); n = T * H * D.
// sigmoid_mul: y = x * sigmoid(gate), written to another buffer (the ping-pong pair's other
//   half: a writable binding may not alias a read one); n = T * width.
// Dispatch (ceil(n / 256), 1, 1), folded into y past the per-dimension limit.

struct Params {
    n: u32,
    head_dim: u32,
    part: u32,
}

const WG: u32 = 256u;

@group(0) @binding(0) var<uniform> params: Params;
@group(0) @binding(1) var<storage, read> a: array<f32>;  // src (head_slice), x (sigmoid_mul)
@group(0) @binding(2) var<storage, read> b: array<f32>;  // gate (sigmoid_mul); unread by head_slice
@group(0) @binding(3) var<storage, read_write> y: array<f32>;

fn index(gid: vec3<u32>, nwg: vec3<u32>) -> u32 {
    return gid.x + gid.y * nwg.x * WG;
}

@compute @workgroup_size(WG)
fn head_slice(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = index(gid, nwg);
    if (i >= params.n) {
        return;
    }
    let D = params.head_dim;
    let head = i / D;  // over every row's heads: row t's head h is t * H + h
    y[i] = a[head * 2u * D + params.part * D + i % D];
}

@compute @workgroup_size(WG)
fn sigmoid_mul(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = index(gid, nwg);
    if (i >= params.n) {
        return;
    }
    y[i] = a[i] * (1.0 / (1.0 + exp(-b[i])));
}
