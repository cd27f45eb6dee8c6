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

struct Params {
    n_heads: u32,
    kv_heads: u32,
    head_dim: u32,
    v_head_dim: u32,
    n_rot: u32,
    theta: f32,
    freq_scale: f32,
    has_factors: u32,
    blocks_per_seq: u32,
}

const WG: u32 = 64u;
const MAX_D: u32 = 512u;
const norm: u32 = 0u;
const neox: u32 = 1u;
const STYLE: u32 = {{STYLE}};

// #include rope_common

@group(0) @binding(0) var<uniform> params: Params;
@group(0) @binding(1) var<storage, read_write> q: array<f32>;
@group(0) @binding(2) var<storage, read_write> k: array<f32>;
@group(0) @binding(3) var<storage, read> v: array<f32>;
@group(0) @binding(4) var<storage, read_write> kcache: array<u32>;
@group(0) @binding(5) var<storage, read_write> vcache: array<u32>;
@group(0) @binding(6) var<storage, read> factors: array<f32>;
@group(0) @binding(7) var<storage, read> state: array<u32>;
@group(0) @binding(8) var<storage, read> rows: array<u32>;
@group(0) @binding(9) var<storage, read> block_table: array<u32>;

// #include paging
// #include f16_bits

var<workgroup> row: array<f32, MAX_D>;

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
        for (var d = tid; d < hd; d += WG) {
            var r = q[base + d];
            if (d < params.n_rot) {
                r = rotated(d, r, q[base + pair_of(d).y], pos);
            }
            row[d] = r;
        }
        workgroupBarrier();
        for (var d = tid; d < hd; d += WG) {
            q[base + d] = row[d];
        }
        return;
    }
    let h = wid.x - params.n_heads;
    let base = (t * params.kv_heads + h) * hd;
    for (var d = tid; d < hd; d += WG) {
        var r = k[base + d];
        if (d < params.n_rot) {
            r = rotated(d, r, k[base + pair_of(d).y], pos);
        }
        row[d] = r;
    }
    workgroupBarrier();
    let crow = cache_row(rows[2u * t + 1u] * params.blocks_per_seq, rows[2u * t]) * params.kv_heads + h;
    for (var d = tid; d < hd; d += WG) {
        k[base + d] = row[d];
    }
    for (var j = tid; j < hd / 2u; j += WG) {
        kcache[crow * (hd / 2u) + j] = pack_f16(row[2u * j], row[2u * j + 1u]);
    }
    let vw = params.v_head_dim / 2u;
    let vbase = (t * params.kv_heads + h) * params.v_head_dim;
    for (var j = tid; j < vw; j += WG) {
        vcache[crow * vw + j] = pack_f16(v[vbase + 2u * j], v[vbase + 2u * j + 1u]);
    }
}
