"""``ag_gemm`` push: producers store the local shard into every peer's inbox, consumers GEMM locally.

Program ids ``0 .. comm_sms-1`` are producers: per chunk (rows x K columns, K-chunk major so the
first K columns arrive first) they copy the local shard into slot ``rank`` of each peer's inbox for
this call (16-byte remote stores: the peer's address is the heap translation ``iris.store`` does,
hoisted out of the copy loop), then a CTA barrier and one ``iris.atomic_xchg`` (release, system scope)
per peer raise the chunk's flag to this call's epoch; then they join the GEMM. The other programs run
the persistent GEMM from the start: local rows / K-slice first, then peers' data, read from the local
inbox after an acquire wait on its chunk flag. Producers never wait before they join, so no grid size
can starve them. With ``comm_sms=0`` there are no dedicated producers: every program pushes its share
of the chunks, then runs its tiles (see ``FusedConfig``). The kernel is
``fused_kernel.fused_ag_gemm_kernel`` (``PULL=False``); its synchronisation contract is documented
there.
"""

from __future__ import annotations

from .fused import fused_launcher

#: ``ag_gemm_push(*, a_shard, b, out, inbox, flags, sync, heap_bases, rank, world_size, gather_dim,
#: config, num_sms, phase="all", cache=None) -> out``: see :func:`.fused.fused_launcher`.
ag_gemm_push = fused_launcher("push")
