"""The paper's and the community report's claims, written once: what each says, its figure, its source,
and the chapters that check it.

Chapters 7 and 9 fill in this book's figure for the claims they can measure and render them with
``table``; chapter 13 prints ``index_table`` (every claim, where it is checked), so one list holds every
claim and no two chapters word one claim differently.

    from muongrid.lab.claims import table
    display(Markdown(table({"state_half": ("50%", "`bench.py --sweep`", "Agrees exactly.")})))
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Claim:
    source: str        # who claims it (the citation key is in CITES)
    text: str          # what they claim, in this book's words
    figure: str        # their figure
    checked_in: tuple  # the chapters (documents) that check it, in book order


CITES = {"Paper": "liu2025muonscalable", "Report": "wei2025muonreproducibility",
         "Tutorial": "wei2025muontutorial"}

CLAIMS = {
    "comm_bound": Claim("Paper", "Muon's communication is (1, 1.25] x AdamW's", "1.25 upper bound",
                        ("06_communication", "07_profiling", "08_beyond_poc")),
    "optimizer_share": Claim("Paper", "the optimizer is 1-3% of the step (the report: 1.1%)", "1-3%, 1.1%",
                             ("07_profiling", "09_training")),
    "state_half": Claim("Paper", "Muon's state is half of AdamW's (the report agrees)", "50%",
                        ("02_distributed_map", "07_profiling")),
    "comm_time": Claim("Report", "Muon's communication time is 0.57 x AdamW's at DP2 x TP2", "0.57x",
                       ("07_profiling",)),
    "step_ratio": Claim("Report", "Muon's step is 1.15 x AdamW's", "1.15x", ("07_profiling", "09_training")),
    "fastest_grid": Claim("Report", "DP2 x TP2 is the fastest of DP4, TP4 and DP2 x TP2", "DP2xTP2",
                          ("07_profiling", "09_training")),
    "naive_async": Claim("Report", "naive async_op=True makes the collectives slower", "Muon 2.1x, AdamW 1.5x",
                         ("07_profiling", "08_beyond_poc")),
    "half_compute": Claim("Paper", "Muon needs about half of AdamW's compute for the same loss", "~0.5",
                          ("09_training",)),
    "loss_gap": Claim("Tutorial", "Muon's loss is 34% below AdamW's (MNIST, 3 epochs)", "34%",
                      ("09_training",)),
}


def _claim(key: str) -> str:
    c = CLAIMS[key]
    return f"{c.source}: {c.text}"


def table(rows: dict[str, tuple[str, str, str]]) -> str:
    """A Markdown table of the claims in ``rows`` (key -> (this book's figure, command, why they differ)),
    in the order of ``CLAIMS``, each with its source's figure."""
    unknown = sorted(set(rows) - set(CLAIMS))
    if unknown:
        raise KeyError(f"no such claim {unknown}; the claims are {list(CLAIMS)}")
    out = ["| claim | their figure | this book's figure (command) | why they differ |", "|---|---|---|---|"]
    out += [f"| {_claim(k)} | {CLAIMS[k].figure} | {rows[k][0]} ({rows[k][1]}) | {rows[k][2]} |"
            for k in CLAIMS if k in rows]
    return "\n".join(out)


def index_table() -> str:
    """Every claim, its source's figure and the chapters that check it (MyST links), as Markdown."""
    out = ["| claim | their figure | source | checked in |", "|---|---|---|---|"]
    for c in CLAIMS.values():
        where = ", ".join(f"{{doc}}`{doc.split('_')[0].lstrip('0') or '0'} <{doc}>`" for doc in c.checked_in)
        out.append(f"| {c.text} | {c.figure} | {{cite:t}}`{CITES[c.source]}` | chapter{'s' if len(c.checked_in) > 1 else ''} {where} |")
    return "\n".join(out)
