// What the kernels that stage the block readers (mmq_TYPE.wgsl) share
// (gemm_mmq.wgsl, gemm_mma.wgsl): the weights w (and, {{W2}}, the pair's w2),
// the rounded rows xq, matmul_common's params and outputs, the epilogues, and
// what the readers use: word and vec4 loads of the staged matrices, byte
// tricks, the activations' value order (qv) and the staged rows of a tile.
// The including kernel declares BN, PAIR, put_q and put_s, and includes an expert_byte
// (mmq_expert_none.wgsl, or gemm_mmq's EXPERT: mmq_expert_on / _off).

@group(0) @binding(1) var<storage, read> w: array<vec4<u32>>;
@group(0) @binding(2) var<storage, read> xq: array<vec4<u32>>;

// #include matmul_common
// #include activations

{{W2}}
{{SPLIT_DECL}}

const LO4: u32 = 0x0F0F0F0Fu;

// Vec4 i of staged matrix `slot` (0: w, 1: w2), for types whose blocks are 16-byte aligned.
fn wvec(slot: u32, i: u32) -> vec4<u32> {
    {{W2_LOAD}}
    return w[i];
}

// Word i (bytes 4i .. 4i + 3) of staged matrix `slot`.
fn wword(slot: u32, i: u32) -> u32 {
    {{W2_WORD}}
    return w[i >> 2u][i & 3u];
}

// Bytes 2 .. 5 of the 8 bytes a, b when `odd`, else a: a 4-byte field at an
// offset that is 2 mod 4, read from the two words holding it.
fn al16(a: u32, b: u32, odd: bool) -> u32 {
    return select(a, (a >> 16u) | (b << 16u), odd);
}

// The f16 in the high (`hi`) or low half of a word.
fn half_at(word: u32, hi: bool) -> f32 {
    return unpack2x16float(select(word, word >> 16u, hi)).x;
}

// Four unsigned bytes v (each < 128) minus `off` per byte, as int8 lanes: no borrow crosses a byte.
fn minus4(v: u32, off: u32) -> u32 {
    return ((v | 0x80808080u) - off) ^ 0x80808080u;
}

// Bit k of t (k < 4) to bit 0 of byte k.
fn spread4(t: u32) -> u32 {
    return ((t & 0xFu) * 0x00204081u) & 0x01010101u;
}

// Stage-local vec4 of values [16 hf, 16 hf + 16) of stage sub-block sl (quantize_q8's order).
fn qv(sl: u32, hf: u32) -> u32 {
    return 4u * (sl / 2u) + (sl % 2u) + 2u * hf;
}

// Staged row `rho` of this tile: (which matrix, byte offset of its row).
fn staged_row(rho: u32, first: u32) -> vec2<u32> {
    var slot = 0u;
    var r = first + rho;
    if (PAIR && rho >= BN / 2u) {
        slot = 1u;
        r -= BN / 2u;
    }
    return vec2<u32>(slot, min(r, params.N - 1u) * params.row_bytes + expert_byte(slot));
}

// The invocation's weight units of one stage at value k0 (entry n: unit tid + n WG of the tile's
// BN * UNITS; the kernel sets NU and WG, the reader UNITS and Raw).
fn fetch_units(k0: u32, tid: u32, first: u32) -> array<Raw, NU> {
    var u: array<Raw, NU>;
    for (var n = 0u; n < NU; n++) {
        let k = tid + n * WG;
        if (k < BN * UNITS) {
            let at = staged_row(k / UNITS, first);
            u[n] = fetch_unit(at.x, at.y, k0, k % UNITS);
        }
    }
    return u;
}
