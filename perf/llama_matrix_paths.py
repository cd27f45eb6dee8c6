"""llama-server's prompt rate by its matrix path, on one synthetic model: NV_cooperative_matrix2
(its default on NVIDIA), VK_KHR_cooperative_matrix alone (GGML_VK_DISABLE_COOPMAT2=1: the tensor-core
path WebGPU's subgroup matrices map to), and neither (GGML_VK_DISABLE_COOPMAT=1 too).

    source .gpu/setup.sh && python3 perf/llama_matrix_paths.py llama-3.1-8b

PRESET[:TYPE] as perf/compare_llama_server.py takes it; pp512 (COMPARE_PP), 5 repetitions each.
"""

import os
import sys
from pathlib import Path

sys.path[:0] = [str(Path(__file__).resolve().parent)]
os.environ["COMPARE_DEPTH"] = "0"
import compare_llama_server as C  # noqa: E402

from infr import bench, llamacpp  # noqa: E402

PATHS = ({}, {"GGML_VK_DISABLE_COOPMAT2": "1"}, {"GGML_VK_DISABLE_COOPMAT2": "1", "GGML_VK_DISABLE_COOPMAT": "1"})


def main() -> None:
    path = bench.model_path("synth:" + (sys.argv[1] if len(sys.argv) > 1 else "llama-3.1-8b"))
    tests = [t for t in C.TESTS if t.name.startswith("pp")]
    for env in PATHS:
        for k in PATHS[-1]:
            os.environ.pop(k, None)
        os.environ.update(env)  # llama-server inherits it
        got = llamacpp.run(llamacpp.find("server"), path, tests, 5, gpu=True, n_ctx=C.N_CTX)
        print(env or "default", [round(x, 1) for x in got["results"][tests[0].name]["samples_ts"]], flush=True)


if __name__ == "__main__":
    main()
