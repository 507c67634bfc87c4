"""Where torch.compile keeps what it compiled, so a restart does not compile again.

Inductor caches compiled graphs and generated kernels on disk (``TORCHINDUCTOR_CACHE_DIR``,
by default ``/tmp/torchinductor_$USER``) and Triton its kernels (``TRITON_CACHE_DIR``, by
default under the home directory). In a container both usually vanish with it, so every
start compiles from scratch: on the H200 8B shape ``torch_compile_mode: max-autotune`` took
361 s cold and 49.9 s from a warm cache (docs/ragged-log.md, session 14). The embedded backend's
``compile_cache_dir`` points both at one folder, on a volume that survives restarts.

A variable in the environment the process started with wins (an operator's choice). One set
inside the process does not: torch's inductor writes its default folder
(``/tmp/torchinductor_$USER``) into ``TORCHINDUCTOR_CACHE_DIR`` the first time anything asks
for its cache folder, and on the GPU a daemon had done so before its backend started
(session 37: the log named ``/tmp/torchinductor_root``, the configured folder held only
Triton's kernels); inductor reads the variable again at every use, so pointing it at the
configured folder still takes effect. Call before the first compile.
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
    ``folder/triton``) unless the environment the process started with names them; creates
    the folders. Returns the effective folder per variable."""
    wanted = {INDUCTOR_VARIABLE: folder.resolve(), TRITON_VARIABLE: folder.resolve() / "triton"}
    effective: dict[str, str] = {}
    started_with = initial_environment()
    for variable, path in wanted.items():
        given = os.environ.get(variable)
        if given is not None and started_with is not None and started_with.get(variable) != given:
            log.info(
                "%s=%s was set inside this process (torch's default), not by its environment: "
                "using %s",
                variable,
                given,
                path,
            )
            given = None
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


def initial_environment() -> dict[str, str] | None:
    """The environment this process started with (Linux: ``/proc/self/environ``, which later
    changes to ``os.environ`` do not touch); None where it cannot be read (then every
    variable set now counts as the environment's)."""
    try:
        raw = Path("/proc/self/environ").read_bytes()
    except OSError:
        return None
    pairs = (entry.partition(b"=") for entry in raw.split(b"\0") if entry)
    return {k.decode(errors="replace"): v.decode(errors="replace") for k, _, v in pairs}
