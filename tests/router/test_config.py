"""Router and serve flags: one flag per config field, vLLM's names, defaults that let
`pagoda serve MODEL` run with nothing else, and workers getting the engine flags."""

from __future__ import annotations

import argparse
import dataclasses
import socket

import pytest

from router.config import DEFAULT_HTTP_PORT, RouterConfig
from router.serve import ServeConfig, worker_flags
from shared.cli import build_parser
from shared.cli_args import dataclass_from_args
from shared.errors import ConfigError
from worker.config import EngineConfig
from worker.service.config import WorkerServiceConfig


def flags(parser: argparse.ArgumentParser) -> set[str]:
    return {s for a in parser._actions for s in a.option_strings}


def subparser(argv: list[str]) -> argparse.ArgumentParser:
    parser = build_parser(argv)
    action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return action.choices[argv[0]]


def test_every_router_field_is_one_flag_with_vllm_names():
    router_flags = flags(subparser(["router"]))
    for field in dataclasses.fields(RouterConfig):
        assert "--" + field.name.replace("_", "-") in router_flags
    vllm = {
        "--host",
        "--port",
        "--api-key",
        "--served-model-name",
        "--chat-template",
        "--tokenizer",
    }
    assert vllm <= router_flags


def test_serve_needs_only_a_model(monkeypatch):
    monkeypatch.delenv("REDIS_URL", raising=False)
    args = subparser(["serve"]).parse_args(["some/model"])
    assert args.model == "some/model" and args.port == DEFAULT_HTTP_PORT
    assert dataclass_from_args(ServeConfig, args).num_workers == 1
    assert dataclass_from_args(RouterConfig, args).redis_url is None  # the embedded store


def test_workers_get_the_engine_flags_serve_was_given():
    argv = ["m", "--block-size=8", "--no-enable-prefix-caching", "--max-num-seqs=3"]
    argv += ["--kv-cache-memory=1GiB", "--served-model-name=x", "--heartbeat-ttl=3"]
    argv += ["--stream-interval=4"]
    args = subparser(["serve"]).parse_args(argv)
    engine = EngineConfig.from_cli_args(args)
    service = dataclass_from_args(WorkerServiceConfig, args)
    child = subparser(["worker"]).parse_args(worker_flags(engine, service))
    child_engine = EngineConfig.from_cli_args(child)
    # Everything arrives as given (cores are per child: WorkerChildren adds them).
    assert child_engine == engine
    child_service = dataclass_from_args(WorkerServiceConfig, child)
    assert (child_service.heartbeat_ttl, child_service.stream_interval) == (3, 4)


@pytest.mark.parametrize(
    "overrides, message",
    [
        ({"port": 70000}, "--port must be in"),
        ({"routing_policy": "random"}, "--routing-policy must be one of"),
        ({"choice_ttl": 0}, "--choice-ttl must be > 0"),
        ({"max_attempts": 0}, "--max-attempts must be > 0"),
        ({"redis_prefix": ""}, "--redis-prefix must not be empty"),
    ],
)
def test_invalid_router_values_are_refused(overrides, message):
    with pytest.raises(ConfigError, match=message):
        RouterConfig(**overrides)


def test_choice_ttl_defaults_by_store():
    assert RouterConfig(redis_url=None).effective_choice_ttl == 300
    assert RouterConfig(redis_url="redis://r:6379/0").effective_choice_ttl == 10
    assert RouterConfig(redis_url=None, choice_ttl=5).effective_choice_ttl == 5


def test_tensor_parallel_workers_get_a_core_per_rank():
    from router.worker_children import WorkerChildren

    assign = WorkerChildren._assign_cores
    # Enough cores: disjoint, two per worker.
    assert assign(2, "cpu", "0-3", [None, None], 2) == [[0, 1], [2, 3]]
    # Two cores for two TP=2 workers: each gets both, shared.
    assert assign(2, "cpu", "0,1", [None, None], 2) == [[0, 1], [0, 1]]


def test_serve_holds_its_workers_ports_until_they_are_killed():
    from router.worker_children import WorkerChildren

    children = WorkerChildren(2, [], None, "test:", device="cpu")
    ports = children.ports + children.metrics_ports
    assert len(set(ports)) == 4
    for port in ports:
        with socket.socket() as s, pytest.raises(OSError):
            s.bind(("127.0.0.1", port))
    children.kill()  # no process started: only the ports go
    for port in ports:
        with socket.socket() as s:
            s.bind(("127.0.0.1", port))
