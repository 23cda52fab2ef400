"""Calibrate the time model (``muongrid/lab/timemodel.py``) on this machine and record it with its provenance.

    python scripts/calibrate_time_model.py --out book/data/time_model_cpu.json

Runs two existing measurements as they are, one after the other, and keeps their JSON results:

* ``scripts/ns_speed.py --size 1024``: the matmul rate of the dtype Newton-Schulz computes in here and
  Newton-Schulz's own rate as a fraction of it (the profile's ``flops`` and ``efficiency``);
* ``scripts/measure_links.py --dp 4``: gloo all-gathers over 4 ranks on this machine, fitted to the
  alpha-beta model (the profile's per-hop latency ``alpha`` and bandwidth ``beta``).

The profile it writes says what the model assumes on top: every rank on one machine (one link kind),
a reduce-scatter priced as the ring's (``Comm`` runs an all-to-all on gloo, not gloo's all-reduce), and the
machine's cores shared by all ranks (so a rank's
matmul rate is the measured one divided by the ranks that compute at once). The measurement is small
and taken once; the file records the load average beside it, because a busy machine measures slower.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path


from muongrid.lab.notebook import last_json
from muongrid.lab.provenance import provenance

SCRIPTS = Path(__file__).resolve().parent
MEASUREMENTS = {"ns_speed": ["ns_speed.py", "--size", "1024", "--repeats", "5"],
                "links": ["measure_links.py", "--dp", "4", "--points", "8", "--reps", "5"]}


def measure(args: list[str]) -> dict:
    proc = subprocess.run([sys.executable, str(SCRIPTS / args[0]), *args[1:]], capture_output=True, text=True,
                          env=dict(os.environ, PYTHONPATH=str(SCRIPTS)), timeout=900)
    if proc.returncode:
        raise RuntimeError(f"{' '.join(args)} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
    print(proc.stdout, end="")
    return dict(command="python scripts/" + " ".join(args), result=last_json(proc.stdout))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, required=True, help="where to write the JSON record")
    args = p.parse_args(argv)
    load_before = os.getloadavg()
    runs = {name: measure(cmd) for name, cmd in MEASUREMENTS.items()}
    ns, links = runs["ns_speed"]["result"], runs["links"]["result"]
    if links["beta_bytes_per_s"] is None:
        raise SystemExit("measure_links.py could not resolve the bandwidth: rerun on a quieter machine")
    link = [links["alpha_s"], links["beta_bytes_per_s"]]
    profile = dict(name="this machine (CPU, gloo)", flops=ns["matmul_gflops"] * 1e9, efficiency=min(ns["ratio"], 1.0),
                   ranks_per_node=None, intra=link, inter=link, reduce_scatter_as_all_reduce=False,
                   shared_cores=True, matmul_dtype=ns["matmul_dtype"], native_bf16=ns["native_bf16"],
                   link_ranks=links["ranks"])
    record = dict(provenance(sys.argv), load_average_before=load_before, load_average_after=os.getloadavg(),
                  profile=profile, measurements=runs)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(record, indent=1) + "\n")
    print(f"wrote {args.out}: {profile['flops'] / 1e9:.1f} GFLOP/s x {profile['efficiency']:.2f}, "
          f"alpha {link[0] * 1e6:.0f} us, beta {link[1] / 1e9:.2f} GB/s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
