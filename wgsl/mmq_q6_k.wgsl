// Q6_K for gemm_mmq.wgsl: 256 values, 210 bytes (blocks 2-byte aligned) =
// 128 bytes ql (low 4 bits), 64 bytes qh (high 2 bits), 16 int8 scales, f16
// d; value 128n + 32g + l (g, l < 32) is the low (g < 2) or high nibble of
// ql[64n + 32 (g & 1) + l] with bits 2g, 2g + 1 of qh[32n + l] on top, and
// v = d scale[i / 16] (q - 32): q - 32 fits int8, and each 16 values of the
// activations' vec4 order share one scale (SCALE16). A staging unit is
// values [16h, 16h + 16) of one sub-block pair 2c, 2c + 1 of the stage (units
// per stage: SUB): 16 bytes of ql for each and the 16 bytes of qh they share,
// read as 5 words each (the block's offset is 0 or 2 mod 4). Unit h = 0 / 1
// also writes the two 16-value scales of sub-block 2c / 2c + 1.

const UNITS: u32 = SUB;
const MIN_TERM: bool = false;
const SCALE16: bool = true;
const INIT: bool = false;

struct Raw {
    a: array<u32, 5>,  // ql of sub-block 2c
    b: array<u32, 5>,  // ql of sub-block 2c + 1
    h: array<u32, 5>,  // qh of both
    sc: u32,           // the word holding the two scales this unit writes
    d: u32,            // the word holding d
    s0: u32,           // DIRECT (gemm_mma's WC 3): the two words holding scales 4c .. 4c + 3
    s1: u32,
}

fn reader_init(tid: u32) {}

fn fetch_unit(slot: u32, rb: u32, k0: u32, u: u32) -> Raw {
    let bb = rb + (k0 / 256u) * 210u;
    let c = (k0 % 256u) / 64u + u / 2u;  // the pair in the block
    let hf = u % 2u;
    let n = c / 2u;
    let ia = (bb + 64u * n + 16u * hf) >> 2u;
    let ih = (bb + 128u + 32u * n + 16u * hf) >> 2u;
    var g: Raw;
    for (var k = 0u; k < 5u; k++) {
        g.a[k] = wword(slot, ia + k);
        g.b[k] = wword(slot, ia + 8u + k);
        g.h[k] = wword(slot, ih + k);
    }
    g.sc = wword(slot, (bb + 192u + 2u * (2u * c + hf)) >> 2u);
    g.d = wword(slot, (bb + 208u) >> 2u);
    if (DIRECT) {
        let sw = (bb + 192u + 4u * c) >> 2u;
        g.s0 = wword(slot, sw);
        g.s1 = wword(slot, sw + 1u);
    }
    return g;
}

fn put_unit(g: Raw, rb: u32, k0: u32, u: u32, rho: u32, buf: u32) {
    let bb = rb + (k0 / 256u) * 210u;
    let odd = (bb & 2u) != 0u;
    let c = (k0 % 256u) / 64u + u / 2u;
    let cl = u / 2u;
    let hf = u % 2u;
    let ns = 4u * (c % 2u);  // nibble shift: sub-blocks 4n + 2 (c % 2) (+ 1) have g >> 1 = c % 2
    var qa: array<u32, 4>;
    var qb: array<u32, 4>;
    for (var k = 0u; k < 4u; k++) {
        let a = al16(g.a[k], g.a[k + 1u], odd);
        let b = al16(g.b[k], g.b[k + 1u], odd);
        let h = al16(g.h[k], g.h[k + 1u], odd) >> ns;  // bits 2g of sub-block 2c: g = 2 (c % 2)
        qa[k] = minus4(((a >> ns) & LO4) | ((h << 4u) & 0x30303030u), 0x20202020u);
        qb[k] = minus4(((b >> ns) & LO4) | ((h << 2u) & 0x30303030u), 0x20202020u);
    }
    put_q(buf, rho, qv(2u * cl, hf), vec4<u32>(qa[0], qa[1], qa[2], qa[3]));
    put_q(buf, rho, qv(2u * cl + 1u, hf), vec4<u32>(qb[0], qb[1], qb[2], qb[3]));
    let s = 2u * c + hf;  // the sub-block whose scales: bytes 2s, 2s + 1
    let sc = g.sc >> (8u * ((bb + 192u + 2u * s) & 2u));
    let lo = f32(bitcast<i32>(sc << 24u) >> 24u);
    let hi = f32(bitcast<i32>(sc << 16u) >> 24u);
    let d = half_at(g.d, ((bb + 208u) & 2u) != 0u);
    put_s(buf, rho, 2u * cl + hf, vec2<f32>(d * lo, d * hi));
}
