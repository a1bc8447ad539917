"""`pagoda worker --node-rank R` (R > 0): this machine's ranks of a group that
node 0 schedules and serves. No gRPC here: steps arrive over node 0's step
relay and go into this machine's shared-memory ring.

It takes node 0's resolved config from the relay's first frame, so every
rank builds the same shapes whatever flags the nodes were started with.
"""

from __future__ import annotations

import dataclasses
import pickle
import select
import signal

from shared import env
from shared.logging import get_logger
from worker.config import EngineConfig
from worker.executor.base import ExecutorFailure
from worker.executor.model_plan import ModelPlan
from worker.executor.placement import device_type, local_placements, rendezvous_address
from worker.executor.rank_group import SHUTDOWN, LocalRankGroup
from worker.executor.step_relay import connect_to_relay, receive_frame, relay_port

logger = get_logger(__name__)

POLL_SECONDS = 0.5


def _exit_on_signal(signum, frame) -> None:
    raise SystemExit(0)  # through the finally below: the ranks are stopped


def run_node(own: EngineConfig) -> int:
    """Serve node 0's steps until it shuts the group down (0) or a rank or node 0
    fails (1)."""
    parallel = own.parallel
    address = rendezvous_address(parallel).removeprefix("tcp://")
    host, port = address.rsplit(":", 1)
    sock = connect_to_relay(host, relay_port(int(port)), env.rendezvous_timeout())
    first = receive_frame(sock)
    if first is None:
        logger.error("node 0 closed the step relay before sending its config")
        return 1
    _, config = pickle.loads(first)
    config = dataclasses.replace(
        config,
        parallel=dataclasses.replace(config.parallel, node_rank=parallel.node_rank),
    )
    device = device_type(config.device)
    ModelPlan.make(config, device)
    group = LocalRankGroup(config, local_placements(config.parallel, device, f"tcp://{address}"))
    signal.signal(signal.SIGTERM, _exit_on_signal)
    logger.info("node %d of %d: ranks %s", parallel.node_rank, parallel.nnodes, group.ranks)
    try:
        while True:
            readable, _, _ = select.select([sock], [], [], POLL_SECONDS)
            group.check()
            if not readable:
                continue
            frame = receive_frame(sock)
            if frame is None:
                logger.error("node 0 went away: stopping this node's ranks")
                return 1
            group.broadcast.put(frame, group.check)
            if frame == SHUTDOWN:
                return 0
    except ExecutorFailure as exc:
        logger.error("%s", exc)
        return 1
    finally:
        group.close(ask_first=False)
        sock.close()
