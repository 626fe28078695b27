"""A stand-in for a Gloo abort, outside the recipe: shut down the group's sockets by hand.

torch 2.14.1's ProcessGroupGloo.abort() and shutdown() do nothing, so a survivor blocked on a
hung peer (one that closes no connection) waits for the group's timeout. To measure what a
real abort would give, a thread of each survivor waits for the store key ``abort``, which the
detector sets once the heartbeats find the peer lost, and then shuts down (shutdown(2)) every
connected TCP socket that the process opened after :class:`SocketAbort` was made: the Gloo
group's connections, not the store's. A blocked collective then fails at once. It is a hack,
not a recipe: it may touch sockets that are not the group's.
"""

import datetime
import os
import socket
import threading
from typing import Set

import torch.distributed as dist


def list_socket_fds() -> Set[int]:
    """Return this process's file descriptors that are sockets."""
    found = set()
    for name in os.listdir("/proc/self/fd"):
        try:
            if os.readlink(f"/proc/self/fd/{name}").startswith("socket:"):
                found.add(int(name))
        except OSError:
            pass  # closed meanwhile
    return found


def shut_down_sockets_except(kept: Set[int]) -> int:
    """Shut down every connected socket not in ``kept``; return how many."""
    count = 0
    for fd in list_socket_fds() - kept:
        try:
            sock = socket.socket(fileno=fd)
        except OSError:
            continue
        try:
            sock.getpeername()  # connected: a listening socket has no peer
            sock.shutdown(socket.SHUT_RDWR)
            count += 1
        except OSError:
            pass
        finally:
            sock.detach()  # the descriptor stays Gloo's to close
    return count


class SocketAbort:
    """Watches the store key ``abort`` from a thread and a store client of its own; once it
    is set, shuts down the sockets opened since this object was made. Make it before the group.
    """

    def __init__(self, host: str, port: int, timeout_s: float, on_abort):
        self.store = dist.TCPStore(
            host, port, is_master=False, timeout=datetime.timedelta(seconds=timeout_s)
        )
        self.kept = list_socket_fds()
        self.on_abort = on_abort
        self.stopped = threading.Event()
        self.thread = threading.Thread(target=self.watch, name="socket-abort")
        self.thread.start()

    def watch(self) -> None:
        while not self.stopped.wait(0.005):
            try:
                if self.store.check(["abort"]):
                    self.on_abort(shut_down_sockets_except(self.kept))
                    return
            except RuntimeError:
                return  # the store is gone: the run is over

    def stop(self) -> None:
        self.stopped.set()
        self.thread.join()
