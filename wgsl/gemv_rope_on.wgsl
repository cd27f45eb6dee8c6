// The fused q|k|v GEMV (SPLIT) that also rotates q and k and stores k and v in the KV cache: the
// rope_kv dispatch after it (rope_kv.wgsl) folded into its epilogue, for "norm" rope (pairs 2i,
// 2i + 1: both rows of a pair are in one workgroup, whose TEAMS * OUT rows start at an even row).
// The rows' sums (bias added) are kept in workgroup memory (rope_keep, the STORE), then each
// invocation takes a pair of rows of one token: q and k rotated as rope_kv rotates them
// (rope_common's angle, the same products) and written to y / y2 as the unfused ops leave them; k
// and v also as f16 pairs at the row's cache row (paging: position rows[2t] of slot rows[2t + 1]
// through the block table), for live rows only (t < state[1]). The host keeps head dims, n_rot and
// the segment boundaries even, and the stack in one chunk (row0 = 0).
// #include gemv_split
// #include rope_common
// #include paging
// #include f16_bits
// #include rope_kv_params

@group(0) @binding(8) var<uniform> rope: RopeKvParams;
@group(0) @binding(9) var<storage, read_write> kcache: array<u32>;
@group(0) @binding(10) var<storage, read_write> vcache: array<u32>;
@group(0) @binding(11) var<storage, read> factors: array<f32>;
@group(0) @binding(12) var<storage, read> state: array<u32>;
@group(0) @binding(13) var<storage, read> rows: array<u32>;
@group(0) @binding(14) var<storage, read> block_table: array<u32>;

const ROPE_ROWS: u32 = TEAMS * OUT;  // rows a workgroup computes
var<workgroup> rope_vals: array<f32, ROPE_ROWS * NT>;  // token j's row i at j * ROPE_ROWS + i

// The STORE: row r of token t, kept for rope_rows.
fn rope_keep(r: u32, t: u32, acc: f32) {
    _ = resid[0];  // bound like every matmul's, unused here
    var v = acc;
    if (params.has_bias != 0u) {
        v += bias[r];
    }
    rope_vals[(t % NT) * ROPE_ROWS + r % ROPE_ROWS] = v;
}

// The pair (a, b) of dims (2i, 2i + 1) rotated at pos, as rope_kv's `rotated` turns each.
fn rope_pair(a: f32, b: f32, i: u32, pos: f32) -> vec2<f32> {
    var factor = 1.0;
    if (rope.has_factors != 0u) {
        factor = factors[i];
    }
    let cs = rope_cos_sin(pos, i, rope.n_rot, rope.theta, rope.freq_scale, factor);
    return vec2<f32>(a * cs.x - b * cs.y, a * cs.y + b * cs.x);
}

// Called by every invocation, in uniform control flow, after the rows are kept: `block` is the
// workgroup's row block, `t0` its first token.
fn rope_rows(tid: u32, block: u32, t0: u32) {
    workgroupBarrier();
    let hd = rope.head_dim;
    let vd = rope.v_head_dim;
    let nk = params.split2 - params.split1;
    for (var i = tid; i < NT * ROPE_ROWS / 2u; i += WG) {
        let j = i / (ROPE_ROWS / 2u);
        let r = block * ROPE_ROWS + 2u * (i % (ROPE_ROWS / 2u));
        let t = t0 + j;
        if (t >= params.T || r >= params.N) {
            continue;
        }
        let o = j * ROPE_ROWS + r % ROPE_ROWS;
        var v = vec2<f32>(rope_vals[o], rope_vals[o + 1u]);
        let live = t < state[1];
        let pos = f32(rows[2u * t]);
        if (r < params.split1) {
            let d = r % hd;
            if (d < rope.n_rot) {
                v = rope_pair(v.x, v.y, d / 2u, pos);
            }
            y[t * params.split1 + r] = v.x;
            y[t * params.split1 + r + 1u] = v.y;
            continue;
        }
        var crow = 0u;
        if (live) {
            crow = cache_row(rows[2u * t + 1u] * rope.blocks_per_seq, rows[2u * t]) * rope.kv_heads;
        }
        if (r < params.split2) {
            let rk = r - params.split1;
            let d = rk % hd;
            if (d < rope.n_rot) {
                v = rope_pair(v.x, v.y, d / 2u, pos);
            }
            y2[t * nk + rk] = v.x;
            y2[t * nk + rk + 1u] = v.y;
            if (live) {
                kcache[(crow + rk / hd) * (hd / 2u) + d / 2u] = pack_f16(v.x, v.y);
            }
            continue;
        }
        let rv = r - params.split2;
        y3[t * (params.N - params.split2) + rv] = v.x;
        y3[t * (params.N - params.split2) + rv + 1u] = v.y;
        if (live) {
            vcache[(crow + rv / vd) * (vd / 2u) + (rv % vd) / 2u] = pack_f16(v.x, v.y);
        }
    }
}
