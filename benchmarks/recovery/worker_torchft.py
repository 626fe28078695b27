"""A process of paths torchft and torchft_nightly: ``python -m benchmarks.recovery.worker_torchft``,
on stock torch.

A replica group of one process, as in torchft's examples. torchft 0.2.0 runs on its own
reconfigurable Gloo group; torchft-nightly on a native Gloo group made with
enable_reconfigure=True, which its Manager reconfigures in place (torchft#358).
"""

import datetime
import sys
import time

import torch.distributed as dist
from benchmarks.process_stats import (
    count_compiled_graphs,
    read_peak_rss_mb,
    reset_peak_rss,
)

from benchmarks.recovery import worker


def main(args) -> int:
    from torchft import Manager
    from torchft.ddp import DistributedDataParallel as FtDistributedDataParallel
    from torchft.process_group import ProcessGroupGloo as FtProcessGroupGloo

    process = worker.Process(args)
    model, optimizer, events, store = (
        process.model,
        process.optimizer,
        process.events,
        process.store,
    )
    timeout = datetime.timedelta(seconds=args.timeout)
    replica_store = dist.TCPStore(
        "localhost", 0, is_master=True, wait_for_workers=False, timeout=timeout
    )

    def load_state_dict(state):
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])

    collective_timeout = datetime.timedelta(seconds=args.collective_timeout)
    if args.path == "torchft_nightly":
        # Unconnected until the Manager's first quorum reconfigures it. Its reconfigure handle
        # is its rank (gloo:RANK:...), which must be unique among the replicas; the peers
        # meet through the group's store, so the driver's.
        dist.init_process_group(
            "gloo",
            store=dist.PrefixStore("torchft_nightly_pg", store),
            rank=args.slot,
            world_size=args.slot + 1,
            timeout=collective_timeout,
            enable_reconfigure=True,
        )
        group = dist.group.WORLD
    else:
        group = FtProcessGroupGloo(timeout=collective_timeout)
    manager = Manager(
        pg=group,
        min_replica_size=args.world - 1,
        load_state_dict=load_state_dict,
        state_dict=lambda: {
            "model": model.state_dict(),
            "optimizer": optimizer.state_dict(),
        },
        replica_id=f"replica_{args.slot}",  # torchft adds a uuid; its rank comes from these digits
        store_addr="localhost",
        store_port=replica_store.port,
        rank=0,
        world_size=1,
        lighthouse_addr=args.lighthouse,
        port=0,
        use_async_quorum=False,
        init_sync=False,
        timeout=timeout,
        quorum_timeout=timeout,
        connect_timeout=timeout,
    )
    net = process.compile_net(FtDistributedDataParallel(manager, model))
    events.log("ready", graphs=0)
    if not args.restarted:
        # Every first replica asks for the first quorum together, so that it has them all.
        store.add("torchft/ready", 1)
        while int(store.add("torchft/ready", 0)) < args.world:
            time.sleep(0.01)
    warm = None
    end = (
        args.steps
    )  # until the driver says where the run ends, once the new process is in
    while manager.current_step() < end:
        step = manager.current_step()
        if store.check(["end"]):
            end = int(store.get("end"))
            if step > end:
                raise SystemExit(
                    f"slot {args.slot} is at step {step}, past the end at {end}"
                )
            if step == end:
                break
        process.die_if_due(step)
        reset_peak_rss()
        manager.start_quorum()
        # A new process heals inside its first quorum: from there on, its step is the members'.
        step = manager.current_step()
        optimizer.zero_grad(set_to_none=True)
        events.log("attempt", step=step)
        try:
            process.run_backward(net, step)
        except AssertionError as e:
            # torchft 0.2.0: where the allreduce in its comm hook fails, the manager records the
            # error, and then the hook's `assert fut._fut` fails (torchft/ddp.py), out of the
            # backward pass. Caught here, the step is not committed, as torchft intends.
            # torchft-nightly's hook returns the bucket unchanged instead.
            events.log("backward_raised", step=step, error=f"AssertionError: {e}")
        if manager.should_commit():
            optimizer.step()
            if warm is None and not args.restarted:
                warm = count_compiled_graphs()  # the first step compiles
            events.log(
                "step",
                step=step,
                participants=manager.num_participants(),
                rss_mb=read_peak_rss_mb(),
            )
        else:
            events.log("failed", step=step)
    process.finish(manager.current_step(), count_compiled_graphs() - (warm or 0))
    manager.shutdown(wait=False)
    if dist.is_initialized():
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(worker.run(main))
