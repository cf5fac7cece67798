"""Pieces every op's kernels share: the persistent GEMM core and its tile order (``gemm``, ``tiles``) and
the host-side flags and copy-engine memops (``signal``)."""
