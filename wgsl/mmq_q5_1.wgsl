// Q5_1 for gemm_mmq.wgsl: 32 values, 24 bytes (blocks 8-byte aligned) = f16 d,
// f16 m, 4 bytes qh, 16 bytes of nibbles: Q5_0's values without the offset,
// v = d q + m (MIN_TERM). A staging unit is one block (units per stage: SUB), 6 words.

const UNITS: u32 = SUB;
const MIN_TERM: bool = true;
const SCALE16: bool = false;
const INIT: bool = false;

struct Raw {
    q: array<u32, 6>,
}

fn reader_init(tid: u32) {}

fn fetch_unit(slot: u32, rb: u32, k0: u32, u: u32) -> Raw {
    let i = (rb + (k0 / 32u + u) * 24u) >> 2u;
    var g: Raw;
    for (var k = 0u; k < 6u; k++) {
        g.q[k] = wword(slot, i + k);
    }
    return g;
}

fn put_unit(g: Raw, rb: u32, k0: u32, u: u32, rho: u32, buf: u32) {
    let qh = g.q[1];
    var lo: array<u32, 4>;
    var hi: array<u32, 4>;
    for (var k = 0u; k < 4u; k++) {
        let q = g.q[k + 2u];
        lo[k] = (q & LO4) | (spread4(qh >> (4u * k)) << 4u);
        hi[k] = ((q >> 4u) & LO4) | (spread4(qh >> (16u + 4u * k)) << 4u);
    }
    put_q(buf, rho, qv(u, 0u), vec4<u32>(lo[0], lo[1], lo[2], lo[3]));
    put_q(buf, rho, qv(u, 1u), vec4<u32>(hi[0], hi[1], hi[2], hi[3]));
    put_s(buf, rho, u, unpack2x16float(g.q[0]));
}
