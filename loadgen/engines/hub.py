"""Whether an engine can have the checkpoint it is asked for, before it is launched: a local
path, the Hugging Face cache, or a hub it can reach. An engine told to download what it cannot
reach spends minutes starting before it dies; this says so in one line first."""

from __future__ import annotations

import os
from pathlib import Path

import httpx

# how long the hub gets to answer at all (any answer, 401 and 404 included, means reachable)
REACH_S = 5.0


def hub_cache() -> Path:
    """Where huggingface_hub keeps downloads: HF_HUB_CACHE, else HF_HOME/hub, else ~/.cache/huggingface/hub."""
    if env := os.environ.get("HF_HUB_CACHE"):
        return Path(env)
    return Path(os.environ.get("HF_HOME") or Path.home() / ".cache" / "huggingface") / "hub"


def cached(repo_id: str) -> bool:
    """A snapshot of ``repo_id`` is in the cache (a directory of it holding at least one file)."""
    snapshots = hub_cache() / f"models--{repo_id.replace('/', '--')}" / "snapshots"
    try:
        return any(any(s.iterdir()) for s in snapshots.iterdir() if s.is_dir())
    except OSError:
        return False


def unavailable(checkpoint: str) -> str | None:
    """Why ``checkpoint`` (a path or ``ORG/NAME``) cannot be had here, or None when it can."""
    if Path(checkpoint).expanduser().exists():
        return None
    looks_like_path = checkpoint.startswith(("/", ".", "~")) or checkpoint.count("/") != 1
    if looks_like_path:
        return f"model {checkpoint}: no such file or directory, and not a hub id (ORG/NAME)"
    if cached(checkpoint):
        return None
    if os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes", "on"):
        return (f"model {checkpoint}: not in the Hugging Face cache ({hub_cache()}) and HF_HUB_OFFLINE is set; "
                "download it first, or give a local path")
    endpoint = os.environ.get("HF_ENDPOINT") or "https://huggingface.co"
    try:
        httpx.head(f"{endpoint.rstrip('/')}/api/models/{checkpoint}", timeout=REACH_S)
    except httpx.HTTPError as exc:
        return (f"model {checkpoint}: not in the Hugging Face cache ({hub_cache()}) and {endpoint} cannot be "
                f"reached ({type(exc).__name__}); download it where the hub is reachable "
                f"(huggingface-cli download {checkpoint}) and copy the cache here, or give a local path")
    return None
