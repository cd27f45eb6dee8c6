// gemv.wgsl's Q4_1 reader (x family "b32"): part p reads block p of the
// chunk, 20 bytes = f16 d, f16 m, 16 bytes of nibbles as Q4_0 (4-byte
// aligned). v = d q + m: d dx sum q qx + m dx sum qx.

fn w_q4_1(slot: u32, rb: u32, bc: u32, p: u32) -> WB {
    let b = rb + bc * 160u + 20u * p;
    let dm = unpack2x16float(wword(slot, b));
    let q = wide16(slot, b + 4u);
    return WB(q & vec4<u32>(LO), (q >> vec4<u32>(4u)) & vec4<u32>(LO), vec4<f32>(dm.x, dm.x, dm.y, 0.0));
}
