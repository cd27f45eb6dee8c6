// rmsnorm_q8.wgsl's twin (fusion.py's norm_twins): a second norm of the same row into z, from the same
// inv, and the Mul after it, as the unfused ops compute them: z = ((x * inv * g2) * scale) * w2[k %
// w2_width] (a weightless norm binds ones; no Mul: scale 1 and a one-value w2 of 1).

@group(0) @binding(5) var<storage, read> g2: array<f32>;
@group(0) @binding(6) var<storage, read_write> z: array<f32>;
@group(0) @binding(7) var<storage, read> w2: array<f32>;

fn twin_store(base: u32, i: u32, v: vec4<f32>, inv: f32) {
    let n = params.w2_width;
    let w = vec4<f32>(w2[i % n], w2[(i + 1u) % n], w2[(i + 2u) % n], w2[(i + 3u) % n]);
    let o = ((v * inv * vec4<f32>(g2[i], g2[i + 1u], g2[i + 2u], g2[i + 3u])) * params.scale) * w;
    z[base + i] = o.x;
    z[base + i + 1u] = o.y;
    z[base + i + 2u] = o.z;
    z[base + i + 3u] = o.w;
}
