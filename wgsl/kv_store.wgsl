// Writes this batch's K and V rows into the f16 caches: row t (live: t < state[1])
// is position rows[2t] of sequence slot rows[2t + 1], stored at its cache row
// through the block table (paging.wgsl). Padding rows (t >= state[1]) write nothing.
// Cache layout [n_blocks * BS, kv_heads, head_dim] of f16, two halves per u32 word
// (pack_f16: element 2j in the low half, as little-endian f16 arrays lie).
// Dispatch (kv_heads, T, 1); head_dim and v_head_dim are even.

struct Params {
    kv_heads: u32,
    head_dim: u32,
    v_head_dim: u32,
    blocks_per_seq: u32,
}

const WG: u32 = 64u;

@group(0) @binding(0) var<uniform> params: Params;
@group(0) @binding(1) var<storage, read> k: array<f32>;
@group(0) @binding(2) var<storage, read> v: array<f32>;
@group(0) @binding(3) var<storage, read_write> kcache: array<u32>;
@group(0) @binding(4) var<storage, read_write> vcache: array<u32>;
@group(0) @binding(5) var<storage, read> state: array<u32>;
@group(0) @binding(6) var<storage, read> rows: array<u32>;
@group(0) @binding(7) var<storage, read> block_table: array<u32>;

// #include paging
// #include f16_bits

@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) tid: u32) {
    let h = wid.x;
    let t = wid.y;
    if (t >= state[1]) {
        return;
    }
    let row = cache_row(rows[2u * t + 1u] * params.blocks_per_seq, rows[2u * t]) * params.kv_heads + h;
    let src = t * params.kv_heads + h;               // (t, h) row of this batch
    let kw = params.head_dim / 2u;
    for (var j = tid; j < kw; j += WG) {
        let o = src * params.head_dim + 2u * j;
        kcache[row * kw + j] = pack_f16(k[o], k[o + 1u]);
    }
    let vw = params.v_head_dim / 2u;
    for (var j = tid; j < vw; j += WG) {
        let o = src * params.v_head_dim + 2u * j;
        vcache[row * vw + j] = pack_f16(v[o], v[o + 1u]);
    }
}
