// F16 weights. A "block" is 8 halves (16 bytes); with K % 8 == 0 every block
// is 16-byte aligned, so each word holds two halves.
// #include quant_common

const QK: u32 = 8u;
const BLOCK_BYTES: u32 = 16u;

fn block_dot(wb: u32, xo: u32) -> f32 {
    let i = wb >> 2u;
    let a = vec4<f32>(unpack2x16float(w[i]), unpack2x16float(w[i + 1u]));
    let b = vec4<f32>(unpack2x16float(w[i + 2u]), unpack2x16float(w[i + 3u]));
    return dot(a, x4(xo)) + dot(b, x4(xo + 4u));
}

fn block_value(wb: u32, i: u32) -> f32 {
    return rd_f16(wb + 2u * i);
}

// Values i .. i+3 of the block (i % 4 == 0), for kernels that stage whole tiles (gemm).
fn block_value4(wb: u32, i: u32) -> vec4<f32> {
    let j = (wb >> 2u) + (i >> 1u);
    return vec4<f32>(unpack2x16float(w[j]), unpack2x16float(w[j + 1u]));
}
