// Q4_K matrix times activations, coalesced: a team of 32 invocations reads one
// block per step, lane l taking word l of the block's 128 nibble bytes (so a
// team's loads are 128 consecutive bytes), with the block's scales decoded by
// every lane from the same three words. Rows are 4-byte aligned (K % 256 == 0,
// 144-byte blocks). Same bindings and Params as matmul.wgsl; dispatch
// (ceil(N_chunk / ROWS), T, 1).

struct Params {
    K: u32,
    N: u32,
    row0: u32,
    row_bytes: u32,
    x_stride: u32,
    y_stride: u32,
    has_bias: u32,
    T: u32,
}

@group(0) @binding(0) var<uniform> params: Params;
@group(0) @binding(1) var<storage, read> w: array<u32>;
@group(0) @binding(2) var<storage, read> x: array<f32>;
@group(0) @binding(3) var<storage, read_write> y: array<f32>;
@group(0) @binding(4) var<storage, read> bias: array<f32>;

// #include quant_common

const ROWS: u32 = {{ROWS}}u;
const LANES: u32 = 32u;
const WG: u32 = ROWS * LANES;

var<workgroup> partial: array<f32, WG>;

@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) tid: u32) {
    if (wid.y >= params.T) {
        return;
    }
    let lane = tid % LANES;
    let r = wid.x * ROWS + tid / LANES;
    let c = lane / 8u;  // the 64-value chunk this lane's word belongs to
    let xl = 64u * c + 4u * (lane % 8u);
    var acc = 0.0;
    if (r < params.N) {
        let rw = r * (params.row_bytes / 4u);
        let xo = wid.y * params.x_stride + xl;
        let nb = params.K / 256u;
        for (var b = 0u; b < nb; b++) {
            let bw = rw + b * 36u;
            let dm = unpack2x16float(w[bw]);
            let s0 = w[bw + 1u];
            let s1 = w[bw + 2u];
            let s2 = w[bw + 3u];
            let q = w[bw + 4u + lane];
            // sub-blocks 2c (low nibbles) and 2c + 1 (high nibbles)
            let sc = u8x4(s0 & 0x3F3F3F3Fu);
            let sch = u8x4((s2 & 0x0F0F0F0Fu) | ((s0 >> 2u) & 0x30303030u));
            let mn = u8x4(s1 & 0x3F3F3F3Fu);
            let mnh = u8x4(((s2 >> 4u) & 0x0F0F0F0Fu) | ((s1 >> 2u) & 0x30303030u));
            let i0 = 2u * c;
            let i1 = i0 + 1u;
            let sa = select(sc[i0 & 3u], sch[i0 & 3u], i0 >= 4u);
            let sb = select(sc[i1 & 3u], sch[i1 & 3u], i1 >= 4u);
            let ma = select(mn[i0 & 3u], mnh[i0 & 3u], i0 >= 4u);
            let mb = select(mn[i1 & 3u], mnh[i1 & 3u], i1 >= 4u);
            let o = xo + b * 256u;
            let xa = vec4<f32>(x[o], x[o + 1u], x[o + 2u], x[o + 3u]);
            let xb = vec4<f32>(x[o + 32u], x[o + 33u], x[o + 34u], x[o + 35u]);
            acc += dm.x * (sa * dot(lo4(q), xa) + sb * dot(hi4(q), xb)) - dm.y * (ma * sum4(xa) + mb * sum4(xb));
        }
    }
    partial[tid] = acc;
    workgroupBarrier();
    for (var s = LANES / 2u; s > 0u; s >>= 1u) {
        if (lane < s) {
            partial[tid] += partial[tid + s];
        }
        workgroupBarrier();
    }
    if (lane == 0u && r < params.N) {
        var v = partial[tid];
        if (params.has_bias != 0u) {
            v += bias[params.row0 + r];
        }
        y[wid.y * params.y_stride + params.row0 + r] = v;
    }
}
