"""Device code several ops share, importing no op: the persistent GEMM core and its tile order (``gemm``,
``tiles``, ``tma``), the epoch and heap translation (``sync``) and bounded waits (``watch``), the host-side
flags and copy-engine memops (``signal``), and the copy-engine channel, lanes and copies (``channel``,
``lanes``, ``copy2d``)."""
