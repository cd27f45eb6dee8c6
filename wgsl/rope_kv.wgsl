// RoPE on q and k fused with the KV cache write: one dispatch instead of
// rope(q), rope(k), kv_store. Dispatch (n_heads + kv_heads, T, 1): workgroups
// x < n_heads rotate query head x in place; the others rotate kv head
// x - n_heads of k (in place too, so the buffer ends as the unfused ops leave
// it) and write it and v's row as f16 pairs at the row's cache row (kv_store.wgsl,
// paging.wgsl: position rows[2t] of slot rows[2t + 1] through the block table).
// Padding rows (t >= state[1]) are left alone and write nothing. The rotation is
// rope.wgsl's (rope_common): STYLE norm pairs (2i, 2i+1), neox (i, i + n_rot/2);
// dims >= n_rot are copied. A row is rotated into workgroup memory first, then
// written back, because a dim's partner may belong to another invocation.
// head_dim and v_head_dim are even, head_dim <= MAX_D.
//
// QK-norm families fuse their per-head RMSNorms here too (fusion.py's norm_rope_store): NQ, NK,
// NV normalise q, k, v heads (weights qn, kn, vn; the plan's weightless norms bind ones), before
// the rotation, or after it with AFTER (llama4). The sum of squares is rmsnorm.wgsl's, pair for
// pair (a 256-wide tree), so a fused norm gives the same floats as the rmsnorm dispatch it
// replaces; the normalised rows are written back in place as the unfused ops leave them.

// #include rope_kv_params

const WG: u32 = 64u;
const MAX_D: u32 = 512u;
const PER: u32 = MAX_D / WG;  // dims an invocation rotates at most
const NORM_WG: u32 = 256u;  // rmsnorm.wgsl's workgroup: the sum order the fused norms keep
const norm: u32 = 0u;
const neox: u32 = 1u;
const STYLE: u32 = {{STYLE}};
const NQ: bool = {{NQ}};
const NK: bool = {{NK}};
const NV: bool = {{NV}};
const AFTER: bool = {{AFTER}};

// #include rope_common

@group(0) @binding(0) var<uniform> params: RopeKvParams;
@group(0) @binding(1) var<storage, read_write> q: array<f32>;
@group(0) @binding(2) var<storage, read_write> k: array<f32>;
@group(0) @binding(3) var<storage, read_write> v: array<f32>;
@group(0) @binding(4) var<storage, read_write> kcache: array<u32>;
@group(0) @binding(5) var<storage, read_write> vcache: array<u32>;
@group(0) @binding(6) var<storage, read> factors: array<f32>;
@group(0) @binding(7) var<storage, read> state: array<u32>;
@group(0) @binding(8) var<storage, read> rows: array<u32>;
@group(0) @binding(9) var<storage, read> block_table: array<u32>;
@group(0) @binding(10) var<storage, read> qn: array<f32>;
@group(0) @binding(11) var<storage, read> kn: array<f32>;
@group(0) @binding(12) var<storage, read> vn: array<f32>;

// #include paging
// #include f16_bits

var<workgroup> row: array<f32, MAX_D>;
var<workgroup> red: array<f32, NORM_WG>;

// Dim d's pair index i, its partner dim, and whether d is the pair's first element.
fn pair_of(d: u32) -> vec3<u32> {
    let half_rot = params.n_rot / 2u;
    if (STYLE == neox) {
        if (d < half_rot) {
            return vec3<u32>(d, d + half_rot, 1u);
        }
        return vec3<u32>(d - half_rot, d - half_rot, 0u);
    }
    if (d % 2u == 0u) {
        return vec3<u32>(d / 2u, d + 1u, 1u);
    }
    return vec3<u32>(d / 2u, d - 1u, 0u);
}

// Rotated value of dim d (< n_rot) given its own value and its partner's.
fn rotated(d: u32, own: f32, other: f32, pos: f32) -> f32 {
    let p = pair_of(d);
    var factor = 1.0;
    if (params.has_factors != 0u) {
        factor = factors[p.x];
    }
    let cs = rope_cos_sin(pos, p.x, params.n_rot, params.theta, params.freq_scale, factor);
    if (p.z == 1u) {
        return own * cs.x - other * cs.y;  // a * c - b * s
    }
    return other * cs.y + own * cs.x;      // a * s + b * c
}

