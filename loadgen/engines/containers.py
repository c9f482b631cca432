"""The container form of an engine launch: the official image, the same engine arguments.

``container_argv`` is what runs inside the container (the engine's own command line, listening
on 0.0.0.0 at the container port; the engine declares its image); ``container_run`` wraps it in
``docker run`` / ``podman run``: GPUs by device id, the port published on the address the
engine would have bound (127.0.0.1 unless told otherwise), the Hugging Face cache and any
local checkpoint mounted, ``HF_TOKEN`` passed by name (its value never appears).

The compose files in ``docker/`` get their engine command from ``loadgen serve ... --container
docker --print-argv`` run in the loadgen image, so the flags come from this one place.
"""

from __future__ import annotations

import os
from pathlib import Path

from loadgen.engines.build import launch_spec
from loadgen.engines.engine import Image
from loadgen.engines.registry import ENGINES, engine_named
from loadgen.engines.spec import EngineSpec
from loadgen.errors import UsageError
from loadgen.servers.launch import LaunchSpec

RUNTIMES: tuple[str, ...] = ("docker", "podman")


def image_for(spec: EngineSpec) -> Image:
    engine = engine_named(spec.backend)
    image = engine.image(spec)
    if image is None:
        offered = ", ".join(e.name for e in ENGINES if e.image(spec) is not None)
        raise UsageError(
            f"--container: no official image is known for --backend {spec.backend}; "
            f"use one of {offered}, or run it without --container"
        )
    return image


def container_argv(spec: EngineSpec) -> list[str]:
    """The engine's command line inside its official image."""
    image = image_for(spec)
    launch = launch_spec(spec)
    args = list(launch.argv[image.replaces:])
    args[args.index(image.host_flag) + 1] = "0.0.0.0"
    args[args.index("--port") + 1] = str(image.port)
    return [*image.head, *args]


def container_run(spec: EngineSpec, runtime: str = "docker", name: str | None = None) -> list[str]:
    """``docker run`` / ``podman run`` of the same launch, ready to paste or to start."""
    if runtime not in RUNTIMES:
        raise UsageError(f"--container {runtime!r}: choose docker or podman")
    image = image_for(spec)
    launch = launch_spec(spec)
    argv = [runtime, "run", "--rm", "--name", name or f"loadgen-{spec.backend}-{spec.port}"]
    if spec.device == "cuda":
        ids = ",".join(str(g) for g in spec.gpus)
        if runtime == "docker":
            argv += ["--gpus", f'"device={ids}"']
        else:  # podman: the NVIDIA container toolkit's CDI names
            for g in spec.gpus:
                argv += ["--device", f"nvidia.com/gpu={g}"]
    if image.ipc_host:
        argv += ["--ipc", "host"]  # PyTorch shares tensors between workers through shared memory
    else:
        argv += ["--shm-size", "1g"]
    argv += ["-p", f"{spec.host}:{spec.port}:{image.port}"]
    hf_home = Path(os.environ.get("HF_HOME") or Path.home() / ".cache" / "huggingface")
    argv += ["-v", f"{hf_home}:{image.hf_cache}"]
    checkpoint = Path(spec.model.checkpoint)
    if checkpoint.is_absolute():
        argv += ["-v", f"{checkpoint}:{checkpoint}:ro"]
    argv += ["-e", "HF_TOKEN"]
    for key, value in launch.env.items():
        if key.startswith("VLLM_"):  # CUDA_VISIBLE_DEVICES stays out: the container sees only its GPUs
            argv += ["-e", f"{key}={value}"]
    inside = container_argv(spec)
    argv += ["--entrypoint", inside[0], os.environ.get(image.env) or image.name, *inside[1:]]
    return argv


def container_launch(spec: EngineSpec, runtime: str) -> LaunchSpec:
    """The container run as something ``LaunchedServer`` starts, polls for readiness and stops."""
    return LaunchSpec(
        tuple(container_run(spec, runtime)), spec.host, spec.port, {}, spec.ready_timeout_s,
        f"{spec.backend} ({runtime})",
    )
