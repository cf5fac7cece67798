"""Side-by-side benchmark of an op: BSP, its parts, every variant, dispatch and the peers, in one run.

For each case (an op's shape, layout and dtype) on ``world_size`` spawned ranks: BSP, the parts BSP is
made of timed alone (e.g. the all-gather alone and the GEMM alone: the ceiling of any fused kernel is the
slowest of them), every available variant at its tuned configuration (the best COMPLETE trial of that
variant in the case's Optuna study; a capped sweep of its search space where the database has none),
launched as dispatch serves it (CUDA-graph replays for the ops' replayed variants),
``dispatch()`` as a user would call it, and the op's peers (implementations outside autotaxer, e.g.
PyTorch's fused op; one that may hang, e.g. Iris' stock kernel, in its own process group with a time
limit so a hang is reported, not fatal). What an op adds to a row (its parts and peers) is its ``bench``
integration (:class:`autotaxer.ops._forms.BenchForm`). Every configuration is validated against the fp32
reference before it is timed. A row's entries are timed side by side with
:func:`autotaxer.measure.time_interleaved` once all are ready: ``eager`` (calls in a row) and, on
CUDA, ``graph`` (calls captured in one CUDA graph), one sample of each entry in turn, so a slow stretch of
the machine falls on all of them alike; median of the samples, max across ranks, microseconds. As in the
tuner, each call of BSP, a variant, dispatch or a peer waits for the previous call's output
(``chain="dependent"``, the link's cost subtracted and kept as ``eager_link``/``graph_link``); the parts
(one collective or one GEMM on the current stream) run back to back. Peers in a process group of their
own run afterwards. (A variant without a tuned configuration first picks the best
of its capped sweep by eager time, one configuration after another.)

The modules, one job each: :mod:`.case` (what to run: :class:`~.case.Case`, :class:`~.case.BenchConfig`),
:mod:`.tuned` (tuned configurations from the database), :mod:`.entries` (one entry of a row: built and
validated against the reference), :mod:`.timing` (a row's entries timed side by side), :mod:`.rank`
(every case on one rank), :mod:`.run` (the whole run on spawned ranks and its JSON report), :mod:`.rows`
(reading and printing result rows); :mod:`.form` is the one place an op's ``bench`` integration is
obtained. Torch, Triton and Iris are imported inside functions, so importing these modules is cheap.
"""
