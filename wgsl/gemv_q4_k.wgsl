// Q4_K matrix times 8-bit activations, with 16-byte loads. A Q4_K block is
// 144 bytes = 9 vec4<u32>: [d|dmin, scales0, scales1, scales2] then 8 of nibbles.
// The activations come from quantize_q8.wgsl (its header says the layout):
// per 32 values int8 q, a scale d and d * sum(q), so a nibble word masked to
// bytes meets four q in one dot4I8Packed:
//   sum_i (d sc q_i - dmin m) (dx qx_i) = d sc dx sum_i q_i qx_i - dmin m (dx sum_i qx_i).
// Reading f32 activations cost more than the weights: each lane needed
// 128 bytes of x, from 32 cache lines per load, for 16 bytes of nibbles.
//
// The workgroup is TEAMS teams of 32 invocations. A team reads R weight rows
// together: each step covers 4 blocks of every row, lane l reading nibble
// vec4 l % 8 of block l / 8 (a team's loads are contiguous), i.e. 16 low and
// 16 high nibbles: values 64c + h .. +16 and 64c + 32 + h .. +16 of sub-blocks
// 2c and 2c + 1, with c = (l % 8) / 2 and h = 16 * (l % 2). The lane's 32
// activation bytes are one contiguous pair of vec4 (quantize_q8 put them
// so), loaded once for all R rows; U steps are unrolled.
//
// PAIR (the fused gate||up of a gated FFN): slot 0 reads row r of `w` (gate),
// slot 1 row r of `w2` (up), and the row's output is act(gate) * up.
// SPLIT (the fused q|k|v): `w` holds the matrices' rows one after the other
// and params.split1 / split2 send each row to its own output (y, y2, y3).
// SG > 0: the adapter's subgroup size (dividing 32): partial sums are added
// with subgroupAdd, and across subgroups through shared memory; SG = 0 uses
// a shared-memory tree. Rows are 16-byte aligned (K % 256 == 0). Params, the
// output bindings and the row epilogue come from matmul_common.wgsl
// (x_stride: vec4 between tokens of xq); dispatch (ceil(N_chunk / ROWS_PER_WG), T, 1).

@group(0) @binding(1) var<storage, read> w: array<vec4<u32>>;
@group(0) @binding(2) var<storage, read> xq: array<vec4<u32>>;

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

const LO: u32 = 0x0F0F0F0Fu;

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

// One lane's share of one block: header hd, nibbles q, the lane's activation
// bytes xa (sub-block 2c) and xb (2c + 1), their scales xs = (d_a, s_a, d_b, s_b).
// Only the lanes with h = 0 add the mins' term, which covers whole sub-blocks.
fn block_part(hd: vec4<u32>, q: vec4<u32>, c: u32, first_half: bool, xa: vec4<u32>, xb: vec4<u32>, xs: vec4<f32>) -> f32 {
    let dm = unpack2x16float(hd.x);
    // 6-bit scales and mins of sub-blocks 2c and 2c + 1 (k_scales layout)
    let sc_lo = bytes6(hd.y & 0x3F3F3F3Fu);
    let sc_hi = bytes6((hd.w & 0x0F0F0F0Fu) | ((hd.y >> 2u) & 0x30303030u));
    let i0 = 2u * c;
    let i1 = i0 + 1u;
    let sa = select(sc_lo[i0 & 3u], sc_hi[i0 & 3u], i0 >= 4u);
    let sb = select(sc_lo[i1 & 3u], sc_hi[i1 & 3u], i1 >= 4u);
    let ia = dot4I8Packed(q.x & LO, xa.x) + dot4I8Packed(q.y & LO, xa.y) + dot4I8Packed(q.z & LO, xa.z) + dot4I8Packed(q.w & LO, xa.w);
    let ib = dot4I8Packed((q.x >> 4u) & LO, xb.x) + dot4I8Packed((q.y >> 4u) & LO, xb.y)
           + dot4I8Packed((q.z >> 4u) & LO, xb.z) + dot4I8Packed((q.w >> 4u) & LO, xb.w);
    var v = dm.x * (sa * xs.x * f32(ia) + sb * xs.z * f32(ib));
    if (first_half) {
        let mn_lo = bytes6(hd.z & 0x3F3F3F3Fu);
        let mn_hi = bytes6(((hd.w >> 4u) & 0x0F0F0F0Fu) | ((hd.z >> 2u) & 0x30303030u));
        let ma = select(mn_lo[i0 & 3u], mn_hi[i0 & 3u], i0 >= 4u);
        let mb = select(mn_lo[i1 & 3u], mn_hi[i1 & 3u], i1 >= 4u);
        v -= dm.y * (ma * xs.y + mb * xs.w);
    }
    return v;
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
    let first_half = part % 2u == 0u;
    let first = (wid.x * TEAMS + team) * OUT;  // the team's first output row
    let rowv = params.row_bytes / 16u;
    let nb = params.K / 256u;
    let xrow = wid.y * params.x_stride;
    let xscales = xrow + params.K / 16u;
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
            let xa = xq[xrow + bc * 16u + 2u * part];
            let xb = xq[xrow + bc * 16u + 2u * part + 1u];
            let xs = bitcast<vec4<f32>>(xq[xscales + bc * 4u + c]);
            for (var i = 0u; i < R; i++) {
                let bv = base[i] + bc * 9u;
                acc[i] += live * block_part(wload(i, bv), wload(i, bv + 1u + part), c, first_half, xa, xb, xs);
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
