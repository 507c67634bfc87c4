"""Where torch.compile keeps what it compiled, so a restart does not compile again.

Inductor caches compiled graphs and generated kernels on disk (``TORCHINDUCTOR_CACHE_DIR``,
by default ``/tmp/torchinductor_$USER``) and Triton its kernels (``TRITON_CACHE_DIR``, by
default under the home directory). In a container both usually vanish with it, so every
start compiles from scratch: on the H200 8B shape ``torch_compile_mode: max-autotune`` took
361 s cold and 49.9 s from a warm cache (docs/ragged-log.md, session 14). The embedded backend's
``compile_cache_dir`` points both at one folder, on a volume that survives restarts.

A variable already set in the environment wins (an operator's choice, or a compile earlier in
this process, which fixes inductor's folder). Call before the first compile.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

log = logging.getLogger(__name__)

INDUCTOR_VARIABLE = "TORCHINDUCTOR_CACHE_DIR"
TRITON_VARIABLE = "TRITON_CACHE_DIR"


def use_compile_cache(folder: Path) -> dict[str, str]:
    """Point inductor's and Triton's on-disk caches at ``folder`` (Triton's at
    ``folder/triton``) unless the environment already names them; creates the folders.
    Returns the effective folder per variable."""
    wanted = {INDUCTOR_VARIABLE: folder.resolve(), TRITON_VARIABLE: folder.resolve() / "triton"}
    effective: dict[str, str] = {}
    for variable, path in wanted.items():
        given = os.environ.get(variable)
        if given is not None:
            if Path(given).resolve() != path:
                log.info("%s=%s from the environment (not %s)", variable, given, path)
            effective[variable] = given
            continue
        try:
            path.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            log.warning("cannot create the compile cache %s (%s): compiling without it", path, exc)
            continue
        os.environ[variable] = str(path)
        effective[variable] = str(path)
    return effective
