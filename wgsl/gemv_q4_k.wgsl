// Q4_K matrix times activations, with 16-byte loads. A Q4_K block is 144 bytes
// = 9 vec4<u32>: [d|dmin, scales0, scales1, scales2] then 8 of nibbles.
//
// The workgroup is TEAMS teams of 32 invocations. A team reads R weight rows
// together: each step covers 4 blocks of every row, lane l reading nibble
// vec4 l % 8 of block l / 8 (a team's loads are contiguous), i.e. 16 low and
// 16 high nibbles: values 64c + h .. +16 and 64c + 32 + h .. +16 of sub-blocks
// 2c and 2c + 1, with c = (l % 8) / 2 and h = 16 * (l % 2). The 32 activations
// a lane needs are loaded once and used for all R rows, and U steps are
// unrolled so each lane has U * R weight loads in flight.
//
// PAIR (the fused gate||up of a gated FFN): slot 0 reads row r of `w` (gate),
// slot 1 row r of `w2` (up), and the row's output is act(gate) * up.
// SPLIT (the fused q|k|v): `w` holds the matrices' rows one after the other
// and params.split1 / split2 send each row to its own output (y, y2, y3).
// SG > 0: the adapter's subgroup size (dividing 32): partial sums are added
// with subgroupAdd, and across subgroups through shared memory; SG = 0 uses
// a shared-memory tree. Rows are 16-byte aligned (K % 256 == 0). Params, the
// output bindings and the row epilogue come from matmul_common.wgsl;
// dispatch (ceil(N_chunk / ROWS_PER_WG), T, 1).

@group(0) @binding(1) var<storage, read> w: array<vec4<u32>>;
@group(0) @binding(2) var<storage, read> x: array<vec4<f32>>;

// #include matmul_common
// #include activations

{{W2}}
{{SPLIT_DECL}}

const R: u32 = {{R}}u;        // weight rows per team
const U: u32 = {{U}}u;        // block steps unrolled
const SG: u32 = {{SG}}u;      // subgroup size used for the reduction; 0 = none
const SG_PER_TEAM: u32 = TEAM / max(SG, 1u);
const PAIR: bool = {{PAIR}};
const ACT_GELU: bool = {{GELU}};
const TEAM: u32 = 32u;
const WG: u32 = 256u;
const TEAMS: u32 = WG / TEAM;
const OUT: u32 = select(R, 1u, PAIR);  // output rows per team

var<workgroup> partial: array<f32, WG * R>;

fn nib(q: u32, shift: u32) -> vec4<f32> {
    return vec4<f32>((vec4<u32>(q) >> (vec4<u32>(0u, 8u, 16u, 24u) + vec4<u32>(shift))) & vec4<u32>(0xFu));
}

fn bytes6(v: u32) -> vec4<f32> {
    return vec4<f32>((vec4<u32>(v) >> vec4<u32>(0u, 8u, 16u, 24u)) & vec4<u32>(0xFFu));
}

// Stands in for subgroupAdd where the adapter has no subgroups (that branch never runs).
fn no_subgroups(v: f32) -> f32 {
    return v;
}

fn wload(slot: u32, i: u32) -> vec4<u32> {
    {{W2_LOAD}}
    return w[i];
}

// One lane's share of one block: header hd, nibbles q, its activations.
fn block_part(hd: vec4<u32>, q: vec4<u32>, c: u32, xa: array<vec4<f32>, 4>, xb: array<vec4<f32>, 4>,
              sa_x: f32, sb_x: f32) -> f32 {
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
    let qa = dot(nib(q.x, 0u), xa[0]) + dot(nib(q.y, 0u), xa[1]) + dot(nib(q.z, 0u), xa[2]) + dot(nib(q.w, 0u), xa[3]);
    let qb = dot(nib(q.x, 4u), xb[0]) + dot(nib(q.y, 4u), xb[1]) + dot(nib(q.z, 4u), xb[2]) + dot(nib(q.w, 4u), xb[3]);
    return dm.x * (sa * qa + sb * qb) - dm.y * (ma * sa_x + mb * sb_x);
}

