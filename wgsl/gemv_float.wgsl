// Float weights (F32, F16, BF16) times f32 activations for decode-size batches: the GEMV of the
// types that matmul.wgsl otherwise runs with 16 lanes a row and one token a workgroup (a Qwen3
// MoE router, 128 x 2048 F32, ran there at 35 GB/s on an H100: 32 workgroups in flight).
//
// A team of TEAM lanes reads one row in 16-byte loads, lane l the loads l, l + TEAM, ..., so a
// team's loads are contiguous; U of them are issued before any is used. The host picks TEAM (32
// .. 256: short, few-row matrices get big teams so that enough workgroups stream at once) and
// NT, the tokens one workgroup takes: each load meets the activations of all NT tokens, so a
// batch of T reads the weights ceil(T / NT) times. Rows are 16-byte aligned: F32 rows are whole
// vec4 (K % 4 == 0), F16 / BF16 rows whole groups of 8 (K % 8 == 0); x_stride % 4 == 0.
// SG > 0: team sums by subgroupAdd, then across the team's subgroups in shared memory; SG = 0: a
// shared-memory tree. Params and the row epilogue (bias, fused residual) are matmul_common's.
// EXPERT (expert_on.wgsl): rows of the expert bank that ids picks per (token, slot) pair (NT = 1).
// dispatch (ceil(N_chunk / (WG / TEAM)), ceil(T / NT), 1), numbered by grid_cell (matmul_common).

@group(0) @binding(1) var<storage, read> w: array<vec4<u32>>;
@group(0) @binding(2) var<storage, read> x: array<vec4<f32>>;

// #include matmul_common
{{EXPERT}}

const WG: u32 = 256u;
const TEAM: u32 = {{TEAM}}u;   // lanes per row, a power of two in 32 .. 256
const ROWS: u32 = WG / TEAM;   // rows per workgroup
const NT: u32 = {{NT}}u;       // tokens per workgroup
const U: u32 = {{U}}u;         // loads in flight per lane
const SG: u32 = {{SG}}u;       // subgroup size used for the reduction (divides 32); 0 = none
const XV: u32 = {{XV}}u;       // vec4 of x per 16-byte load: 1 (F32) or 2 (F16, BF16)

var<workgroup> partial: array<f32, WG * NT>;

// Stands in for subgroupAdd where the adapter has no subgroups (that branch never runs).
fn no_subgroups(v: f32) -> f32 {
    return v;
}

fn bf16_pair(q: u32) -> vec2<f32> {
    return bitcast<vec2<f32>>(vec2<u32>(q << 16u, q & 0xFFFF0000u));
}

// One 16-byte load of weights dotted with the activations from vec4 xi on.
fn wdot_f32(v: vec4<u32>, xi: u32) -> f32 {
    return dot(bitcast<vec4<f32>>(v), x[xi]);
}

fn wdot_f16(v: vec4<u32>, xi: u32) -> f32 {
    let a = vec4<f32>(unpack2x16float(v.x), unpack2x16float(v.y));
    let b = vec4<f32>(unpack2x16float(v.z), unpack2x16float(v.w));
    return dot(a, x[xi]) + dot(b, x[xi + 1u]);
}

fn wdot_bf16(v: vec4<u32>, xi: u32) -> f32 {
    let a = vec4<f32>(bf16_pair(v.x), bf16_pair(v.y));
    let b = vec4<f32>(bf16_pair(v.z), bf16_pair(v.w));
    return dot(a, x[xi]) + dot(b, x[xi + 1u]);
}

@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) tid: u32) {
    // (row block, token group), token groups first: a prompt's T / NT reads of a matrix past the
    // cache's size (Gemma 4's 8960-row PLE projection) come from memory about once.
    let cell = grid_cell(wid, nwg, NT > 1u);
    let t0 = cell.y * NT;  // the workgroup's first token (expert_on: a (token, slot) pair, NT == 1)
    // Uniform guard (workgroup id, params and a read-only binding): the barriers below stay legal.
    if (t0 >= params.T || expert_skip(t0)) {
        return;
    }
    let lane = tid % TEAM;
    let row = cell.x * ROWS + tid / TEAM;
    let r = min(row, params.N - 1u);  // rows past N read row N - 1 and are not stored
    let nv = params.row_bytes / 16u;  // loads per row
    let wbase = (r * params.row_bytes + expert_byte(0u, t0)) / 16u;
    let xs = params.x_stride / 4u;
    var xrow: array<u32, NT>;
    for (var j = 0u; j < NT; j++) {
        // Tokens past T (the batch's last workgroup) read token T - 1 and are not stored.
        xrow[j] = x_token(min(t0 + j, params.T - 1u)) * xs;
    }
    var acc: array<f32, NT>;
    for (var i0 = lane; i0 < nv; i0 += TEAM * U) {
        var v: array<vec4<u32>, U>;
        for (var u = 0u; u < U; u++) {
            v[u] = w[wbase + min(i0 + u * TEAM, nv - 1u)];  // idle slots reload the row's last vec4
        }
        for (var u = 0u; u < U; u++) {
            let i = i0 + u * TEAM;
            for (var j = 0u; j < NT; j++) {
                let d = {{WDOT}}(v[u], xrow[j] + min(i, nv - 1u) * XV);
                acc[j] += select(0.0, d, i < nv);
            }
        }
    }

    // Team sums, ending in lane 0.
    var tot: array<f32, NT>;
    if (SG == TEAM) {
        for (var j = 0u; j < NT; j++) {
            tot[j] = {{SUBGROUP_ADD}}(acc[j]);
        }
    } else if (SG > 0u) {
        let sg = max(SG, 1u);
        for (var j = 0u; j < NT; j++) {
            let s = {{SUBGROUP_ADD}}(acc[j]);
            if (tid % sg == 0u) {
                partial[(tid / sg) * NT + j] = s;
            }
        }
        workgroupBarrier();
        if (lane == 0u) {
            for (var j = 0u; j < NT; j++) {
                var s = 0.0;
                for (var k = 0u; k < TEAM / sg; k++) {
                    s += partial[(tid / sg + k) * NT + j];
                }
                tot[j] = s;
            }
        }
    } else {
        for (var j = 0u; j < NT; j++) {
            partial[j * WG + tid] = acc[j];
        }
        workgroupBarrier();
        for (var s = TEAM / 2u; s > 0u; s >>= 1u) {
            if (lane < s) {
                for (var j = 0u; j < NT; j++) {
                    partial[j * WG + tid] += partial[j * WG + tid + s];
                }
            }
            workgroupBarrier();
        }
        for (var j = 0u; j < NT; j++) {
            tot[j] = partial[j * WG + tid];
        }
    }
    if (lane == 0u && row < params.N) {
        for (var j = 0u; j < NT; j++) {
            if (t0 + j < params.T) {
                store_row(row, t0 + j, tot[j]);
            }
        }
    }
}
