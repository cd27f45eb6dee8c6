// Q6_K for gemm_mmq.wgsl: 256 values, 210 bytes (blocks 2-byte aligned) =
// 128 bytes ql (low 4 bits), 64 bytes qh (high 2 bits), 16 int8 scales, f16
// d; value 128n + 32g + l (g, l < 32) is the low (g < 2) or high nibble of
// ql[64n + 32 (g & 1) + l] with bits 2g, 2g + 1 of qh[32n + l] on top, and
// v = d scale[i / 16] (q - 32): q - 32 fits int8, and each 16 values of the
// activations' vec4 order share one scale (SCALE16). A staging unit is
// values [16h, 16h + 16) of one sub-block pair 2c, 2c + 1 of the stage (units
// per stage: SUB): 16 bytes of ql for each and the 16 bytes of qh they share.
// Blocks start at any even byte, but every field is 16-aligned within the block:
// each 16 bytes come from two aligned vec4 (realign), ql's of both sub-blocks from
// four in a row, with one shift, six vec4 loads a unit where words took fifteen.
// Unit h = 0 / 1 also writes the two 16-value scales of sub-block 2c / 2c + 1.
// #include realign

const UNITS: u32 = SUB;
const MIN_TERM: bool = false;
const SCALE16: bool = true;
const INIT: bool = false;

struct Raw {
    ql: array<vec4<u32>, 4>,  // the aligned vec4 holding ql of sub-blocks 2c (first two) and 2c + 1
    qh: array<vec4<u32>, 2>,  // those holding the qh of both
    sc: u32,                  // the word holding the two scales this unit writes
    d: u32,                   // the word holding d
}

fn reader_init(tid: u32) {}

// minus4(v, 32) of each word: bytes below 64 less 32, as int8 lanes.
fn minus4v(v: vec4<u32>) -> vec4<u32> {
    return vec4<u32>(minus4(v.x, 0x20202020u), minus4(v.y, 0x20202020u), minus4(v.z, 0x20202020u),
                     minus4(v.w, 0x20202020u));
}

fn fetch_unit(slot: u32, rb: u32, k0: u32, u: u32) -> Raw {
    let bb = rb + (k0 / 256u) * 210u;
    let c = (k0 % 256u) / 64u + u / 2u;  // the pair in the block
    let hf = u % 2u;
    let n = c / 2u;
    let ia = (bb + 64u * n + 16u * hf) >> 4u;
    let ih = (bb + 128u + 32u * n + 16u * hf) >> 4u;
    var g: Raw;
    for (var k = 0u; k < 4u; k++) {
        g.ql[k] = wvec(slot, ia + k);
    }
    g.qh[0] = wvec(slot, ih);
    g.qh[1] = wvec(slot, ih + 1u);
    g.sc = wword(slot, (bb + 192u + 2u * (2u * c + hf)) >> 2u);
    g.d = wword(slot, (bb + 208u) >> 2u);
    return g;
}

fn put_unit(g: Raw, rb: u32, k0: u32, u: u32, rho: u32, buf: u32) {
    let bb = rb + (k0 / 256u) * 210u;
    let off = bb & 15u;  // every field's offset from its aligned vec4
    let c = (k0 % 256u) / 64u + u / 2u;
    let cl = u / 2u;
    let hf = u % 2u;
    let ns = 4u * (c % 2u);  // nibble shift: sub-blocks 4n + 2 (c % 2) (+ 1) have g >> 1 = c % 2
    let a = realign(g.ql[0], g.ql[1], off);
    let b = realign(g.ql[2], g.ql[3], off);
    let h = realign(g.qh[0], g.qh[1], off) >> vec4<u32>(ns);  // bits 2g of sub-block 2c: g = 2 (c % 2)
    let qa = ((a >> vec4<u32>(ns)) & vec4<u32>(LO4)) | ((h << vec4<u32>(4u)) & vec4<u32>(0x30303030u));
    let qb = ((b >> vec4<u32>(ns)) & vec4<u32>(LO4)) | ((h << vec4<u32>(2u)) & vec4<u32>(0x30303030u));
    put_q(buf, rho, qv(2u * cl, hf), minus4v(qa));
    put_q(buf, rho, qv(2u * cl + 1u, hf), minus4v(qb));
    let s = 2u * c + hf;  // the sub-block whose scales: bytes 2s, 2s + 1
    let sc = g.sc >> (8u * ((bb + 192u + 2u * s) & 2u));
    let lo = f32(bitcast<i32>(sc << 24u) >> 24u);
    let hi = f32(bitcast<i32>(sc << 16u) >> 24u);
    let d = half_at(g.d, ((bb + 208u) & 2u) != 0u);
    put_s(buf, rho, 2u * cl + hf, vec2<f32>(d * lo, d * hi));
}
