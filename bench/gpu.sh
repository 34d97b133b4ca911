#!/usr/bin/env bash
# The GPU session's one script (docs/performance.md, item 7).
#
#   bench/gpu.sh --fetch-wheels   here, with network: what the device's python3 lacks, into .whl/
#   bench/gpu.sh --dry-run        here, on the CPU: every step end to end at tiny sizes
#   bash bench/gpu.sh             on the GPU machine (the device call carries .whl)
#
# The steps, in this order. Each has its own timeout; one that fails is reported and the
# next one runs. GPU_STEPS="name ..." runs only those (a rerun of what did not finish).
#   env             versions: python, torch, CUDA, the GPU, cores, disk
#   pytest_gpu      pytest -m gpu, over the test files that hold gpu tests
#   bench_trainctl  python -m trainctl.worker.kinds.benchmark: base, micro-batch 4 x 8, seq 4096,
#                   torch.compile reduce-overhead, bf16, per-layer activation checkpointing
#   bench_trainctl_default  only if bench_trainctl failed: the same in compile mode default
#   bench_peer      python -m bench.gpu_peer: HF LlamaForCausalLM, same dims, batch, bf16, compile
#   checkpoint_io   python -m bench --only checkpoint_io: sync save against raw on every core,
#                   the async stall with the model on the GPU
#   train_resume    python -m bench.gpu_train: base through the service, the CLI and
#                   python -m trainctl.worker, 50 steps (bf16, compile reduce-overhead, async
#                   checkpoints), then a second run resuming from latest for 10 more
#   fsdp_1b         python -m bench.fsdp_train: the 1b preset under fsdp on the one GPU (tiny on CPU)
#   fsdp_8b         the 8b preset under fsdp across the node's GPUs, where the estimate fits
#   llama_base      a transformers llama config of base's shape through trainctl's benchmark
# then the summary (python -m bench.gpu_summary): every figure and the ratios against the goals.
# A new step is a function `step_NAME` (it writes $STEPS_DIR/NAME.json; `skip REASON` skips
# it) and one `run_step NAME SECONDS` line below.
#
# Under ${OUT:-/tmp/gpu-out}, four files (the device returns at most 8 from $OUT), refreshed
# after every step, so a run cut off at its time limit still returns what it had done:
#   gpu.log         this script's whole output
#   summary.txt     the summary as printed, summary.json the same as data
#   steps.tar.gz    each step's NAME.log, NAME.json and NAME.status
#
# Settings (environment): GPU_BUDGET, seconds for all the steps together (default 330, the
# device call's timeout_s being 390; a step that would pass it is not run, and said so);
# GPU_STEPS; PYTHON (default: python3 on the device, the repo's .venv/bin/python here if
# there is one); BENCH_STEPS and BENCH_WARMUP, the measured and warm-up steps of both
# benchmarks (10, 3). Exit code 0 when every step ran ok or skipped on purpose, else 1.
#
# The device machine has no network; its python3 (3.12, itself a venv) has torch, transformers
# and safetensors but not pydantic, SQLAlchemy or FastAPI (bench/gpu_image.py lists both
# sides). The wheels go into a --target folder on PYTHONPATH: a venv made from a venv's python
# would not see its torch. The dry run cannot install them (they are for CPython 3.12); it
# checks that .whl/ holds each, and runs every Python process with only the modules that the
# device will have (bench/gpu_image.py's sitecustomize), so a missing wheel fails here.
# shellcheck disable=SC2329  # the step functions run by name, in `bash -c` under `timeout`
set -uo pipefail
cd "$(dirname "$0")/.." || exit 2
REPO=$PWD

usage() { sed -n '2,7p' "$0" | sed 's/^# \{0,1\}//'; }

fetch_wheels() {
    local py=${PYTHON:-python3} wheels
    wheels=$(PYTHONPATH=$REPO "$py" -m bench.gpu_image wheels) || return 1
    # shellcheck disable=SC2086  # one argument per wheel
    "$py" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
        --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 \
        --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
        --platform manylinux1_x86_64 -d .whl $wheels || return 1
    check_wheels
}

