"""Loads the overlay's Reducer methods into every process that uses DDP.

Installed into the venv's site-packages as a package with a ``.pth`` file that
imports it at interpreter start-up, including in processes that
``torch.multiprocessing`` spawns. Importing torch at start-up would slow every
interpreter down, so this only waits for ``torch.nn.parallel.distributed`` to
be imported (``import torch`` does that) and then loads the extension, which
binds the methods onto ``torch._C._distributed_c10d.Reducer``.
"""

import importlib
import importlib.abc
import importlib.machinery
import sys

_TRIGGER = "torch.nn.parallel.distributed"


class _LoadAfterDistributed(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname, path, target=None):
        if fullname != _TRIGGER:
            return None
        sys.meta_path.remove(self)
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is None or spec.loader is None:
            return spec
        exec_module = spec.loader.exec_module

        def exec_then_load(module):
            exec_module(module)
            importlib.import_module(__name__ + "._C")

        # Per-spec loader instance: wrapping its method affects this import only.
        spec.loader.exec_module = exec_then_load  # type: ignore[method-assign]
        return spec


def _install():
    if _TRIGGER in sys.modules:
        importlib.import_module(__name__ + "._C")
    elif not any(isinstance(f, _LoadAfterDistributed) for f in sys.meta_path):
        sys.meta_path.insert(0, _LoadAfterDistributed())


_install()
