// gelu_f16: llama.cpp CPU's table GELU, read from the CPU reference's table (numerics.gelu_f16_table,
// 65536 f32, one per f16 bit pattern) at the f16 bits of v, so both backends agree bit for bit. One
// function for every kernel that applies it (gemma4.wgsl's gated_gelu_f16, the GEMV's gate||up pair),
// so the fused and unfused activations are the same words. The including kernel declares
// `gelu_table: array<f32>` (its own binding).

// #include f16_bits

fn gelu_f16(v: f32) -> f32 {
    if (v <= -10.0) {
        return 0.0;
    }
    if (v >= 10.0) {
        return v;
    }
    return gelu_table[f16_bits(v)];
}
