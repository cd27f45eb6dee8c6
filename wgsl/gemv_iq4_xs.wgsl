// gemv.wgsl's IQ4_XS reader (x family "b32"): 136 bytes per 256 values = f16
// d, u16 scales_h, 4 bytes scales_l, then 16 bytes of IQ4_NL nibbles per
// sub-block; part p reads sub-block p (8-byte aligned: two aligned vec4), whose
// scale is (nibble p % 2 of scales_l[p / 2]) | (bits 2p, 2p + 1 of scales_h) << 4, minus 32.
// #include gemv_iq4_nl

fn w_iq4_xs(slot: u32, rb: u32, bc: u32, p: u32) -> WB {
    let b = rb + bc * 136u;
    let head = wword(slot, b);  // d | scales_h
    let ls = ((wword(slot, b + 4u) >> (4u * p)) & 0xFu) | (((head >> (16u + 2u * p)) & 3u) << 4u);
    let q = wide16(slot, b + 8u + 16u * p);
    let d = unpack2x16float(head).x * (f32(ls) - 32.0);
    return WB(iq4_bytes(q, 0u), iq4_bytes(q, 4u), vec4<f32>(d, d, 0.0, 0.0));
}