# Each of bench/gpu_image.py's wheels once in .whl/ and nothing else (two versions of one stop
# the install), and their size with the tree (the device call takes 64 MiB in all).
check_wheels() {
    local bad=0 name version file expected tree whl
    expected=$(PYTHONPATH=$REPO "${PYTHON:-python3}" -m bench.gpu_image wheels | tr 'A-Z-' 'a-z_')
    while IFS='=' read -r name _ version; do
        if ! compgen -G ".whl/$name-$version-*.whl" >/dev/null; then
            echo "missing wheel: $name==$version"
            bad=1
        fi
    done <<<"$expected"
    for file in .whl/*.whl; do
        [[ -f $file ]] || continue
        name=$(basename "$file" | cut -d- -f1 | tr 'A-Z-' 'a-z_')
        version=$(basename "$file" | cut -d- -f2)
        if ! grep -qx "$name==$version" <<<"$expected"; then
            echo "wheel not in bench/gpu_image.py (remove it): $file"
            bad=1
        fi
    done
    whl=$(du -cb .whl/*.whl 2>/dev/null | tail -1 | cut -f1)
    tree=$(git ls-files -co --exclude-standard -z | xargs -0 du -cb 2>/dev/null | tail -1 | cut -f1)
    echo "wheels: $(find .whl -maxdepth 1 -type f -name '*.whl' | wc -l) files," \
        "$((${whl:-0} / 1024)) KiB; with the tree $(((${whl:-0} + ${tree:-0}) / 1024)) KiB of the" \
        "device call's 65536"
    return "$bad"
}

llama_of() {  # llama_of D LAYERS HEADS KV_HEADS FFN VOCAB CONTEXT: a transformers llama config
    printf '{"model_type":"llama","hidden_size":%s,"num_hidden_layers":%s,' "$1" "$2"
    printf '"num_attention_heads":%s,"num_key_value_heads":%s,"intermediate_size":%s,' "$3" "$4" "$5"
    printf '"vocab_size":%s,"max_position_embeddings":%s}' "$6" "$7"
}

MODE=gpu
case "${1:-}" in
    --fetch-wheels) fetch_wheels; exit ;;
    --dry-run) MODE=dry-run ;;
    "") ;;
    -h | --help) usage; exit 0 ;;
    *) usage >&2; exit 2 ;;
esac

OUT=${OUT:-/tmp/gpu-out}
WORK=$(mktemp -d "${TMPDIR:-/tmp}/trainctl-gpu.XXXXXX")
STEPS_DIR=$WORK/steps
mkdir -p "$OUT" "$STEPS_DIR"
exec > >(tee -a "$OUT/gpu.log") 2>&1
TEE=$!
BUDGET=${GPU_BUDGET:-330}
DEADLINE=$((SECONDS + BUDGET))
BENCH_STEPS=${BENCH_STEPS:-10}
BENCH_WARMUP=${BENCH_WARMUP:-3}
export MODE OUT WORK STEPS_DIR REPO BENCH_STEPS BENCH_WARMUP PYTHONUNBUFFERED=1
# Steps after the first compile find inductor's cache (same micro-batch shapes).
export TORCHINDUCTOR_CACHE_DIR=${TORCHINDUCTOR_CACHE_DIR:-/tmp/trainctl-inductor}
echo "bench/gpu.sh $MODE, $(date -u +%FT%TZ), budget ${BUDGET} s, work folder $WORK, out $OUT"

if [[ $MODE == dry-run ]]; then
    PY=${PYTHON:-$( [[ -x .venv/bin/python ]] && echo .venv/bin/python || echo python3)}
    if [[ -d .whl ]]; then
        check_wheels || echo "(bench/gpu.sh --fetch-wheels fetches them)"
    else
        echo "no .whl/ here: bench/gpu.sh --fetch-wheels fetches the wheels the device needs"
    fi
    # Only what the device will have imports: the image's distributions and the wheels.
    PYTHONPATH=$REPO "$PY" -m bench.gpu_image blocker "$WORK/image" || exit 1
    export PYTHONPATH=$WORK/image:$REPO
    # The sizes of a few seconds a step on two cores.
    BENCH_ARGS="--device cpu --preset tiny --micro-batch-size 2 --grad-accum-steps 2 --seq-len 64 --no-compile"
    LLAMA_ARGS="--device cpu --micro-batch-size 2 --grad-accum-steps 2 --seq-len 64 --no-compile"
    LLAMA=$(llama_of 64 2 4 2 128 512 128)  # tiny's shape
    BENCH_STEPS=3 BENCH_WARMUP=1
    TRAIN_ARGS="--device cpu --preset tiny --steps 6 --resume-steps 3 --seq-len 128 --no-compile"
    CHECKPOINT_ARGS=--quick
    FSDP_ARGS="--device cpu --steps 3 --seq-len 64 --micro-batch-size 2"
    FSDP_SMALL=tiny
else
    PY=${PYTHON:-python3}
    SITE=/tmp/trainctl-site
    if compgen -G ".whl/*.whl" >/dev/null; then
        "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
            --target "$SITE" .whl/*.whl || echo "installing the wheels failed"
    fi
    export PYTHONPATH=$REPO:$SITE
    if ! "$PY" -c "import pydantic, sqlalchemy, fastapi" 2>/dev/null; then
        echo "pydantic, sqlalchemy or fastapi missing: run bench/gpu.sh --fetch-wheels where" \
            "there is network, and carry .whl"
    fi
    if ! "$PY" -c "import torch, sys; sys.exit(not torch.cuda.is_available())"; then
        echo "no CUDA device here: bench/gpu.sh --dry-run is the CPU check"
        exit 2
    fi
    BENCH_ARGS=""  # the CUDA benchmark profile: base, 4 x 8, seq 4096, compile, bf16
    LLAMA_ARGS=""  # the same profile's batch and compile
    LLAMA=$(llama_of 1024 24 16 4 3840 64000 4096)  # base's shape (store/models/presets.py)
    TRAIN_ARGS="--device cuda --preset base --steps 50 --resume-steps 10 --seq-len 4096"
    CHECKPOINT_ARGS=""
    FSDP_ARGS="--device cuda --steps 20 --seq-len 4096 --micro-batch-size 1"
    FSDP_SMALL=1b
fi
export PY BENCH_ARGS LLAMA_ARGS LLAMA BENCH_STEPS BENCH_WARMUP TRAIN_ARGS CHECKPOINT_ARGS \
    FSDP_ARGS FSDP_SMALL

# --- the steps: each runs in its own bash under `timeout`, its output in $STEPS_DIR/NAME.log --

skip() {  # skip REASON: the step did not run, and why
    echo "$*" >"$STEPS_DIR/$STEP.skipped"
    echo "skipped: $*"
    exit 77
}

step_env() {
    "$PY" - >"$STEPS_DIR/env.json" <<'EOF'
import json, os, platform, shutil, subprocess
import torch
info = {"python": platform.python_version(), "torch": torch.__version__,
        "cuda": torch.version.cuda, "cuda_available": torch.cuda.is_available(),
        "device": torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu",
        "cpus": len(os.sched_getaffinity(0)), "threads": torch.get_num_threads(),
        "disk_free_gib": round(shutil.disk_usage("/tmp").free / 2**30, 1)}
for name in ("transformers", "pydantic", "sqlalchemy", "fastapi", "safetensors", "numpy"):
    try:
        info[name] = __import__(name).__version__
    except Exception as exc:
        info[name] = f"not importable: {exc}"
if shutil.which("nvidia-smi"):
    info["nvidia_smi"] = subprocess.run(
        ["nvidia-smi", "--query-gpu=name,memory.total,driver_version,clocks.max.sm",
         "--format=csv,noheader"], capture_output=True, text=True).stdout.strip()
print(json.dumps(info))
EOF
    cat "$STEPS_DIR/env.json"
}

step_pytest_gpu() {
    local files
    mapfile -t files < <(grep -rl --include='test_*.py' 'mark.gpu' tests | sort)
    echo "gpu tests in: ${files[*]}"
    [[ $MODE == dry-run ]] && echo "(on the CPU every gpu test skips: 'needs a CUDA device')"
    # The plug-ins the tests use, named: the image's others (and, in the dry run, this
    # machine's) stay out, as they are no part of the tests.
    PYTEST_DISABLE_PLUGIN_AUTOLOAD=1 "$PY" -m pytest -m gpu -p pytest_timeout -p no:cacheprovider \
        -v -rA --timeout=300 --junitxml="$STEPS_DIR/pytest_gpu.xml" "${files[@]}"
}

bench_trainctl() {  # bench_trainctl NAME [ARG ...]: the worker's benchmark, JSON to NAME.json
    local name=$1
    shift
    # shellcheck disable=SC2086  # BENCH_ARGS is a list of flags
    "$PY" -m trainctl.worker.kinds.benchmark --steps "$BENCH_STEPS" --warmup-steps "$BENCH_WARMUP" \
        $BENCH_ARGS "$@" --json >"$STEPS_DIR/$name.json" || return
    cat "$STEPS_DIR/$name.json"
}

step_bench_trainctl() { bench_trainctl bench_trainctl; }

step_bench_trainctl_default() {
    [[ $(status_of bench_trainctl) == failed ]] || skip "bench_trainctl did not fail: no fallback"
    [[ $MODE == dry-run ]] && skip "dry run: nothing is compiled on the CPU"
    bench_trainctl bench_trainctl --compile-mode default
}

step_bench_peer() {
    # shellcheck disable=SC2086
    "$PY" -m bench.gpu_peer --steps "$BENCH_STEPS" --warmup-steps "$BENCH_WARMUP" $BENCH_ARGS \
        >"$STEPS_DIR/bench_peer.json" || return
    cat "$STEPS_DIR/bench_peer.json"
}

step_checkpoint_io() {
    # shellcheck disable=SC2086
    "$PY" -m bench --only checkpoint_io $CHECKPOINT_ARGS --json "$STEPS_DIR/checkpoint_io.json"
}

step_train_resume() {
    # shellcheck disable=SC2086
    "$PY" -m bench.gpu_train --json "$STEPS_DIR/train_resume.json" --logs "$STEPS_DIR/train" \
        --data-dir "$WORK/train-data" --timeout 600 $TRAIN_ARGS
}

fsdp_train() {  # fsdp_train NAME [ARG ...]: bench.fsdp_train, JSON to NAME.json; skip if too large
    local name=$1 rc=0
    shift
    # shellcheck disable=SC2086  # FSDP_ARGS is a list of flags
    "$PY" -m bench.fsdp_train --json "$STEPS_DIR/$name.json" $FSDP_ARGS "$@" || rc=$?
    [[ $rc == 3 ]] && skip "the store's estimate does not fit this GPU: $(cat "$STEPS_DIR/$name.json")"
    return "$rc"
}

step_fsdp_1b() { fsdp_train fsdp_1b --preset "$FSDP_SMALL"; }

step_fsdp_8b() {
    # Sharded over every GPU of the node. On one GPU nothing is divided: the store estimates
    # about 118 GiB (activation checkpointing on), so it runs on an H200 and skips, saying
    # why, on an 80 GiB GPU.
    [[ $MODE == dry-run ]] && skip "dry run: fsdp_1b ran the same path at tiny sizes"
    local gpus
    gpus=$("$PY" -c "import torch; print(torch.cuda.device_count())")
    fsdp_train fsdp_8b --preset 8b --nproc "$gpus"
}

step_llama_base() {
    # A transformers llama of base's shape (docs/models.md) through the same benchmark.
    # shellcheck disable=SC2086  # LLAMA_ARGS is a list of flags
    "$PY" -m trainctl.worker.kinds.benchmark --steps "$BENCH_STEPS" --warmup-steps "$BENCH_WARMUP" \
        $LLAMA_ARGS --hf "$LLAMA" --json >"$STEPS_DIR/llama_base.json" || return
    cat "$STEPS_DIR/llama_base.json"
}

status_of() {  # the status a step ended with (empty before it ran)
    sed -n 's/.*"status": "\([a-z]*\)".*/\1/p' "$STEPS_DIR/$1.status" 2>/dev/null
}

