// llama.cpp's activation rounding (infr.numerics LLAMACPP, for the oracle tests), chosen by the
// constant Q8_ROUND of the kernels that round (q8_common, gemm): per 32 values, q = round(x * (127
// / max|x|)) half to even (llama.cpp's CPU on x86 multiplies by that inverse), and the value is
// q * f16(max|x| / 127), the scale as its block_q8_0 keeps it. f16_bits rounds as numpy does.

// #include f16_bits

fn q8_scale(m: f32) -> f32 {
    return unpack2x16float(f16_bits(m / 127.0)).x;
}

fn q8_inverse(m: f32) -> f32 {
    return select(0.0, 127.0 / m, m > 0.0);
}
