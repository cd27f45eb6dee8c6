// F32 weights. A "block" is 4 floats (one 16-byte load); rows are 4-byte
// aligned, so words are read directly. Needs K % 4 == 0.
// #include quant_common

const QK: u32 = 4u;
const BLOCK_BYTES: u32 = 16u;

fn block_dot(wb: u32, xo: u32) -> f32 {
    let i = wb >> 2u;
    let v = bitcast<vec4<f32>>(vec4<u32>(w[i], w[i + 1u], w[i + 2u], w[i + 3u]));
    return dot(v, x4(xo));
}

fn block_value(wb: u32, i: u32) -> f32 {
    return bitcast<f32>(w[(wb >> 2u) + i]);
}

// Values i .. i+3 of the block (i % 4 == 0), for kernels that stage whole tiles (gemm).
fn block_value4(wb: u32, i: u32) -> vec4<f32> {
    let j = (wb >> 2u) + i;
    return bitcast<vec4<f32>>(vec4<u32>(w[j], w[j + 1u], w[j + 2u], w[j + 3u]));
}
