// Split-K decode attention, pass 3 of 3: out[t, h] = sum over the chunks the
// query sees of attn_values' partial outputs (zeros for a padding row).
// Dispatch (n_heads, T, 1).

// #include attn_common
// #include attn_q8_{{Q8}}

const WG: u32 = 64u;

@group(0) @binding(0) var<uniform> params: Params;
@group(0) @binding(1) var<storage, read> part: array<vec4<f32>>;
@group(0) @binding(2) var<storage, read_write> out: array<vec4<f32>>;
@group(0) @binding(3) var<storage, read> state: array<u32>;
@group(0) @binding(4) var<storage, read> rows: array<u32>;

// KV_MIN > 0: the one-pass kernel takes the rows that see at most KV_MIN keys
// (short contexts, and padding rows); split-K does nothing for them.
const KV_MIN: u32 = {{KV_MIN}}u;

@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) tid: u32) {
    let h = wid.x;
    let t = wid.y;
    let rk = row_keys(t);
    if (KV_MIN > 0u && rk.hi <= KV_MIN) {
        return;
    }
    let c_lo = rk.lo / {{C}}u;
    let c_end = (rk.hi + {{C}}u - 1u) / {{C}}u;  // none for a padding row (hi = 0)
    let lanes = params.v_head_dim / 4u;
    let row = (t * params.n_heads + h) * params.max_chunks;
    var mine = vec4<f32>(0.0);  // this invocation's first 4 dims (the rounded copy takes v_head_dim <= 4 WG)
    for (var i = tid; i < lanes; i += WG) {
        var sum = vec4<f32>(0.0);
        for (var cc = c_lo; cc < c_end; cc++) {
            sum += part[(row + cc) * lanes + i];
        }
        out[(t * params.n_heads + h) * lanes + i] = sum;
        if (i == tid) {
            mine = sum;
        }
    }
    q8_out(mine, h * params.v_head_dim + 4u * tid, tid, tid < lanes, t);
}
