"""The book's road map: one table of every page in ``_toc.yml``, which chapter 0 displays from a cell
(``table_markdown()``); the index page routes readers by goal instead, and links chapter 0 for the rest.

Pages come from the table of contents (``toc_files``, the one reader of ``_toc.yml``), each
page's title from its own first heading, and the question it answers from ``QUESTIONS`` below, so a
chapter added to the toc appears in the table, and a chapter without a question is an error
instead of a silent gap.

    python -m muongrid.lab.roadmap     # prints the table (MyST Markdown)
"""
from __future__ import annotations

import re
from pathlib import Path

from .notebook import ROOT

def toc_files(toc_text: str | None = None) -> list[str]:
    """Every page of ``_toc.yml`` (or of ``toc_text``), in order: its root, then each part's chapters."""
    import yaml

    toc = yaml.safe_load(toc_text or (ROOT / "_toc.yml").read_text())
    files = [toc["root"]]
    for part in toc.get("parts", [{"chapters": toc.get("chapters", [])}]):
        files += [c["file"] for c in part["chapters"]]
    return files


def toc_chapters(toc_text: str | None = None) -> list[str]:
    """The stems of the chapters (``notebooks/NN_*``) listed in ``_toc.yml``, in order."""
    return [f.split("/", 1)[1] for f in toc_files(toc_text) if f.startswith("notebooks/")]



QUESTIONS = {
    "notebooks/00_start_here": "What is in this book, and how do I run it and check a distributed run myself?",
    "notebooks/01_muon": "What does Muon do to an update, and how does Newton-Schulz do it with matmuls alone?",
    "notebooks/02_distributed_map": "What does each rank store under DP, TP, ZeRO and FSDP, and what does each "
                                    "collective move?",
    "notebooks/03_grid": "How are processes arranged into DP and TP groups, and who holds what?",
    "notebooks/04_zero1_buffer": "How is optimizer state split, and why do some matrices straddle two ranks?",
    "notebooks/05_distributed_step": "How does a matrix get gathered, orthogonalised and re-sharded (the code of "
                                     "every stage), and how do we know it is right?",
    "notebooks/06_communication": "How many bytes does Muon move compared with AdamW, and what does that cost in "
                                  "time on a cluster?",
    "notebooks/07_profiling": "Where does a training step's time go, and which published claims hold on this "
                              "machine?",
    "notebooks/08_beyond_poc": "How does one owner per matrix avoid orthogonalising every matrix on every rank?",
    "notebooks/09_training": "Does a real model train the same on every grid, and what does each optimizer cost?",
    "notebooks/10_checkpoints_failures": "How does a run save on one grid and resume on another, and how does a "
                                         "failure end?",
    "notebooks/11_fsdp2": "How does Muon work on `fully_shard` models without gathering every matrix everywhere?",
    "notebooks/12_use_it": "What is the loop to copy, how is it started, and what differs from a torch optimizer?",
    "notebooks/13_what_to_pick": "Which layout and sharding should I use, and what does each cost?",
    "notebooks/14_on_a_gpu": "What does a GPU run print and cost, how close is Newton-Schulz to the GPU's matmul "
                             "ceiling, and what does the optimizer step cost there?",
    "notebooks/15_muon_at_scale": "What limits Muon on a thousand GPUs, and what do groups, batching and faster "
                                  "polynomials buy there?",
    "notebooks/16_related_work": "How do DMuon, torchtitan, Megatron and Dion distribute Muon, and do their "
                                 "communication formulas agree with our ledger?",
    "book/api": "What does each keyword of the optimizers, the grid, the data loader and the checkpoints do, and "
                "what is its default?",
    "book/claims": "Which of the paper's and the report's claims hold here, and why do the others differ?",
    "book/troubleshooting": "How do I run on GPUs and several nodes, and what does an error message mean?",
    "book/glossary": "What does a term mean?",
    "book/references": "Which works does the book build on?",
}


def source(page: str) -> Path:
    """The file a toc entry is read from: ``notebooks/NN_x.py`` (Jupytext) or ``book/x.md``."""
    for suffix in (".py", ".md", ".ipynb"):
        path = ROOT / f"{page}{suffix}"
        if path.exists():
            return path
    raise FileNotFoundError(f"_toc.yml lists {page!r}, but there is no {page}.py, .md or .ipynb")


def title(page: str) -> str:
    """The page's first first-level heading."""
    path = source(page)
    text = path.read_text()
    if path.suffix == ".py":  # a py:percent chapter: its Markdown lines are comments ("# # 1. Title")
        text = "\n".join(line[2:] for line in text.splitlines() if line.startswith("# "))
    elif path.suffix == ".ipynb":
        import json
        text = "\n".join("".join(c["source"]) for c in json.loads(text)["cells"] if c["cell_type"] == "markdown")
    match = re.search(r"^# (.+)$", text, re.M)
    if not match:
        raise ValueError(f"{source(page).name} has no first-level heading to title it")
    return match.group(1).strip()


def rows(toc_text: str | None = None) -> list[tuple[str, str, str]]:
    """(page, title, question) for every page of the toc but its root, in toc order."""
    pages = toc_files(toc_text)[1:]
    missing = [p for p in pages if p not in QUESTIONS]
    if missing:
        raise KeyError(f"no road-map question for {missing}: add one to QUESTIONS in muongrid/lab/roadmap.py")
    return [(p, title(p), QUESTIONS[p]) for p in pages]


def table_markdown(toc_text: str | None = None) -> str:
    """A MyST table: each page's title as a link (``{doc}``, from the book's root) and its question."""
    lines = ["| Page | The question it answers |", "| :--- | :--- |"]
    for page, name, question in rows(toc_text):
        lines.append(f"| {{doc}}`{name} </{page}>` | {question} |")
    return "\n".join(lines)


if __name__ == "__main__":
    print(table_markdown())
