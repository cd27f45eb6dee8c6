// The gated DeltaNet's gates (qwen35; CPU reference infr/cpu/deltanet.py): per (row, V-head)
// beta' = sigmoid(beta) and g = softplus(alpha + dt_bias) * a (<= 0: a = -exp(A_log)), into
// gates[t, 0 .. H_v) and gates[t, H_v .. 2 H_v). consts = [dt_bias (H_v) | a (H_v) | ...].
// Dispatch (ceil(T * H_v / 64), 1, 1).

struct Params {
    h_v: u32,
    T: u32,
}

const WG: u32 = 64u;

@group(0) @binding(0) var<uniform> params: Params;
@group(0) @binding(1) var<storage, read> beta: array<f32>;  // [T, H_v]
@group(0) @binding(2) var<storage, read> alpha: array<f32>;  // [T, H_v]
@group(0) @binding(3) var<storage, read> consts: array<f32>;
@group(0) @binding(4) var<storage, read_write> gates: array<f32>;  // [T, 2 H_v]

// log(1 + y) accurate for small y (WGSL has no log1p): the rounding of 1 + y divided out.
fn log1p_(y: f32) -> f32 {
    let s = 1.0 + y;
    if (s == 1.0) {
        return y;
    }
    return log(s) * (y / (s - 1.0));
}

@compute @workgroup_size(WG)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let i = gid.x;
    let H = params.h_v;
    if (i >= params.T * H) {
        return;
    }
    let t = i / H;
    let h = i % H;
    gates[t * 2u * H + h] = 1.0 / (1.0 + exp(-beta[i]));
    let x = alpha[i] + consts[h];
    var sp = x;  // ggml's softplus: x itself above 20
    if (x <= 20.0) {
        sp = log1p_(exp(x));
    }
    gates[t * 2u * H + H + h] = sp * consts[H + h];
}