// which: 0 q, 1 k, 2 v (WGSL passes no pointers to storage: the buffer is picked here).
fn load_row(which: u32, base: u32, n: u32, tid: u32) {
    for (var d = tid; d < n; d += WG) {
        if (which == 0u) {
            row[d] = q[base + d];
        } else if (which == 1u) {
            row[d] = k[base + d];
        } else {
            row[d] = v[base + d];
        }
    }
}

fn store_row(which: u32, base: u32, n: u32, tid: u32) {
    for (var d = tid; d < n; d += WG) {
        if (which == 0u) {
            q[base + d] = row[d];
        } else if (which == 1u) {
            k[base + d] = row[d];
        } else {
            v[base + d] = row[d];
        }
    }
}

// row[0 .. n] RMS-normalised times the weight of `which`: rmsnorm.wgsl's sums (invocation i of
// its 256 summing i, i + 256, ..., then its tree), so the same inv. Uniform control flow.
fn norm_row(which: u32, n: u32, tid: u32) {
    for (var i = tid; i < NORM_WG; i += WG) {
        var s = 0.0;
        for (var d = i; d < n; d += NORM_WG) {
            s += row[d] * row[d];
        }
        red[i] = s;
    }
    workgroupBarrier();
    for (var stride = NORM_WG / 2u; stride > 0u; stride /= 2u) {
        for (var i = tid; i < stride; i += WG) {
            red[i] += red[i + stride];
        }
        workgroupBarrier();
    }
    let inv = 1.0 / sqrt(red[0] / f32(n) + params.eps);
    for (var d = tid; d < n; d += WG) {
        var w: f32;
        if (which == 0u) {
            w = qn[d];
        } else if (which == 1u) {
            w = kn[d];
        } else {
            w = vn[d];
        }
        row[d] = row[d] * inv * w;
    }
    workgroupBarrier();  // row complete, and red[0] read before anyone sums again
}

// row[0 .. n_rot] rotated at pos (dims past n_rot kept). Uniform control flow.
fn rotate_row(n: u32, pos: f32, tid: u32) {
    var r: array<f32, PER>;
    for (var m = 0u; m < PER; m++) {
        let d = tid + m * WG;
        if (d < n) {
            r[m] = row[d];
            if (d < params.n_rot) {
                r[m] = rotated(d, row[d], row[pair_of(d).y], pos);
            }
        }
    }
    workgroupBarrier();
    for (var m = 0u; m < PER; m++) {
        let d = tid + m * WG;
        if (d < n) {
            row[d] = r[m];
        }
    }
    workgroupBarrier();
}

// A q or k head's row: loaded, normalised (nrm) before or after the rotation, rotated.
fn head_row(which: u32, base: u32, nrm: bool, pos: f32, tid: u32) {
    let hd = params.head_dim;
    load_row(which, base, hd, tid);
    workgroupBarrier();
    if (nrm && !AFTER) {
        norm_row(which, hd, tid);
    }
    rotate_row(hd, pos, tid);
    if (nrm && AFTER) {
        norm_row(which, hd, tid);
    }
}

@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) tid: u32) {
    let t = wid.y;
    if (t >= state[1]) {
        return;
    }
    let hd = params.head_dim;
    let pos = f32(rows[2u * t]);
    if (wid.x < params.n_heads) {
        let base = (t * params.n_heads + wid.x) * hd;
        head_row(0u, base, NQ, pos, tid);
        store_row(0u, base, hd, tid);
        return;
    }
    let h = wid.x - params.n_heads;
    let base = (t * params.kv_heads + h) * hd;
    head_row(1u, base, NK, pos, tid);
    let crow = cache_row(rows[2u * t + 1u] * params.blocks_per_seq, rows[2u * t]) * params.kv_heads + h;
    store_row(1u, base, hd, tid);
    for (var j = tid; j < hd / 2u; j += WG) {
        kcache[crow * (hd / 2u) + j] = pack_f16(row[2u * j], row[2u * j + 1u]);
    }
    let vd = params.v_head_dim;
    let vw = vd / 2u;
    let vbase = (t * params.kv_heads + h) * vd;
    if (NV) {
        workgroupBarrier();  // k's row read out before v's goes in
        load_row(2u, vbase, vd, tid);
        workgroupBarrier();
        norm_row(2u, vd, tid);
        store_row(2u, vbase, vd, tid);
        for (var j = tid; j < vw; j += WG) {
            vcache[crow * vw + j] = pack_f16(row[2u * j], row[2u * j + 1u]);
        }
        return;
    }
    for (var j = tid; j < vw; j += WG) {
        vcache[crow * vw + j] = pack_f16(v[vbase + 2u * j], v[vbase + 2u * j + 1u]);
    }
}
