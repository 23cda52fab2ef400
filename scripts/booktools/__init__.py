"""booktools: what builds and checks the book, beside the package and never in its wheel.

    nbexec     execute a chapter with nbclient, guarded against lost ZeroMQ wake-ups (a stall names its cell)
    bookbuild  execute each chapter once (fingerprinted in _build/executed/), stage the sources, render the book
    warmstart  fork the build's and the tests' scripts from a Python that has imported torch (with a fork check)
    pagecheck  layout checks of a built page in a browser (what a reader sees cut off, broken or dead)
    edition    the notebook edition (_build/colab): the executed chapters as Jupyter and Colab show them
    mystmd     MyST to the Markdown Jupyter and Colab render, each reference a link checked against the build

``scripts/build_book.py`` (``make book``) and the tests import it (``scripts/`` is on their path: the
script's own folder, pytest's ``pythonpath``); ``muongrid`` never does, except ``muongrid.lab.notebook.run``,
which asks the build's warm-start server for its scripts when a build names one (``MUONGRID_WARM_SOCKET``)
and starts new interpreters when this package is absent. ``pyproject.toml`` ships ``muongrid`` alone
(``tests/test_package.py`` checks the wheel).

    python -m booktools.pagecheck _build/html            # from scripts/, or with scripts/ on PYTHONPATH
"""