export -f skip status_of step_env step_pytest_gpu bench_trainctl step_bench_trainctl \
    step_bench_trainctl_default step_bench_peer step_checkpoint_io step_train_resume \
    fsdp_train step_fsdp_1b step_fsdp_8b step_llama_base

ORDER=0
record() {  # record NAME STATUS RC SECONDS REASON
    ORDER=$((ORDER + 1))
    "$PY" -c 'import json, sys
n, s, rc, sec, why, order = sys.argv[1:]
print(json.dumps({"status": s, "rc": int(rc), "seconds": int(sec), "reason": why, "order": int(order)}))' \
        "$1" "$2" "$3" "$4" "$5" "$ORDER" >"$STEPS_DIR/$1.status"
}

finish() {  # the summary and the archive, after every step and at the end
    "$PY" -m bench.gpu_summary "$STEPS_DIR" --mode "$MODE" --json "$OUT/summary.json" \
        >"$OUT/summary.txt" 2>&1
    tar czf "$OUT/steps.tar.gz.part" -C "$STEPS_DIR" . && mv "$OUT/steps.tar.gz.part" "$OUT/steps.tar.gz"
}

FAILED=0
run_step() {  # run_step NAME SECONDS
    local name=$1 limit=$2 left started rc status reason=""
    if [[ -n ${GPU_STEPS:-} && " $GPU_STEPS " != *" $name "* ]]; then
        return
    fi
    left=$((DEADLINE - SECONDS))
    ((limit > left)) && limit=$left
    echo
    if ((limit < 20)); then
        echo "== $name: not run, ${left} s left of GPU_BUDGET=${BUDGET}"
        record "$name" not_run 0 0 "no time left in GPU_BUDGET (${BUDGET} s)"
        FAILED=1
        finish
        return
    fi
    echo "== $name (timeout ${limit} s)"
    started=$SECONDS
    STEP=$name timeout -k 20 "$limit" bash -c "set -o pipefail; step_$name" >"$STEPS_DIR/$name.log" 2>&1
    rc=$?
    case $rc in
        0) status=ok ;;
        77) status=skipped reason=$(cat "$STEPS_DIR/$name.skipped" 2>/dev/null) ;;
        124 | 137) status=timeout reason="ran past its ${limit} s" ;;
        *) status=failed reason="exit code $rc" ;;
    esac
    if [[ $status == ok || $status == skipped ]]; then
        tail -n 4 "$STEPS_DIR/$name.log" | cut -c1-300
    else
        FAILED=1
        tail -n 25 "$STEPS_DIR/$name.log" | cut -c1-300
    fi
    echo "-- $name: $status after $((SECONDS - started)) s${reason:+ ($reason)}"
    record "$name" "$status" "$rc" "$((SECONDS - started))" "$reason"
    finish
}
run_step env 60
run_step pytest_gpu 150
run_step bench_trainctl 170
run_step bench_trainctl_default 150
run_step bench_peer 140
run_step checkpoint_io 100
run_step train_resume 240
run_step fsdp_1b 120
run_step fsdp_8b 150
run_step llama_base 60

finish
echo
cat "$OUT/summary.txt"
# Steps to run again: all but those that ran or skipped on purpose (slots, fallbacks).
not_done=$(for f in "$STEPS_DIR"/*.status; do
    n=$(basename "$f" .status)
    case $(status_of "$n") in
        ok | skipped) ;;
        *) echo "$n" ;;
    esac
done | tr '\n' ' ')
if [[ -n ${not_done// /} ]]; then
    echo
    echo "to rerun what did not finish: GPU_STEPS=\"${not_done% }\" bash bench/gpu.sh"
fi
rm -rf "$WORK"
exec >&- 2>&-
wait "$TEE"
exit "$FAILED"