@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) tid: u32) {
    if (wid.y >= params.T) {
        return;
    }
    let team = tid / TEAM;
    let lane = tid % TEAM;
    let part = lane % 8u;
    let c = part / 2u;
    let h = 16u * (part % 2u);
    let first = (wid.x * TEAMS + team) * OUT;  // the team's first output row
    let rowv = params.row_bytes / 16u;
    let nb = params.K / 256u;
    let xrow = wid.y * (params.x_stride / 4u);
    var base: array<u32, R>;
    for (var i = 0u; i < R; i++) {
        // Rows past N (the last team of a chunk) read row N - 1 and are not stored.
        let r = select(first + i, first, PAIR);
        base[i] = min(r, params.N - 1u) * rowv;
    }
    var acc: array<f32, R>;
    for (var b0 = lane / 8u; b0 < nb; b0 += 4u * U) {
        for (var u = 0u; u < U; u++) {
            let b = b0 + 4u * u;
            let live = select(0.0, 1.0, b < nb);
            let bc = min(b, nb - 1u);
            let xo = xrow + (bc * 256u + 64u * c + h) / 4u;
            let xa = array<vec4<f32>, 4>(x[xo], x[xo + 1u], x[xo + 2u], x[xo + 3u]);
            let xb = array<vec4<f32>, 4>(x[xo + 8u], x[xo + 9u], x[xo + 10u], x[xo + 11u]);
            let one = vec4<f32>(1.0);
            let sa_x = dot(xa[0] + xa[1] + xa[2] + xa[3], one);
            let sb_x = dot(xb[0] + xb[1] + xb[2] + xb[3], one);
            for (var i = 0u; i < R; i++) {
                let bv = base[i] + bc * 9u;
                acc[i] += live * block_part(wload(i, bv), wload(i, bv + 1u + part), c, xa, xb, sa_x, sb_x);
            }
        }
    }

    // Team sums, ending in lane 0.
    var tot: array<f32, R>;
    if (SG == TEAM) {
        for (var i = 0u; i < R; i++) {
            tot[i] = {{SUBGROUP_ADD}}(acc[i]);
        }
    } else if (SG > 0u) {
        for (var i = 0u; i < R; i++) {
            let s = {{SUBGROUP_ADD}}(acc[i]);
            if (tid % max(SG, 1u) == 0u) {
                partial[(tid / max(SG, 1u)) * R + i] = s;
            }
        }
        workgroupBarrier();
        if (lane == 0u) {
            for (var i = 0u; i < R; i++) {
                var s = 0.0;
                for (var k = 0u; k < SG_PER_TEAM; k++) {
                    s += partial[(tid / max(SG, 1u) + k) * R + i];
                }
                tot[i] = s;
            }
        }
    } else {
        for (var i = 0u; i < R; i++) {
            partial[i * WG + tid] = acc[i];
        }
        workgroupBarrier();
        for (var s = TEAM / 2u; s > 0u; s >>= 1u) {
            if (lane < s) {
                for (var i = 0u; i < R; i++) {
                    partial[i * WG + tid] += partial[i * WG + tid + s];
                }
            }
            workgroupBarrier();
        }
        for (var i = 0u; i < R; i++) {
            tot[i] = partial[i * WG + tid];
        }
    }
    if (lane == 0u) {
        if (PAIR) {
            if (first < params.N) {
                let g = tot[0];
                {{STORE}}(first, wid.y, select(silu(g), gelu(g), ACT_GELU) * tot[R - 1u]);
            }
        } else {
            for (var i = 0u; i < R; i++) {
                if (first + i < params.N) {
                    {{STORE}}(first + i, wid.y, tot[i]);
                }
            }
        }
    }
}
