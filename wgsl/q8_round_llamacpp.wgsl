    // llama.cpp's rounding (q8_head_llamacpp): q from x * (127 / max), d the f16 scale
    let d = q8_scale(m);
    let q = vec4<i32>(round(vals * q8_inverse(m)));