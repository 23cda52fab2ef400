"""Build the book (what `make book` runs): execute every chapter, then render it into _build/html.

    python scripts/build_book.py              # chapters whose inputs changed are executed, others reused
    python scripts/build_book.py --force      # execute every chapter again
    python scripts/build_book.py --only 05_distributed_step   # execute one chapter (no render)
    python scripts/build_book.py --no-edition # render the pages, skip the notebook edition
    python scripts/build_book.py --only A,B --claims DIR   # several such runs share the chapters (the tests)

Each chapter runs once in a guarded nbclient (``booktools.nbexec``: no silent stalls; a stalled
cell is named and its chapter executed again), its executed copy is kept in ``_build/executed/``,
and the book is rendered from those copies with ``jupyter-book build -W -n --keep-going``. Then the
notebook edition is written from the same copies into ``_build/colab/notebooks/`` (``booktools.edition``:
what the pages' Colab buttons and downloads give). The time per chapter is printed at the end. Exits
non-zero if a chapter fails, the render warns or the edition finds a reference the site lacks.
"""
from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
os.chdir(ROOT)  # muongrid.lab.notebook finds the checkout from the working directory

from booktools import bookbuild, edition, warmstart
from booktools.mystmd import MystError
from booktools.nbexec import Report, quiet_openmp, timing_table


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--force", action="store_true", help="execute every chapter, even unchanged ones")
    p.add_argument("--only", help="execute only these chapters (comma-separated stems) and skip the render")
    p.add_argument("--toc", help="a _toc.yml to build instead of the repository's")
    p.add_argument("--claims", metavar="DIR", help="with --only: share the chapters with other runs given the same "
                   "DIR (the tests start two): each executes, in order, those no other run has claimed yet")
    p.add_argument("--no-edition", action="store_true",
                   help="skip the notebook edition (a book of some chapters: its pages link to ones it leaves out, "
                        "which the edition refuses, since each of its links must reach a built page)")
    args = p.parse_args(argv)

    if args.claims and not args.only:
        p.error("--claims shares the chapters of --only among runs; give --only too")
    toc = Path(args.toc).read_text() if args.toc else None
    stems = bookbuild.toc_chapters(toc)
    if args.only:
        wanted = args.only.split(",")
        unknown = sorted(set(wanted) - set(stems))
        if unknown:
            p.error(f"not chapters of the table of contents: {', '.join(unknown)}")
        stems = [s for s in stems if s in wanted]

    started, reports = time.monotonic(), []
    # One warm start server for every chapter's scripts (booktools.warmstart): torch imported once,
    # in the environment the kernels get (OpenMP reads its policy when torch loads).
    quiet_openmp()
    to_run = args.force or not all(bookbuild.is_fresh(s) for s in stems)
    with warmstart.shared(sys.executable, str(ROOT / "scripts")) if to_run else contextlib.nullcontext():
        for stem in stems:
            if args.claims and not claim(Path(args.claims), stem):
                continue
            print(f"[build_book] {stem} ...", flush=True)
            path, report = bookbuild.executed(stem, force=args.force)
            reports.append(report or Report(stem + " (reused)"))
            print(f"[build_book] {stem}: {'reused' if report is None else f'{report.seconds:.1f} s'}", flush=True)

    if args.only:
        print("\n" + timing_table(reports))
        return 0
    print("[build_book] rendering ...", flush=True)
    render_started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="muongrid-book-") as tmp:
        src = bookbuild.stage(Path(tmp), stems, toc=toc)
        proc = bookbuild.render(src)
        if proc.stderr.strip() and proc.returncode == 0:
            print(proc.stderr, file=sys.stderr)  # notices (e.g. the placeholder repository URL); warnings fail
        if proc.returncode != 0:
            print(proc.stdout[-6000:], proc.stderr[-6000:], sep="\n", file=sys.stderr)
            print("[build_book] the render failed (see above)", file=sys.stderr)
            return 1
        if not (ROOT / "book" / "_offline").exists() and (src / "book" / "_offline").exists():
            shutil.copytree(src / "book" / "_offline", ROOT / "book" / "_offline")  # npm packs, reused next time
        html = bookbuild.BUILD / "html"
        shutil.rmtree(html, ignore_errors=True)
        shutil.copytree(src / "_build" / "html", html)
    render_s = time.monotonic() - render_started
    # The notebook edition (what the Colab buttons and .ipynb downloads give): from the executed
    # chapters, its links checked against the pages just built.
    edition_started, written = time.monotonic(), []
    if args.no_edition:
        print("[build_book] notebook edition skipped (--no-edition)", flush=True)
    else:
        try:
            written = edition.Edition(html).write(stems, bookbuild.EXECUTED)
        except MystError as e:  # MyST it has no rule for, or a reference the site lacks: named, with its chapter
            print(f"[build_book] the notebook edition failed: {e}", file=sys.stderr)
            return 1
        edition.install(html)
    edition_s = time.monotonic() - edition_started

    print("\n" + timing_table(reports))
    print(f"{'render':<28} {render_s:8.1f}\n{'notebook edition':<28} {edition_s:8.1f}\n"
          f"{'whole build':<28} {time.monotonic() - started:8.1f}")
    print(f"\nThe book is in {html.relative_to(ROOT)}/index.html; its notebook edition "
          f"({len(written)} chapters) in {edition.EDITION.relative_to(ROOT)}/notebooks")
    return 0


def claim(folder: Path, stem: str) -> bool:
    """Whether this run takes chapter ``stem``: the first of the runs sharing ``folder`` to ask does."""
    try:
        os.close(os.open(folder / f"{stem}.claimed", os.O_CREAT | os.O_EXCL | os.O_WRONLY))
    except FileExistsError:
        return False
    return True


if __name__ == "__main__":
    sys.exit(main())
