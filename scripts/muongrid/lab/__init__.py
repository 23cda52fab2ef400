"""muongrid.lab: what the book, the benchmarks and the tests use beside the engine; nothing in the engine imports it.

    synthetic   seeded problems (parameters, groups, per-rank dyadic gradients) for verify and bench
    costmodel   closed-form bytes per layout and an alpha-beta time model, independent of the ledger
    memory      per-rank memory of DP, ZeRO-1/2/3, TP strategies (chapter 2's calculator)
    profiling   peak memory of one step, slowest-rank timing
    traces      a small parser of torch.profiler Chrome traces (communication vs compute)
    charlm      a tiny character-level GPT on Python's own documentation (pydoc_data)
    poc_bugs    the proof of concept's two bugs, put back on purpose
    notebook    what the chapters share: run a script from a cell, read its JSON, the set-up cell
    rivals      other distributed Muon implementations' traffic per step, as closed forms (chapter 16)
"""
