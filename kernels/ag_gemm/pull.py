"""``ag_gemm`` pull: producers stage the local shard, then load each peer's staged chunks into the inbox.

A peer can only read what lives in the symmetric heap, so each call the ``comm_sms`` producer CTAs
first copy the local shard into slot ``rank`` of this rank's inbox, chunk by chunk (rows x K columns,
K-chunk major), each chunk followed by a CTA barrier and a release (system scope) of its own flag;
that step never waits. Then, per chunk and peer, they spin with acquire loads on the peer's flag for
that chunk (over NVLink/xGMI), copy the chunk from the peer's staging slot into slot ``peer`` of the
local inbox (16-byte remote loads: the heap translation of ``iris.load`` is hoisted out of the copy
loop), release the local flag the consumers wait on, and join the GEMM once their chunks are in.
So every remote byte crosses the link once (the first design re-read peers' A once per N tile: ~64x
the traffic at N=8192), and the GEMM only reads local memory. Producers wait only on the peers'
staging step, which never waits, so no grid size can starve anyone. With ``comm_sms=0`` every
program stages and fetches its share of the chunks, then runs its tiles (see ``FusedConfig``). The
kernel is ``fused_kernel.fused_ag_gemm_kernel`` (``PULL=True``); its synchronisation contract is
documented there.
"""

from __future__ import annotations

from .fused import fused_launcher

#: ``ag_gemm_pull(*, a_shard, b, out, inbox, flags, sync, heap_bases, rank, world_size, gather_dim,
#: config, num_sms, phase="all", cache=None) -> out``: see :func:`.fused.fused_launcher`.
ag_gemm_pull = fused_launcher("pull")
