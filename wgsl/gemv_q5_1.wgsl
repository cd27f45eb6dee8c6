// gemv.wgsl's Q5_1 reader (x family "b32"): part p reads block p of the
// chunk, 24 bytes = f16 d, f16 m, 4 bytes qh, 16 bytes of nibbles (8-byte
// aligned: two aligned vec4); quants as Q5_0, v = d q + m.
// #include gemv_q5_0

fn w_q5_1(slot: u32, rb: u32, bc: u32, p: u32) -> WB {
    let b = rb + bc * 192u + 24u * p;
    let i = b >> 4u;
    let v0 = wvec(slot, i);
    let v1 = wvec(slot, i + 1u);
    let odd = (b & 8u) != 0u;
    let head = select(v0.xy, v0.zw, odd);  // d|m, qh
    let q = q5_bytes(head.y, select(vec4<u32>(v0.zw, v1.xy), v1, odd));
    let dm = unpack2x16float(head.x);
    return WB(q[0], q[1], vec4<f32>(dm.x, dm.x, dm.y, 0.0));
}
