#!/usr/bin/env bash
# The GPU figures of docs/performance.md (item 7), sized for one 10-minute device slot:
# `python -m trainctl.worker.benchmark` on the `base` preset with torch.compile on CUDA, then the HF
# peer (bench/gpu_peer.py) at the same configuration; each prints tokens/s, MFU, peak memory.
#
# The device machine has no network. Its python3 (Python 3.12, itself a venv at
# /opt/torch/.venv) has torch (CUDA), transformers and safetensors, but not pydantic, which
# store/ needs. Fetch the wheels once, on a machine with network, from the repo root:
#     bench/gpu.sh --fetch-wheels        # into .whl/ (add /.whl/ to .git/info/exclude)
# then on the device (the `device` tool: carry [".whl"]):
#     bash bench/gpu.sh
# The wheels go into a --target folder on PYTHONPATH, not a new venv: a venv made from a
# venv's python sees the base interpreter's packages, not torch.
set -euo pipefail
cd "$(dirname "$0")/.."
WHEELS=(pydantic==2.14.4 pydantic-core==2.50.5 annotated-types==0.8.0 typing-inspection==0.4.5)
STEPS=${STEPS:-10}
WARMUP=${WARMUP:-5}

if [[ "${1:-}" == "--fetch-wheels" ]]; then
    python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 \
        --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 \
        --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
        --platform manylinux1_x86_64 -d .whl "${WHEELS[@]}"
    exit 0
fi

python3 -c "import torch; assert torch.cuda.is_available(), 'no CUDA device'"
# The image's torch, transformers and safetensors stay; only what is missing is added.
SITE=/tmp/trainctl-site
if ! python3 -c "import pydantic" 2>/dev/null; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target "$SITE" .whl/*.whl
fi
export PYTHONPATH=$PWD:$SITE PYTHONUNBUFFERED=1
PY=python3
"$PY" -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__, torch.cuda.get_device_name())"

report() {
    "$PY" -c 'import json, sys
r = json.loads(sys.stdin.read().strip().splitlines()[-1])
mfu = f"{r[\"mfu\"] * 100:.1f} %" if r.get("mfu") else "n/a"
print(f"{sys.argv[1]:<10} {r[\"tokens_per_sec\"]:>12,.0f} tokens/s   MFU {mfu}   peak memory {r[\"peak_memory_bytes\"] / 2**30:.1f} GiB")' "$1"
}

echo "== trainctl: python -m trainctl.worker.benchmark (base, B=4 x 8, seq 4096, compile, bf16)"
timeout 330 "$PY" -m trainctl.worker.benchmark --steps "$STEPS" --warmup-steps "$WARMUP" --json \
    | tee /tmp/trainctl.json | report trainctl
echo "== HF peer: LlamaForCausalLM, same dims and batch, compile, bf16"
timeout 210 "$PY" -m bench.gpu_peer --steps "$STEPS" --warmup-steps "$WARMUP" \
    | tee /tmp/peer.json | report peer
"$PY" -c 'import json
a, b = (json.loads(open(p).read().strip().splitlines()[-1]) for p in ("/tmp/trainctl.json", "/tmp/peer.json"))
print(f"trainctl / peer tokens/s: {a[\"tokens_per_sec\"] / b[\"tokens_per_sec\"]:.3f}x")'
