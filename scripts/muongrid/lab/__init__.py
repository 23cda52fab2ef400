"""muongrid.lab: what the book's chapters, the benchmarks and the tests use beside the engine.

The engine never imports it (``import muongrid`` loads none of it); the package's two checks do, since an
install runs them (``tests/test_engine_floor.py`` holds these two lists to the imports):

    muongrid.verify imports: costmodel, poc_bugs, synthetic, timemodel
    muongrid.bench imports: costmodel, profiling, provenance, synthetic, timemodel, verdicts

Every module here imports with torch and numpy alone, as the wheel ships it: plotly, matplotlib, yaml and
IPython are imported inside the functions that draw or read with them (``tests/test_package.py``).

Problems, models and measurements:

    synthetic      seeded problems (parameters, groups, per-rank dyadic gradients) for verify and bench
    charlm         a tiny character-level GPT on Python's own documentation (pydoc_data)
    tpgpt          that GPT made tensor-parallel with torch's parallelize_module
    model_shapes   real models' parameter shapes as ParamSpec groups (GPT-2, Llama-3, Moonlight, Kimi K2)
    stepmodels     step_bench's models (model_shapes at some layers) as parameters with gradients, and torch's step
    profiling      peak memory of one step, slowest-rank timing
    traces         a small parser of torch.profiler Chrome traces (communication vs compute)
    statemetrics   Muon state metrics (update RMS, spectra) where Newton-Schulz runs
    dtensor_comm   what DTensor moves implicitly, counted like the ledger counts ours
    devicecheck    every rank of a grid run in one process on the meta device: what a GPU would reject
    stepcost       one step's bytes, ops, copies and host syncs, counted on the meta device
    steppath       the step path, measured: which modules and lines one steady-state step() runs
    poc_bugs       the proof of concept's two bugs, put back on purpose
    shard_ortho    Newton-Schulz on each shard instead of the matrix: another optimizer, measured (chapter 11)
    faultcheck     what a clean failure shows, for each fault scripts/faults.py injects
    c10d_count     every collective a process runs (DDP's and ZeRO's too), counted where torch dispatches it
    iteration      DDP + torch's Muon, DDP + ZeroRedundancyOptimizer and ours: one training iteration, timed in parts
    iteration_run  iteration_bench.py's schedule on every rank: warm up, count, time interleaved runs, probe DDP
    iteration_report  its records read into times, counts, the closed forms and the count checks

Models of cost, closed forms beside the ledger:

    costmodel      closed-form bytes per layout and an alpha-beta time model
    memory         per-rank memory of DP, ZeRO-1/2/3, TP strategies (chapter 2's calculator)
    choice         what each layout costs per rank and step, from the plan and the closed forms
    timemodel      seconds of one optimizer step on the slowest rank, per layout
    scale          real models' ZeRO-1 plans priced on up to 1,024 ranks and more (plan_at_scale.py, plan_ep.py)
    wholestep      the whole training step per real configuration: Muon's cost against AdamW's
    muonshare      Muon's share of a step against the tokens of one step
    rivals         other distributed Muon implementations' traffic per step, as closed forms (chapter 16)
    gpurecord      the project's one-GPU record, as the book cites it

What the chapters show:

    notebook       run a script from a cell, read its JSON, the set-up cell (python -m muongrid.lab.notebook sync)
    page           keep, say, show, listing: numbers and figures that the prose quotes
    palette        one colour per quantity
    diagrams       matplotlib diagrams of what the scripts did
    explorers      Plotly figures with sliders that move without a kernel
    layout_explorer  chapter 13's layout x grid x shapes explorer
    scale_explorer   chapter 15's plans at scale
    step_explorer    chapter 5's step, stage by stage, on every rank
    step_transfers   which matrix pieces each rank sends to whom in a traced step (its hover)
    verdicts       timing verdicts that a busy machine cannot turn around
    provenance     the command, commit, versions and machine of a recorded result
    claims         the paper's and the report's claims, each with its figure and source
    roadmap        the book's road map, from _toc.yml

Building and checking the book is not here: ``scripts/booktools/`` (not in the wheel).
"""
