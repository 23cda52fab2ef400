"""Mutation testing of the engine's math, plan and route modules with cosmic-ray (``make mutate``, issue 41).

    make mutate                                   # every module below, in a copy of the working tree
    .venv/bin/python tests/mutate_run.py updates  # one module
    .venv/bin/python tests/mutate_run.py --sample 100 updates plan   # 100 mutants per module, drawn with seed 41

cosmic-ray mutates the source file in place, one mutant at a time, and runs a test command against it; so this
runs in a copy of the working tree (``/tmp/muongrid-mutate-<module>``, never the checkout others are using),
with ``PYTHONPATH`` pointing at the copy's ``scripts/``. Each module has the fast tests that are meant to kill
its mutants (no multi-process launches: one launch per mutant would take hours). Mutants are restricted to
the functions listed (the math, the plan's geometry, the routes) and to operators that make sense on
numbers: a ``+`` turned into ``|``, ``<<`` or ``%`` is left out (cosmic-ray makes ten replacements per
operator; those raise on floats or are killed by anything), nor is a ``|`` in a type annotation (``X | None``,
never evaluated here: an equivalent mutant). ``--head`` mutates the last commit instead of the working tree. Prints, per module, killed / total and every
surviving mutant's diff (also written to ``_build/mutate/<module>.txt``).
"""
from __future__ import annotations

import random
import re
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
TESTS_FAST = "tests/test_oracle.py tests/test_precision.py tests/test_routes.py"   # fastest killers first (-x)
MODULES = {   # module: (test files, functions to mutate; None = all)
    "updates": (f"{TESTS_FAST} tests/test_math.py tests/test_finite_modes.py tests/test_capturable.py "
                "tests/test_replay.py", None),   # finite: the masked step; capturable, replay: the device twins
    "plan": ("tests/test_routes.py tests/test_plan.py tests/test_fast_plan.py tests/test_oracle.py",
             {"numel", "local_numel", "param_slice", "shard_numel", "shard_range", "segments", "shard_slice",
              "piece_slice", "piece_numel", "tp_local_shape", "split_into_buckets", "build_plan", "piece_runs"}),
    "owner_routes": (TESTS_FAST, {"piece_of", "route", "exchange_chunks", "exchanges", "messages"}),
    "group_routes": (TESTS_FAST, {"sends"}),   # who sends to an owner or a member (owner_routes' routes)
}
SKIPPED_TARGETS = ("BitOr", "BitAnd", "BitXor", "LShift", "RShift", "Mod", "Pow")


def config(module: str, tests: str) -> str:
    return f"""[cosmic-ray]
module-path = "scripts/muongrid/{module}.py"
timeout = 60.0
excluded-modules = []
test-command = "{BIN / 'python'} -m pytest -x -q -p no:cacheprovider --noconftest {tests}"

[cosmic-ray.distributor]
name = "local"
"""


def annotation(line: str) -> bool:
    """Whether a ``|`` on this line is a type union (``X | None``): under ``from __future__ import annotations``
    it is never evaluated, so replacing it makes an equivalent mutant."""
    return re.search(r"[\w\]]\s*\|\s*None\b", line) is not None


