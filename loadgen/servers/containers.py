"""The container form of an engine launch: the official image, the same engine arguments.

``container_argv`` is what runs inside the container (the engine's own command line from
``backends``, listening on 0.0.0.0 at the container port); ``container_run`` wraps it in
``docker run`` / ``podman run``: GPUs by device id, the port published on the address the
engine would have bound (127.0.0.1 unless told otherwise), the Hugging Face cache and any
local checkpoint mounted, ``HF_TOKEN`` passed by name (its value never appears).

The compose files in ``docker/`` get their engine command from ``loadgen serve ... --container
docker --print-argv`` run in the loadgen image, so the flags come from this one place.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from loadgen.errors import UsageError
from loadgen.servers.commands import launch_spec
from loadgen.servers.launch import LaunchSpec
from loadgen.servers.spec import EngineSpec
from loadgen.servers.tgi import TGI_IMAGE

RUNTIMES: tuple[str, ...] = ("docker", "podman")


@dataclass(frozen=True, slots=True)
class Image:
    """An engine's official image and how its server is started inside it."""

    name: str
    env: str  # the environment variable that overrides the image (also in docker/*.yaml)
    head: tuple[str, ...]  # the command that replaces the launch's interpreter / binary
    hf_cache: str  # where the image expects the Hugging Face cache
    port: int  # the port the server listens on inside the container


IMAGES: dict[str, Image] = {
    "vllm": Image("vllm/vllm-openai:v0.11.0", "VLLM_IMAGE", ("vllm", "serve"), "/root/.cache/huggingface", 8000),
    "vllm-cpu": Image(
        "public.ecr.aws/q9t5s3a7/vllm-cpu-release-repo:v0.11.0", "VLLM_CPU_IMAGE",
        ("python3", "-m", "vllm.entrypoints.openai.api_server"), "/root/.cache/huggingface", 8000,
    ),
    "sglang": Image(
        "lmsysorg/sglang:v0.5.19-cu129", "SGLANG_IMAGE", ("python3", "-m", "sglang.launch_server"),
        "/root/.cache/huggingface", 30000,
    ),
    "tgi": Image(TGI_IMAGE, "TGI_IMAGE", ("text-generation-launcher",), "/data", 80),
}


def image_for(spec: EngineSpec) -> Image:
    key = "vllm-cpu" if spec.backend == "vllm" and spec.device == "cpu" else spec.backend
    if key not in IMAGES:
        raise UsageError(
            f"--container: no official image is known for --backend {spec.backend}; "
            f"use one of vllm, sglang, tgi, or run it without --container"
        )
    return IMAGES[key]


def _head_length(spec: EngineSpec, launch: LaunchSpec) -> int:
    """How many leading words of the host command the image's own command replaces."""
    argv = launch.argv
    if spec.backend == "vllm" and spec.device != "cpu":
        return 2  # vllm serve
    if argv[1:2] == ("-m",):
        return 3  # python -m module
    return 1


def container_argv(spec: EngineSpec) -> list[str]:
    """The engine's command line inside its official image."""
    image = image_for(spec)
    launch = launch_spec(spec)
    args = list(launch.argv[_head_length(spec, launch):])
    host_flag = "--hostname" if spec.backend == "tgi" else "--host"
    args[args.index(host_flag) + 1] = "0.0.0.0"
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
    if spec.backend in ("vllm", "sglang"):
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
