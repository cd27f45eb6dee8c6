// What every weight-matmul kernel shares: its Params, the output-side
// bindings, and the end of a row: the team's partial sums reduced in shared
// memory, then bias, the fused residual add and the store. The including
// kernel declares `w` (binding 1), `x` (binding 2) and
// `partial: array<f32, WG>` in workgroup memory.

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
    split1: u32,     // fused q|k|v GEMV (gemv kernels): rows [0, split1) go to y,
    split2: u32,     // [split1, split2) to y2, [split2, N) to y3; 0 = one output
    row_bytes2: u32, // gemv.wgsl: rows of the pair's second matrix, or of the split's second segment,
    row_bytes3: u32, // of its third,
    off2: u32,       // and the bytes where the second and third segments start
    off3: u32,
    eps: f32,        // gemv.wgsl's NORM_IN: its input norm's epsilon
}

@group(0) @binding(0) var<uniform> params: Params;
@group(0) @binding(3) var<storage, read_write> y: array<f32>;
@group(0) @binding(4) var<storage, read> bias: array<f32>;
@group(0) @binding(5) var<storage, read> resid: array<f32>;

// Called by every invocation, in uniform control flow (it holds barriers):
// `team` invocations (a power of two) hold the partial sums of row r, token t.
fn finish_row(tid: u32, lane: u32, team: u32, r: u32, t: u32, acc: f32) {
    partial[tid] = acc;
    workgroupBarrier();
    for (var s = team / 2u; s > 0u; s >>= 1u) {
        if (lane < s) {
            partial[tid] += partial[tid + s];
        }
        workgroupBarrier();
    }
    if (lane == 0u && r < params.N) {
        store_row(r, t, partial[tid]);
    }
}

// The row epilogue: bias, the fused residual add, the store.
fn store_row(r: u32, t: u32, acc: f32) {
    var v = acc;
    if (params.has_bias != 0u) {
        v += bias[params.row0 + r];
    }
    let yi = t * params.y_stride + params.row0 + r;
    if (params.has_resid != 0u) {
        v += resid[yi];
    }
    y[yi] = v;
}

// A GEMV workgroup's (row block, token group) on a grid of (row blocks, token groups). With
// `tokens_first` (workgroups of several tokens) the cells are numbered so that the token groups of
// one row block are neighbours in launch order (x, then y): the rows they share come from the cache
// once. In grid order a 32-row decode step read the 8B's 420 MB output head from memory 4 times.
fn grid_cell(wid: vec3<u32>, nwg: vec3<u32>, tokens_first: bool) -> vec2<u32> {
    if (!tokens_first) {
        return wid.xy;
    }
    let g = wid.x + wid.y * nwg.x;
    return vec2<u32>(g / nwg.y, g % nwg.y);
}
