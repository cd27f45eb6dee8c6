// gemv.wgsl's Q5_0 reader (x family "b32"): part p reads block p of the
// chunk, 22 bytes = f16 d, 4 bytes qh, 16 bytes of nibbles (as Q4_0), from
// any even byte: qh and the nibbles are 20 bytes from three aligned vec4.
// Bit i of qh is the fifth bit of value i; v = d (q - 16).

// Bits 0..3 of t to bit 4 of bytes 0..3.
fn bit4s(t: vec4<u32>) -> vec4<u32> {
    return ((t & vec4<u32>(1u)) | ((t & vec4<u32>(2u)) << vec4<u32>(7u)) | ((t & vec4<u32>(4u)) << vec4<u32>(14u))
            | ((t & vec4<u32>(8u)) << vec4<u32>(21u))) << vec4<u32>(4u);
}

// The 32 quants of a Q5_0 / Q5_1 block as bytes: values 0..15, 16..31.
fn q5_bytes(qh: u32, q: vec4<u32>) -> array<vec4<u32>, 2> {
    let lo = (vec4<u32>(qh) >> vec4<u32>(0u, 4u, 8u, 12u)) & vec4<u32>(0xFu);
    let hi = (vec4<u32>(qh) >> vec4<u32>(16u, 20u, 24u, 28u)) & vec4<u32>(0xFu);
    return array<vec4<u32>, 2>((q & vec4<u32>(LO)) | bit4s(lo), ((q >> vec4<u32>(4u)) & vec4<u32>(LO)) | bit4s(hi));
}

fn w_q5_0(slot: u32, rb: u32, bc: u32, p: u32) -> WB {
    let b = rb + bc * 176u + 22u * p;
    let i = (b + 2u) >> 4u;
    let s = (b + 2u) & 15u;
    let v1 = wvec(slot, i + 1u);
    let r0 = realign(wvec(slot, i), v1, s);  // qh, nibble bytes 0..11
    let r1 = realign(v1, wvec(slot, i + 2u), s);  // nibble bytes 12..15, ...
    let q = q5_bytes(r0.x, vec4<u32>(r0.yzw, r1.x));
    let d = wf16(slot, b);
    return WB(q[0], q[1], vec4<f32>(d, d, -16.0 * d, 0.0));
}
