#!/usr/bin/env bash
# The GPU path end to end on one node, under torchrun with NCCL, recorded with provenance.
#
#     bash scripts/gpu_smoke.sh                 # needs >= 4 CUDA GPUs; writes book/data/gpu_smoke.json
#     GPU_SMOKE_OUT=/tmp/x.json bash scripts/gpu_smoke.sh
#
# Steps (each runs even if an earlier one failed; the exit code is 1 if any failed):
#   verify       2x2, every layout (bucket, owner, aligned), against the single-device reference
#   save/resume  train.py 2x2 with --save and --resume when train.py has them (else verify.py's checkpoint:
#                saved on 2x2 bucket, resumed on 4x1 owner, checked against an uninterrupted reference)
#   fsdp         train.py --fsdp, one layer (4 Muon matrices) on more ranks than that: 3x2 or 4x2 (needs 6+ GPUs;
#                skipped and said so on a 4-GPU node)
#   bench        bench.py 2x2, Muon (bucket, owner) against AdamW, ledger times from CUDA events
# On a machine without enough GPUs it refuses at once (exit 2) and changes nothing.
set -u
cd "$(dirname "$0")/.."
PY=${PYTHON:-python}
OUT=${GPU_SMOKE_OUT:-book/data/gpu_smoke.json}

NGPU=$("$PY" -c "import torch; print(torch.cuda.device_count() if torch.cuda.is_available() else 0)" 2>/dev/null || echo 0)
if [ "${NGPU:-0}" -lt 4 ]; then
    echo "gpu_smoke.sh: needs at least 4 CUDA GPUs on this node, found ${NGPU:-0} (torch.cuda.is_available() is" \
         "false or too few devices); nothing was run. Run it on a GPU node; on a CPU the same checks run on the" \
         "meta device in tests/test_meta_device.py." >&2
    exit 2
fi

WORK=$(mktemp -d "${TMPDIR:-/tmp}/muongrid-gpu-smoke.XXXXXX")
trap 'rm -rf "$WORK"' EXIT
STEPS=()
FAILED=0

run() {  # run NAME CMD...: stdout+stderr to $WORK/NAME.log, the command and exit code to $WORK/NAME.meta
    local name=$1; shift
    echo "== $name: $*"
    "$@" > "$WORK/$name.log" 2>&1
    local rc=$?
    printf '%s\n%s\n' "$rc" "$*" > "$WORK/$name.meta"
    tail -n 3 "$WORK/$name.log"
    [ "$rc" -eq 0 ] || { echo "   -> $name failed (exit $rc)"; FAILED=1; }
    STEPS+=("$name")
}

TR=(torchrun --standalone --nproc-per-node)

run verify_2x2 "${TR[@]}" 4 scripts/verify.py --dp 2 --tp 2 --layout bucket,owner,aligned --steps 3

if "$PY" scripts/train.py --help 2>/dev/null | grep -q -- "--resume"; then
    run train_save_2x2 "${TR[@]}" 4 scripts/train.py --dp 2 --tp 2 --steps 20 --eval-every 10 --save "$WORK/ckpt"
    run train_resume_2x2 "${TR[@]}" 4 scripts/train.py --dp 2 --tp 2 --steps 10 --eval-every 10 --resume "$WORK/ckpt"
else
    run train_2x2 "${TR[@]}" 4 scripts/train.py --dp 2 --tp 2 --steps 20 --eval-every 10
    run checkpoint_save_2x2 "${TR[@]}" 4 scripts/verify.py --dp 2 --tp 2 --steps 2 --save "$WORK/ckpt"
    run checkpoint_resume_4x1 "${TR[@]}" 4 scripts/verify.py --dp 4 --tp 1 --layout owner --steps 2 --resume "$WORK/ckpt"
fi

if [ "$NGPU" -ge 8 ]; then FSDP=(4 2); elif [ "$NGPU" -ge 6 ]; then FSDP=(3 2); else FSDP=(); fi
if [ ${#FSDP[@]} -eq 2 ]; then
    run fsdp_more_ranks_than_matrices "${TR[@]}" $((FSDP[0] * FSDP[1])) scripts/train.py --fsdp --dp "${FSDP[0]}" \
        --tp "${FSDP[1]}" --layers 1 --heads 2 --batch 24 --steps 10 --eval-every 10
else
    echo "== fsdp_more_ranks_than_matrices: skipped, needs 6 or more GPUs (one layer has 4 Muon matrices)"
fi

run bench_2x2 "${TR[@]}" 4 scripts/bench.py --dp 2 --tp 2 --layout bucket,owner --steps 10 --warmup 3

"$PY" - "$WORK" "$OUT" "$NGPU" "${STEPS[@]}" <<'EOF'
import json, sys
from pathlib import Path
sys.path.insert(0, "scripts")
import torch
from muongrid.lab.provenance import provenance

work, out, ngpu, steps = Path(sys.argv[1]), Path(sys.argv[2]), int(sys.argv[3]), sys.argv[4:]
record = dict(provenance(["scripts/gpu_smoke.sh"]), gpus=ngpu, gpu=torch.cuda.get_device_name(0),
              cuda=torch.version.cuda, nccl=".".join(map(str, torch.cuda.nccl.version())), steps={})
record["command"] = "bash scripts/gpu_smoke.sh"
for name in steps:
    rc, command = (work / f"{name}.meta").read_text().splitlines()[:2]
    log = (work / f"{name}.log").read_text(errors="replace")
    results = [json.loads(line) for line in log.splitlines() if line.startswith("{")]
    record["steps"][name] = dict(command=command, exit_code=int(rc), result=results[-1] if results else None,
                                 log_tail=log.splitlines()[-20:])
record["ok"] = all(s["exit_code"] == 0 for s in record["steps"].values())
out.parent.mkdir(parents=True, exist_ok=True)
out.write_text(json.dumps(record, indent=1) + "\n")
print(f"wrote {out}: {'all steps passed' if record['ok'] else 'some steps FAILED'}")
EOF
exit $FAILED
