// y[t, row0 + r] = dot(W[r], x[t]) (+ bias[row0 + r]) for the rows r of one
// weight chunk, W kept in its GGUF block layout and decoded by the quant
// reader included below (block_dot).
//
// One workgroup computes ROWS consecutive rows for one token: dispatch
// (ceil(N_chunk / ROWS), T, 1). The WG threads split into ROWS teams of
// WG / ROWS; a team strides over its row's blocks (neighbouring threads read
// neighbouring blocks) and sums its partials with a shared-memory tree.
// Splitting the workgroup across rows keeps threads busy when rows are only a
// few blocks long (K = 1024 is four Q4_K blocks).

struct Params {
    K: u32,
    N: u32,          // rows in this chunk
    row0: u32,       // global index of the chunk's first row
    row_bytes: u32,
    x_stride: u32,
    y_stride: u32,
    has_bias: u32,
    T: u32,
    has_resid: u32,  // y += resid (same layout as y): the residual add, fused
}

@group(0) @binding(0) var<uniform> params: Params;
@group(0) @binding(1) var<storage, read> w: array<u32>;
@group(0) @binding(2) var<storage, read> x: array<f32>;
@group(0) @binding(3) var<storage, read_write> y: array<f32>;
@group(0) @binding(4) var<storage, read> bias: array<f32>;
@group(0) @binding(5) var<storage, read> resid: array<f32>;

// #include quant_common
// #include quant_{{QTYPE}}

const WG: u32 = {{WG}}u;
const ROWS: u32 = {{ROWS}}u;
const TEAM: u32 = WG / ROWS;  // a power of two (checked on the Python side)

var<workgroup> partial: array<f32, WG>;

@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) tid: u32) {
    // Uniform guard (workgroup id and params only): the barriers below stay legal.
    if (wid.y >= params.T) {
        return;
    }
    let lane = tid % TEAM;
    let r = wid.x * ROWS + tid / TEAM;
    var acc = 0.0;
    if (r < params.N) {
        let rb = r * params.row_bytes;
        let xo = wid.y * params.x_stride;
        let nb = params.K / QK;
        for (var b = lane; b < nb; b += TEAM) {
            acc += block_dot(rb + b * BLOCK_BYTES, xo + b * QK);
        }
    }
    partial[tid] = acc;
    workgroupBarrier();
    for (var s = TEAM / 2u; s > 0u; s >>= 1u) {
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
        let yi = wid.y * params.y_stride + params.row0 + r;
        if (params.has_resid != 0u) {
            v += resid[yi];
        }
        y[yi] = v;
    }
}
