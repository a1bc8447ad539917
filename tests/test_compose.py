"""compose.yaml and the Dockerfile: a real compose implementation accepts the file (when
one is installed), and every command line in it parses with Pagoda's own CLI."""

from __future__ import annotations

import copy
import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from shared.cli import build_parser

ROOT = Path(__file__).resolve().parents[1]
COMPOSE = ROOT / "compose.yaml"
PAGODA_SERVICES = ("router", "worker-0", "worker-1")
MONITORING_SERVICES = ("prometheus", "grafana")
MONITORING = ROOT / "docs" / "monitoring"


def compose_command() -> list[str] | None:
    if shutil.which("docker"):
        probe = subprocess.run(["docker", "compose", "version"], capture_output=True, timeout=30)
        if probe.returncode == 0:
            return ["docker", "compose"]
    if shutil.which("docker-compose"):
        return ["docker-compose"]
    return None


def load_compose() -> dict:
    # ${VAR:-default} as compose expands it with VAR unset.
    text = re.sub(r"\$\{[A-Z_]+:-([^}]*)\}", r"\1", COMPOSE.read_text())
    return yaml.safe_load(text)


def parse_error(argv: list[str]) -> str | None:
    """What `pagoda ARGV` says is wrong with its flags, or None when they parse."""
    try:
        build_parser(argv).parse_args(argv)
    except SystemExit as exc:
        return f"`pagoda {' '.join(argv)}` does not parse (exit {exc.code})"
    return None


def test_a_real_compose_implementation_accepts_the_file():
    command = compose_command()
    if command is None:
        pytest.skip("no compose implementation here (docker compose or docker-compose)")
    result = subprocess.run(
        [*command, "-f", str(COMPOSE), "config", "-q"], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr


def test_every_command_line_parses_with_the_real_cli():
    services = load_compose()["services"]
    for name in PAGODA_SERVICES:
        command = services[name]["command"]
        assert command[0] in ("router", "worker"), name
        assert parse_error(command) is None, name


def test_the_check_fails_on_a_flag_the_cli_lacks():
    command = copy.deepcopy(load_compose()["services"]["router"]["command"])
    assert parse_error(command) is None
    assert parse_error([*command, "--no-such-flag=1"]) is not None


def test_redis_router_and_two_gpu_workers_with_healthchecks():
    services = load_compose()["services"]
    assert set(services) == {"redis", *PAGODA_SERVICES, *MONITORING_SERVICES}
    for name, service in services.items():
        if name in MONITORING_SERVICES:
            continue
        assert service["healthcheck"]["test"][0] == "CMD", name
    for name in PAGODA_SERVICES:
        assert services[name]["environment"]["REDIS_URL"] == "redis://redis:6379/0"
        assert services[name]["depends_on"]["redis"]["condition"] == "service_healthy"
    for name in ("worker-0", "worker-1"):
        devices = services[name]["deploy"]["resources"]["reservations"]["devices"]
        assert devices == [{"driver": "nvidia", "count": 1, "capabilities": ["gpu"]}]
        # Routers dial the address a worker registers: the service name, not a container id.
        assert f"--advertise-address={name}:50051" in services[name]["command"]
    assert "8000:8000" in services["router"]["ports"]


def test_the_dockerfile_copies_every_package():
    dockerfile = (ROOT / "Dockerfile").read_text()
    pyproject = (ROOT / "pyproject.toml").read_text()
    packages = re.search(r"include = \[([^\]]*)\]", pyproject).group(1)
    for package in re.findall(r'"(\w+)\*"', packages):
        assert re.search(rf"^COPY {package} {package}$", dockerfile, re.MULTILINE), package
    assert 'ENTRYPOINT ["pagoda"]' in dockerfile


def test_the_monitoring_profile_scrapes_what_the_services_serve():
    services = load_compose()["services"]
    for name in MONITORING_SERVICES:
        assert services[name]["profiles"] == ["monitoring"]
        for volume in services[name]["volumes"]:
            assert (ROOT / volume.split(":")[0]).exists(), volume
    targets = {
        job["job_name"]: job["static_configs"][0]["targets"]
        for job in yaml.safe_load((MONITORING / "prometheus.yml").read_text())["scrape_configs"]
    }
    assert targets["pagoda-router"] == ["router:8000"]
    assert targets["pagoda-workers"] == ["worker-0:9100", "worker-1:9100"]
    for name in ("worker-0", "worker-1"):
        assert "--metrics-port=9100" in services[name]["command"]


def test_the_dashboard_asks_only_for_series_pagoda_serves():
    from prometheus_client import CollectorRegistry

    from router.metrics import RouterMetrics
    from worker.service.metrics import WorkerMetrics

    worker = CollectorRegistry()
    WorkerMetrics(worker, "m", 1024)
    suffixes = {"counter": ("_total",), "histogram": ("_bucket", "_sum", "_count"), "gauge": ("",)}
    served = {
        family.name + suffix
        for registry in (worker, RouterMetrics().registry)
        for family in registry.collect()
        for suffix in suffixes[family.type]
    }
    dashboard = json.loads((MONITORING / "grafana" / "pagoda-dashboard.json").read_text())
    exprs = [t["expr"] for panel in dashboard["panels"] for t in panel["targets"]]
    asked = {name for expr in exprs for name in re.findall(r"(?:vllm:|pagoda_router_)\w+", expr)}
    assert any(name.startswith("vllm:") for name in asked)
    assert asked <= served, asked - served


def test_the_image_builds_the_cpu_kernels_and_leaves_local_clutter_out():
    dockerfile = (ROOT / "Dockerfile").read_text()
    install = dockerfile.index("RUN pip install --no-cache-dir .")
    assert dockerfile.index("RUN pagoda build-kernels") > install
    assert "ENV PAGODA_KERNEL_CACHE=" in dockerfile
    ignored = (ROOT / ".dockerignore").read_text().split()
    assert {".venv", "venv", ".git", "tests"} <= set(ignored)
