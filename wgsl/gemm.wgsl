// Tiled GEMM for batches of tokens (prefill):
//   y[t, ycol0 + n] = dot(W[wrow0 + n], x[t]) (+ bias[bias0 + n]) (+ resid[same as y])
// for n < N, t < T, W kept in its GGUF block layout.
//
// A workgroup computes a tile of BM = 64 tokens x BN = 64 weight rows; dispatch
// (ceil(N / 64), ceil(T / 64), 1). It walks K in steps of BK = 32 values: all
// 256 invocations first stage the step's activations (64 x 32) and weights
// (64 rows x 32 values, decoded by the quant reader's block_value4, four
// values a call) in workgroup memory, then each accumulates a 4 x 4 register
// tile (tokens 4ty.., rows 4tx..) from vec4 loads of both. Each weight block
// is thus read and decoded once per 64 tokens, not once per token as the GEMV.
// Both tiles are stored k-major with 4 tokens / 4 rows per vec4, so the inner
// loop is two vec4 loads per 16 multiply-adds.
//
// Q8X (the types of infr.numerics.Q8_ACTIVATIONS): activations are rounded
// to 8 bits per 32 values the way quantize_q8.wgsl does (d = max|x| / 127,
// round(x / d) * d), so the GEMM and the int8 GEMV compute the same op
// (infr.numerics.matmul_input). A step of 32 values is exactly one rounding
// block of every token.
//
// Bounds: tokens >= T and rows >= N are staged as zeros and not stored; K must
// be whole blocks and a multiple of 4 (every reader's QK is), and a step past
// K (F32/F16/BF16 rows of K % 32 != 0) stages zeros. f32 throughout.

struct Params {
    K: u32,
    N: u32,          // rows of this dispatch
    wrow0: u32,      // their first row in the bound weight buffer
    ycol0: u32,      // the output column of that row
    row_bytes: u32,
    x_stride: u32,
    y_stride: u32,
    has_bias: u32,
    T: u32,
    has_resid: u32,
    bias0: u32,      // bias index of the first row
}

@group(0) @binding(0) var<uniform> params: Params;
@group(0) @binding(1) var<storage, read> w: array<u32>;
@group(0) @binding(2) var<storage, read> x: array<f32>;
@group(0) @binding(3) var<storage, read_write> y: array<f32>;
@group(0) @binding(4) var<storage, read> bias: array<f32>;
@group(0) @binding(5) var<storage, read> resid: array<f32>;

// #include quant_common
// #include quant_{{QTYPE}}

const BM: u32 = 64u;
const BN: u32 = 64u;
const BK: u32 = 32u;
const Q8X: bool = {{Q8X}};
// #include q8_head_{{Q8_ROUND}}
// [k][token / 4] and [k][row / 4]: 8 KiB each (16 KiB in all, WebGPU's minimum limit).
var<workgroup> xs: array<vec4<f32>, 512>;
var<workgroup> ws: array<vec4<f32>, 512>;

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) tid: u32) {
    let n0 = wid.x * BN;
    let t0 = wid.y * BM;
    let tx = tid % 16u;  // rows 4tx .. 4tx+3 of the tile
    let ty = tid / 16u;  // tokens 4ty .. 4ty+3
    // Staging: invocation tid loads token / row `ld` of the tile, values 8 seg .. 8 seg + 7 of the step.
    let ld = tid / 4u;
    let seg = tid % 4u;
    let t_ld = t0 + ld;
    let n_ld = n0 + ld;
    let x_row = t_ld * params.x_stride;
    let w_row = (params.wrow0 + n_ld) * params.row_bytes;

    var acc: array<vec4<f32>, 4>;  // acc[i][j]: token 4ty + i, row 4tx + j
    for (var i = 0u; i < 4u; i++) {
        acc[i] = vec4<f32>(0.0);
    }

    for (var k0 = 0u; k0 < params.K; k0 += BK) {
        let kk = k0 + 8u * seg;
        var xa = vec4<f32>(0.0);
        var xb = vec4<f32>(0.0);
        var wa = vec4<f32>(0.0);
        var wb = vec4<f32>(0.0);
        if (t_ld < params.T && kk < params.K) {
            let o = x_row + kk;
            xa = vec4<f32>(x[o], x[o + 1u], x[o + 2u], x[o + 3u]);
            if (kk + 4u < params.K) {
                xb = vec4<f32>(x[o + 4u], x[o + 5u], x[o + 6u], x[o + 7u]);
            }
        }
        if (n_ld < params.N && kk < params.K) {
            wa = block_value4(w_row + (kk / QK) * BLOCK_BYTES, kk % QK);
            let k4 = kk + 4u;
            if (k4 < params.K) {
                wb = block_value4(w_row + (k4 / QK) * BLOCK_BYTES, k4 % QK);
            }
        }
        workgroupBarrier();  // the previous step's tiles are no longer read
        if (Q8X) {
            // The token's max |x| over the step's 32 values: 4 invocations' partials, passed through ws.
            let a = max(abs(xa), abs(xb));
            ws[tid] = vec4<f32>(max(max(a.x, a.y), max(a.z, a.w)));
            workgroupBarrier();
            let g = tid & ~3u;
            let m = max(max(ws[g].x, ws[g + 1u].x), max(ws[g + 2u].x, ws[g + 3u].x));
// #include gemm_q8_{{Q8_ROUND}}
            workgroupBarrier();
        }
        let c = ld % 4u;
        let base = 8u * seg * 16u + ld / 4u;
        for (var e = 0u; e < 4u; e++) {
            xs[base + e * 16u][c] = xa[e];
            xs[base + (e + 4u) * 16u][c] = xb[e];
            ws[base + e * 16u][c] = wa[e];
            ws[base + (e + 4u) * 16u][c] = wb[e];
        }
        workgroupBarrier();
        for (var k = 0u; k < BK; k++) {
            let a = xs[k * 16u + ty];
            let b = ws[k * 16u + tx];
            acc[0] += a.x * b;
            acc[1] += a.y * b;
            acc[2] += a.z * b;
            acc[3] += a.w * b;
        }
    }

    for (var i = 0u; i < 4u; i++) {
        let t = t0 + 4u * ty + i;
        if (t >= params.T) {
            break;
        }
        for (var j = 0u; j < 4u; j++) {
            let n = n0 + 4u * tx + j;
            if (n >= params.N) {
                break;
            }
            var v = acc[i][j];
            if (params.has_bias != 0u) {
                v += bias[params.bias0 + n];
            }
            let yi = t * params.y_stride + params.ycol0 + n;
            if (params.has_resid != 0u) {
                v += resid[yi];
            }
            y[yi] = v;
        }
    }
}
