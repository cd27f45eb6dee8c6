// Embedding lookup: y[t, i] = W[ids[t], i] * scale, decoding the table's GGUF
// blocks with the quant reader's block_value. A table larger than a storage
// binding comes in row chunks; each chunk's dispatch writes only the tokens
// whose id falls inside [row0, row0 + rows). Dispatch (ceil(K / 64), T, 1).

struct Params {
    K: u32,
    rows: u32,
    row0: u32,
    row_bytes: u32,
    scale: f32,
    T: u32,
}

@group(0) @binding(0) var<uniform> params: Params;
@group(0) @binding(1) var<storage, read> w: array<u32>;
@group(0) @binding(2) var<storage, read> ids: array<u32>;
@group(0) @binding(3) var<storage, read_write> y: array<f32>;

// The quant readers' block_dot reads a module-scope `x`; this kernel never
// calls it, and a private stand-in keeps it out of the bind group.
var<private> x: array<f32, 4>;

// #include quant_common
// #include quant_{{QTYPE}}

@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let i = gid.x;
    let t = gid.y;
    if (i >= params.K || t >= params.T) {
        return;
    }
    let id = ids[t];
    if (id < params.row0 || id - params.row0 >= params.rows) {
        return;
    }
    let wb = (id - params.row0) * params.row_bytes + (i / QK) * BLOCK_BYTES;
    y[t * params.K + i] = block_value(wb, i % QK) * params.scale;
}
