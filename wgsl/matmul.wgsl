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

@group(0) @binding(1) var<storage, read> w: array<u32>;
@group(0) @binding(2) var<storage, read> x: array<f32>;

// #include matmul_common
{{EXPERT}}

// #include quant_common
// #include quant_{{QTYPE}}

const WG: u32 = {{WG}}u;
const ROWS: u32 = {{ROWS}}u;
const TEAM: u32 = WG / ROWS;  // a power of two (checked on the Python side)

var<workgroup> partial: array<f32, WG>;

@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) tid: u32) {
    // Uniform guard (workgroup id and params only): the barriers below stay legal.
    if (wid.y >= params.T || expert_skip(wid.y)) {
        return;
    }
    let lane = tid % TEAM;
    let r = wid.x * ROWS + tid / TEAM;
    var acc = 0.0;
    if (r < params.N) {
        let rb = r * params.row_bytes + expert_byte(0u, wid.y);
        let xo = x_token(wid.y) * params.x_stride;
        let nb = params.K / QK;
        for (var b = lane; b < nb; b += TEAM) {
            acc += block_dot(rb + b * BLOCK_BYTES, xo + b * QK);
        }
    }
    finish_row(tid, lane, TEAM, r, wid.y, acc);
}
