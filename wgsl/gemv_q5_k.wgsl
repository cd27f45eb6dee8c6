// gemv.wgsl's Q5_K reader (x family "std"): 176 bytes = 11 vec4, the Q4_K
// header, 32 bytes qh, then nibbles laid out as Q4_K. Part p = 2c + hh reads
// nibble vec4 3 + p and qh vec4 1 + hh: the fifth bit of its low nibbles is
// bit 2c of qh[16hh + i], of its high nibbles bit 2c + 1. Rows are 16-byte aligned.
// #include gemv_q4_k

fn w_q5_k(slot: u32, rb: u32, bc: u32, p: u32) -> WB {
    let v = rb / 16u + bc * 11u;
    let q = wvec(slot, v + 3u + p);
    let h = wvec(slot, v + 1u + (p & 1u));
    let c = p / 2u;
    let one = vec4<u32>(0x01010101u);
    let qa = (q & vec4<u32>(LO)) | (((h >> vec4<u32>(2u * c)) & one) << vec4<u32>(4u));
    let qb = ((q >> vec4<u32>(4u)) & vec4<u32>(LO)) | (((h >> vec4<u32>(2u * c + 1u)) & one) << vec4<u32>(4u));
    return k_weights(wvec(slot, v), qa, qb, p);
}
