// The gated DeltaNet's causal depthwise conv and its gates (qwen35; CPU reference
// infr/cpu/deltanet.py), token-serial per sequence slot.
//
// conv: one invocation per channel c of the [q | k | v] projection walks the live rows in batch
// order (a slot's rows come in position order; the host checks), each row through its slot's
// conv state: u[t, c] = silu(sum_j X[j] * w[c, j]) over X = [the slot's last d_conv - 1 inputs ;
// qkv[t, c]], then the state keeps the last d_conv - 1 rows of X. A row at position 0 starts its
// slot from zeros. Rows past live[1] are padding, never read. Dispatch (ceil(conv_dim / 64), 1, 1).
//
// rstate (one DeltaNet layer): per slot `slot_stride` floats, the conv state first,
// [d_conv - 1, conv_dim] oldest row first.

struct Params {
    conv_dim: u32,
    d_conv: u32,
    slot_stride: u32,
}

const WG: u32 = 64u;
const K: u32 = {{K}}u;  // d_conv: the taps in registers
const NONE: u32 = 0xffffffffu;

@group(0) @binding(0) var<uniform> params: Params;
@group(0) @binding(1) var<storage, read> qkv: array<f32>;
@group(0) @binding(2) var<storage, read> w: array<f32>;  // [conv_dim, d_conv]
@group(0) @binding(3) var<storage, read> live: array<u32>;  // the backend's state: [1] live rows
@group(0) @binding(4) var<storage, read> rows: array<u32>;  // [2t] position, [2t + 1] slot
@group(0) @binding(5) var<storage, read_write> rstate: array<f32>;
@group(0) @binding(6) var<storage, read_write> u: array<f32>;  // [T, conv_dim]

// The conv state is kept in registers while rows of one slot follow each other (a prompt chunk:
// all of them), read from rstate when the slot changes and written back when it leaves: a row
// then costs no round trip through memory, which made a 512-row prompt latency-bound.
@compute @workgroup_size(WG)
fn conv(@builtin(global_invocation_id) gid: vec3<u32>) {
    let c = gid.x;
    let C = params.conv_dim;
    if (c >= C) {
        return;
    }
    var wc: array<f32, K>;
    for (var j = 0u; j < K; j++) {
        wc[j] = w[c * K + j];
    }
    var st: array<f32, K>;  // the current slot's last K - 1 inputs, oldest first
    var cur = NONE;
    let n = live[1];
    for (var t = 0u; t < n; t++) {
        let p = rows[2u * t];
        let slot = rows[2u * t + 1u];
        let x = qkv[t * C + c];
        if (slot != cur) {
            if (cur != NONE) {
                for (var j = 0u; j + 1u < K; j++) {
                    rstate[cur * params.slot_stride + c + j * C] = st[j];
                }
            }
            cur = slot;
            for (var j = 0u; j + 1u < K; j++) {  // zeros at position 0
                st[j] = select(0.0, rstate[slot * params.slot_stride + c + j * C], p != 0u);
            }
        } else if (p == 0u) {
            for (var j = 0u; j + 1u < K; j++) {
                st[j] = 0.0;
            }
        }
        var acc = 0.0;
        for (var j = 0u; j + 1u < K; j++) {
            acc += st[j] * wc[j];
        }
        acc += x * wc[K - 1u];
        for (var j = 0u; j + 2u < K; j++) {
            st[j] = st[j + 1u];
        }
        if (K > 1u) {
            st[max(K, 2u) - 2u] = x;
        }
        u[t * C + c] = acc / (1.0 + exp(-acc));
    }
    if (cur != NONE) {
        for (var j = 0u; j + 1u < K; j++) {
            rstate[cur * params.slot_stride + c + j * C] = st[j];
        }
    }
}
