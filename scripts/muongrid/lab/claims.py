"""The paper's and the community report's claims, written once: what each says, its figure, its source,
and the chapters that check it.

The book shows them once, in its claims appendix (``book/claims.md``): every claim with its authors'
figure and, under it, what each chapter that measures it found. Chapters 7 and 9 measure; each hands its
findings over with ``glue_checks`` (a record that the chapter's readers do not see, in a folded cell), and the appendix's ``{claims-appendix}``
directive (``book/_ext/claims.py``) lays them out with ``appendix_markdown``, pasting each chapter's
finding from its executed page. ``table`` renders findings as one Markdown table; ``index_table`` lists
every claim and where it is checked. So one list holds every claim and no two pages word one differently.

    from muongrid.lab import claims
    claims.glue_checks("07_profiling", {"state_half": ("50%", "bench.py --sweep", "Agrees exactly."), ...})
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


# The chapters that measure claims and hand their findings to the appendix (``glue_checks``): each must
# hand over every claim whose ``checked_in`` names it, and the appendix pastes exactly those.
MEASURED_IN = ("07_profiling", "09_training")


def chapter_label(doc: str) -> str:
    """``"07_profiling"`` -> ``"chapter 7"``."""
    return f"chapter {int(doc.split('_')[0])}"


def glue_key(key: str) -> str:
    return f"claim-{key.replace('_', '-')}"


def measured_by(doc: str) -> list[str]:
    """The claims chapter ``doc`` measures, in the order of ``CLAIMS``."""
    return [k for k, c in CLAIMS.items() if doc in c.checked_in]


def finding_html(figure: str, command: str, why: str) -> str:
    """One chapter's finding on a claim, as the appendix shows it: its figure, the command, the verdict."""
    from html import escape
    return f"{escape(figure)} (<code>{escape(command)}</code>). {escape(why)}"


def glue_checks(doc: str, rows: dict[str, tuple[str, str, str]]) -> None:
    """Hand chapter ``doc``'s findings (claim key -> (this book's figure, command, why they differ)) to the
    claims appendix: each is glued as ``claim-<key>`` for the appendix to paste. ``rows`` must hold every
    claim this chapter checks (``measured_by``), no more: the appendix pastes exactly those."""
    from IPython.display import HTML

    if doc not in MEASURED_IN:
        raise ValueError(f"{doc} is not among the chapters the appendix pastes from: {MEASURED_IN}")
    want, got = measured_by(doc), set(rows)
    if got != set(want):
        raise KeyError(f"{doc} checks {want} (CLAIMS' checked_in); given {sorted(got)}: "
                       f"missing {sorted(set(want) - got)}, unknown {sorted(got - set(want))}")
    for key in want:
        record(glue_key(key), HTML(finding_html(*rows[key])))


# MyST-NB's glue format (``myst_nb.glue(name, obj, display=False)``), written here so a chapter runs
# where MyST-NB is not installed (Colab): a display output whose MIME types carry this prefix, which
# Jupyter and Colab do not render, and which the book's ``{glue:any}`` role finds by its name.
RECORD_PREFIX = "application/papermill.record/"


def record(name: str, obj) -> None:
    """Store ``obj``'s display form under ``name`` in this cell's outputs, for another page to paste."""
    from IPython.core.formatters import format_display_data
    from IPython.display import display

    bundle, metadata = format_display_data(obj)
    metadata["scrapbook"] = {"name": name, "mime_prefix": RECORD_PREFIX}
    display({RECORD_PREFIX + mime: data for mime, data in bundle.items()}, raw=True, metadata=metadata)


def appendix_markdown() -> str:
    """The claims appendix (MyST): per claim, its words, source and figure, then each chapter's finding,
    pasted from the chapters that measure it (``{glue:any}``), and links to the chapters that discuss it."""
    out = []
    for key, c in CLAIMS.items():
        out += [f"**{c.text[0].upper() + c.text[1:]}.** The {c.source.lower()} "
                f"({{cite:t}}`{CITES[c.source]}`): {c.figure}.", ""]
        for doc in c.checked_in:
            where = f"{{doc}}`{chapter_label(doc).capitalize()} <../notebooks/{doc}>`"
            if doc in MEASURED_IN:
                out.append(f"- {where}: {{glue:any}}`../notebooks/{doc}.ipynb::{glue_key(key)}`")
            else:
                out.append(f"- {where} discusses it.")
        out.append("")
    return "\n".join(out)


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
