// Q4_K matrix times activations, with 16-byte loads. A Q4_K block is 144 bytes
// = 9 vec4<u32>: [d|dmin, scales0, scales1, scales2] then 8 of nibbles. A team
// of LANES invocations covers LANES / 8 blocks per step: lane l reads nibble vec4 l % 8
// of block l / 8 (so a team's loads are contiguous), i.e. 16 low and 16 high
// nibbles: values 64c + h .. +16 and 64c + 32 + h .. +16 of sub-blocks 2c and
// 2c + 1, with c = (l % 8) / 2 and h = 16 * (l % 2). Rows are 16-byte aligned
// (K % 256 == 0). Params, output bindings and the row epilogue come from
// matmul_common.wgsl, as for matmul.wgsl (w and x read here as
// vectors); dispatch (ceil(N_chunk / ROWS), T, 1).

@group(0) @binding(1) var<storage, read> w: array<vec4<u32>>;
@group(0) @binding(2) var<storage, read> x: array<vec4<f32>>;

// #include matmul_common

const ROWS: u32 = {{ROWS}}u;
const LANES: u32 = {{LANES}}u;  // per row: 32 covers 4 blocks a step, 64 covers 8
const WG: u32 = ROWS * LANES;

var<workgroup> partial: array<f32, WG>;

fn nib(q: u32, shift: u32) -> vec4<f32> {
    return vec4<f32>((vec4<u32>(q) >> (vec4<u32>(0u, 8u, 16u, 24u) + vec4<u32>(shift))) & vec4<u32>(0xFu));
}

fn bytes6(v: u32) -> vec4<f32> {
    return vec4<f32>((vec4<u32>(v) >> vec4<u32>(0u, 8u, 16u, 24u)) & vec4<u32>(0xFFu));
}

@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) tid: u32) {
    if (wid.y >= params.T) {
        return;
    }
    let lane = tid % LANES;
    let r = wid.x * ROWS + tid / LANES;
    let part = lane % 8u;
    let c = part / 2u;
    let h = 16u * (part % 2u);
    var acc = 0.0;
    if (r < params.N) {
        let rv = r * (params.row_bytes / 16u);
        let nb = params.K / 256u;
        let xrow = wid.y * (params.x_stride / 4u);
        for (var b = lane / 8u; b < nb; b += LANES / 8u) {
            let bv = rv + b * 9u;
            let hd = w[bv];
            let dm = unpack2x16float(hd.x);
            // 6-bit scales and mins of sub-blocks 2c and 2c + 1 (k_scales layout)
            let sc_lo = bytes6(hd.y & 0x3F3F3F3Fu);
            let sc_hi = bytes6((hd.w & 0x0F0F0F0Fu) | ((hd.y >> 2u) & 0x30303030u));
            let mn_lo = bytes6(hd.z & 0x3F3F3F3Fu);
            let mn_hi = bytes6(((hd.w >> 4u) & 0x0F0F0F0Fu) | ((hd.z >> 2u) & 0x30303030u));
            let i0 = 2u * c;
            let i1 = i0 + 1u;
            let sa = select(sc_lo[i0 & 3u], sc_hi[i0 & 3u], i0 >= 4u);
            let sb = select(sc_lo[i1 & 3u], sc_hi[i1 & 3u], i1 >= 4u);
            let ma = select(mn_lo[i0 & 3u], mn_hi[i0 & 3u], i0 >= 4u);
            let mb = select(mn_lo[i1 & 3u], mn_hi[i1 & 3u], i1 >= 4u);
            let q = w[bv + 1u + part];
            let xo = xrow + (b * 256u + 64u * c + h) / 4u;
            let a0 = x[xo];
            let a1 = x[xo + 1u];
            let a2 = x[xo + 2u];
            let a3 = x[xo + 3u];
            let b0 = x[xo + 8u];
            let b1 = x[xo + 9u];
            let b2 = x[xo + 10u];
            let b3 = x[xo + 11u];
            let qa = dot(nib(q.x, 0u), a0) + dot(nib(q.y, 0u), a1) + dot(nib(q.z, 0u), a2) + dot(nib(q.w, 0u), a3);
            let qb = dot(nib(q.x, 4u), b0) + dot(nib(q.y, 4u), b1) + dot(nib(q.z, 4u), b2) + dot(nib(q.w, 4u), b3);
            let one = vec4<f32>(1.0);
            let xa = dot(a0 + a1 + a2 + a3, one);
            let xb = dot(b0 + b1 + b2 + b3, one);
            acc += dm.x * (sa * qa + sb * qb) - dm.y * (ma * xa + mb * xb);
        }
    }
    finish_row(tid, lane, LANES, r, wid.y, acc);
}
