"""The optional dependencies (setup.cfg's extras), imported only where a command needs one.

Every import of an extra's package goes through `require`: where the package is missing, the
command stops with one line naming what to install (a UserError: exit status 2 at the command
line), e.g. "the approximate (FAISS HNSW) index needs the retrieval extra (faiss is not
installed): pip install 'bertjax[retrieval]'". `import bertjax` and the core commands import none.
"""

from __future__ import annotations

import importlib
from types import ModuleType

from bertjax.core.errors import UserError


def install_command(extra: str) -> str:
    return f"pip install 'bertjax[{extra}]'"


def require(module: str, extra: str, purpose: str) -> ModuleType:
    """`module`, imported; where it cannot be, a UserError saying that `purpose` (what the user
    asked for: "reading tfds:glue/sst2") needs `extra` and the pip command that installs it."""
    try:
        return importlib.import_module(module)
    except ImportError as e:
        top = module.split(".")[0]
        if isinstance(e, ModuleNotFoundError) and (e.name or top).split(".")[0] == top:
            why = f"{top} is not installed"
        else:  # installed, but broken: say what failed
            first = (str(e).strip().splitlines() or [type(e).__name__])[0][:200]
            why = f"importing {module} failed: {first}"
        raise UserError(f"{purpose} needs the {extra} extra ({why}): "
                        f"{install_command(extra)}") from None
