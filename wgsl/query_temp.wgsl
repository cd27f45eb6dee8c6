// Query temperature (llama4's NoPE layers), in place on q [T, width]: row t is
// multiplied by tau[rows[2t]], its position's factor. The host computes tau
// once per position at load (QueryTemperature.factor), so the GPU scales by the
// CPU reference's very floats rather than its own log. A position past the
// table (only a padding row's) reads the last entry. Dispatch (ceil(width / WG), T, 1).

struct Params {
    width: u32,
    n_pos: u32,
}

const WG: u32 = 64u;

@group(0) @binding(0) var<uniform> params: Params;
@group(0) @binding(1) var<storage, read_write> x: array<f32>;
@group(0) @binding(2) var<storage, read> tau: array<f32>;
@group(0) @binding(3) var<storage, read> rows: array<u32>;  // [2t]: position of row t, [2t + 1]: its slot

@compute @workgroup_size(WG)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let i = gid.x;
    let t = gid.y;
    if (i >= params.width) {
        return;
    }
    let pos = min(rows[2u * t], params.n_pos - 1u);
    x[t * params.width + i] *= tau[pos];
}
