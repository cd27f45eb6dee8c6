// gemv.wgsl's Q6_K reader (x family "q6k"). A block is 210 bytes: ql[128]
// (low 4 bits), qh[64] (high 2 bits), 16 int8 scales (one per 16 values), f16
// d; value 128n + 32g + l is nibble g / 2 of ql[64n + 32 (g & 1) + l] with
// bits 2g, 2g + 1 of qh[32n + l], minus 32. Part p = 4n + 2j + hh reads the
// 16 bytes ql[16p ..], both nibbles (g = j and j + 2, l = 16hh ..), and
// qh[32n + 16hh ..]; two parts share those qh bytes. Blocks start at any
// even byte (210 = 2 * 105), so each 16 bytes come from two aligned vec4
// (realign; every field is 16-aligned within the block, so one shift serves all).

// Bytes b - 32 for bytes b < 64, as int8: no borrow crosses a byte.
fn minus32(q: vec4<u32>) -> vec4<u32> {
    return ((q | vec4<u32>(0x80808080u)) - vec4<u32>(0x20202020u)) ^ vec4<u32>(0x80808080u);
}

fn i8at(slot: u32, a: u32) -> f32 {
    return f32(bitcast<i32>(wword(slot, a) << (24u - 8u * (a & 3u))) >> 24u);
}

fn w_q6_k(slot: u32, rb: u32, bc: u32, p: u32) -> WB {
    let b = rb + bc * 210u;
    let i = b >> 4u;
    let s = b & 15u;
    let n = p / 4u;
    let j = (p / 2u) & 1u;
    let hh = p & 1u;
    let ql = realign(wvec(slot, i + p), wvec(slot, i + p + 1u), s);
    let qi = i + 8u + 2u * n + hh;
    let qh = realign(wvec(slot, qi), wvec(slot, qi + 1u), s);
    let three = vec4<u32>(0x03030303u);
    let qa = (ql & vec4<u32>(LO)) | (((qh >> vec4<u32>(2u * j)) & three) << vec4<u32>(4u));
    let qb = ((ql >> vec4<u32>(4u)) & vec4<u32>(LO)) | (((qh >> vec4<u32>(2u * j + 4u)) & three) << vec4<u32>(4u));
    let m = b + 192u + 8u * n + 2u * j + hh;  // the scale of qa's 16 values; qb's is 4 further
    let d = wf16(slot, b + 208u);
    return WB(minus32(qa), minus32(qb), vec4<f32>(d * i8at(slot, m), d * i8at(slot, m + 4u), 0.0, 0.0));
}
