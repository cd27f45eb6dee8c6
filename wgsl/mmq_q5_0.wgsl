// Q5_0 for gemm_mmq.wgsl: 32 values, 22 bytes (blocks 2-byte aligned) = f16 d,
// 4 bytes qh, 16 bytes of nibbles laid out as Q4_0's; bit j of qh is the fifth
// bit of value j; v = d (q - 16), and q - 16 fits int8. A staging unit is one
// block (units per stage: SUB), read as the 6 words holding it.

const UNITS: u32 = SUB;
const MIN_TERM: bool = false;
const SCALE16: bool = false;
const INIT: bool = false;

struct Raw {
    q: array<u32, 6>,
}

fn reader_init(tid: u32) {}

fn fetch_unit(slot: u32, rb: u32, k0: u32, u: u32) -> Raw {
    let i = (rb + (k0 / 32u + u) * 22u) >> 2u;
    var g: Raw;
    for (var k = 0u; k < 6u; k++) {
        g.q[k] = wword(slot, i + k);
    }
    return g;
}

fn put_unit(g: Raw, rb: u32, k0: u32, u: u32, rho: u32, buf: u32) {
    let odd = ((rb + (k0 / 32u + u) * 22u) & 2u) != 0u;
    // odd: qh and the nibbles start on words 1 and 2; else 2 bytes into words 0 and 1
    let qh = select(al16(g.q[0], g.q[1], true), g.q[1], odd);
    var lo: array<u32, 4>;
    var hi: array<u32, 4>;
    for (var k = 0u; k < 4u; k++) {
        let q = select(al16(g.q[k + 1u], g.q[k + 2u], true), g.q[k + 2u], odd);
        lo[k] = minus4((q & LO4) | (spread4(qh >> (4u * k)) << 4u), 0x10101010u);
        hi[k] = minus4(((q >> 4u) & LO4) | (spread4(qh >> (16u + 4u * k)) << 4u), 0x10101010u);
    }
    put_q(buf, rho, qv(u, 0u), vec4<u32>(lo[0], lo[1], lo[2], lo[3]));
    put_q(buf, rho, qv(u, 1u), vec4<u32>(hi[0], hi[1], hi[2], hi[3]));
    put_s(buf, rho, u, vec2<f32>(half_at(g.q[0], odd), 0.0));
}