def run(module: str, sample: int | None = None, head: bool = False) -> tuple[int, int, list[str]]:
    tests, functions = MODULES[module]
    work = Path(f"/tmp/muongrid-mutate-{module}")
    shutil.rmtree(work, ignore_errors=True)
    if head:   # the committed tree (git archive HEAD), not the working tree
        work.mkdir(parents=True)
        archive = subprocess.run(["git", "archive", "HEAD"], cwd=ROOT, capture_output=True, check=True).stdout
        subprocess.run(["tar", "-x", "-C", str(work)], input=archive, check=True)
    else:
        shutil.copytree(ROOT, work, ignore=shutil.ignore_patterns(".git", ".venv", "_build", "mutants", "__pycache__",
                                                                  "*.ipynb", "node_modules"))
    (work / "mutate.toml").write_text(config(module, tests))
    env0 = dict(__import__("os").environ, PYTHONPATH=str(work / "scripts"))
    base = subprocess.run([str(BIN / "python"), "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", "--noconftest",
                           *tests.split()], cwd=work, env=env0, capture_output=True, text=True)
    if base.returncode != 0:   # a failing baseline would count every mutant as killed
        raise SystemExit(f"{module}: the tests fail without any mutant:\n{base.stdout[-3000:]}")
    session = work / "session.sqlite"
    env = dict(__import__("os").environ, PYTHONPATH=str(work / "scripts"), OMP_NUM_THREADS="1")
    subprocess.run([str(BIN / "cosmic-ray"), "init", "mutate.toml", str(session)], cwd=work, env=env, check=True)
    db = sqlite3.connect(session)
    specs = db.execute("select job_id, operator_name, definition_name, start_pos_row from mutation_specs").fetchall()
    lines = (work / "scripts" / "muongrid" / f"{module}.py").read_text().splitlines()
    drop = [j for j, op, fn, row in specs
            if (functions is not None and fn not in functions) or op.split("_")[-1] in SKIPPED_TARGETS
            or (op.startswith("core/ReplaceBinaryOperator_BitOr_") and annotation(lines[row - 1]))]
    kept = sorted({j for j, *_ in specs} - set(drop))
    specs = [x[:3] for x in specs]
    if sample is not None and sample < len(kept):
        chosen = set(random.Random(41).sample(kept, sample))
        drop += [j for j in kept if j not in chosen]
    db.executemany("delete from mutation_specs where job_id = ?", [(j,) for j in drop])
    db.executemany("delete from work_items where job_id = ?", [(j,) for j in drop])
    db.commit()
    total = len(specs) - len(drop)
    print(f"{module}: {total} mutants (of {len(specs)}{'' if sample is None else f', a sample of {sample}'}) "
          f"against {tests}", flush=True)
    subprocess.run([str(BIN / "cosmic-ray"), "exec", "mutate.toml", str(session)], cwd=work, env=env, check=True)
    rows = db.execute("select r.test_outcome, r.worker_outcome, r.diff, s.definition_name, s.operator_name "
                      "from work_results r join mutation_specs s using (job_id)").fetchall()
    # cosmic-ray 8 writes outcomes in capitals (KILLED/SURVIVED, NORMAL/TIMEOUT/...): a timeout counts as killed
    killed = sum(1 for outcome, worker, *_ in rows if outcome.lower() == "killed" or worker.lower() == "timeout")
    survivors = [f"--- {fn} {op}\n{diff}" for outcome, worker, diff, fn, op in rows
                 if outcome.lower() == "survived" and worker.lower() != "timeout"]
    out = ROOT / "_build" / "mutate" / f"{module}.txt"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(f"{module}: killed {killed} of {len(rows)}\n\n" + "\n".join(survivors))
    db.close()
    shutil.copy(session, out.with_suffix(".sqlite"))   # every mutant's outcome and test output, kept
    shutil.rmtree(work, ignore_errors=True)
    return killed, len(rows), survivors


def main(argv: list[str]) -> int:
    import argparse
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("modules", nargs="*", choices=[*MODULES, []], default=list(MODULES))
    p.add_argument("--sample", type=int, default=None, help="mutants per module, drawn with a fixed seed (default all)")
    p.add_argument("--head", action="store_true", help="mutate the last commit, not the working tree")
    args = p.parse_args(argv)
    scores = {}
    for name in args.modules or list(MODULES):
        killed, total, survivors = run(name, args.sample, args.head)
        scores[name] = (killed, total)
        print(f"{name}: killed {killed} of {total} ({100 * killed / max(total, 1):.0f}%); "
              f"{len(survivors)} survived (_build/mutate/{name}.txt)", flush=True)
    for name, (killed, total) in scores.items():
        print(f"mutation score {name}: {killed}/{total} = {100 * killed / max(total, 1):.0f}%")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
