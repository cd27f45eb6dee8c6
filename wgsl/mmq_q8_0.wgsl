// Q8_0 for gemm_mmq.wgsl: 32 values, 34 bytes (blocks 2-byte aligned) = f16 d,
// 32 int8 q; v = d q. A staging unit is one block (units per stage: SUB), read
// as the 9 words that hold it: q starts on a word when the block starts at
// 2 mod 4, and 2 bytes into one otherwise.

const UNITS: u32 = SUB;
const MIN_TERM: bool = false;
const SCALE16: bool = false;
const INIT: bool = false;

struct Raw {
    q: array<u32, 9>,
}

fn reader_init(tid: u32) {}

fn fetch_unit(slot: u32, rb: u32, k0: u32, u: u32) -> Raw {
    let i = (rb + (k0 / 32u + u) * 34u) >> 2u;
    var g: Raw;
    for (var k = 0u; k < 9u; k++) {
        g.q[k] = wword(slot, i + k);
    }
    return g;
}

fn put_unit(g: Raw, rb: u32, k0: u32, u: u32, rho: u32, buf: u32) {
    let odd = ((rb + (k0 / 32u + u) * 34u) & 2u) != 0u;
    var q: array<u32, 8>;
    for (var k = 0u; k < 8u; k++) {
        q[k] = select(al16(g.q[k], g.q[k + 1u], true), g.q[k + 1u], odd);
    }
    put_q(buf, rho, qv(u, 0u), vec4<u32>(q[0], q[1], q[2], q[3]));
    put_q(buf, rho, qv(u, 1u), vec4<u32>(q[4], q[5], q[6], q[7]));
    put_s(buf, rho, u, vec2<f32>(half_at(g.q[0], odd), 0.0));
}
