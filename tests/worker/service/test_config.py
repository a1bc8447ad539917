"""Service flags map onto WorkerServiceConfig; bad values fail at start with the flag's name."""

from __future__ import annotations

import argparse
import socket

import pytest

from shared.cli import build_parser
from shared.cli_args import dataclass_from_args
from shared.errors import ConfigError
from worker.config import EngineConfig
from worker.service.config import WorkerServiceConfig, resolve_identity


def parse(*argv: str) -> argparse.Namespace:
    argv = ["worker", "--model", "m", *argv]
    return build_parser(argv).parse_args(argv)


def test_flags_fill_both_configs(monkeypatch):
    monkeypatch.setenv("REDIS_URL", "redis://example:6379/1")
    args = parse(
        "--port", "0", "--max-waiting", "3", "--drain-timeout", "2.5", "--block-size", "8",
        "--stream-interval", "4",
    )  # fmt: skip
    config = dataclass_from_args(WorkerServiceConfig, args)
    assert config.port == 0 and config.max_waiting == 3 and config.drain_timeout == 2.5
    assert config.stream_interval == 4
    assert config.redis_url == "redis://example:6379/1"  # from the environment by default
    assert EngineConfig.from_cli_args(args).cache.block_size == 8
    args = parse("--redis-url", "redis://other:1/0", "--worker-id", "w7")
    config = dataclass_from_args(WorkerServiceConfig, args)
    assert config.redis_url == "redis://other:1/0" and config.worker_id == "w7"


@pytest.mark.parametrize(
    "field, value, flag",
    [
        ("port", 70000, "--port"),
        ("heartbeat_ttl", 0, "--heartbeat-ttl"),
        ("max_waiting", 0, "--max-waiting"),
        ("drain_timeout", -1, "--drain-timeout"),
        ("stream_interval", 0, "--stream-interval"),
        ("redis_prefix", "", "--redis-prefix"),
    ],
)
def test_bad_values_name_their_flag(field, value, flag):
    with pytest.raises(ConfigError, match=flag):
        WorkerServiceConfig(**{field: value, "redis_url": None})


def test_identity_defaults_and_overrides():
    wildcard = resolve_identity(WorkerServiceConfig(redis_url=None), 5000, epoch=1)
    assert wildcard.address == f"{socket.gethostname()}:5000"
    assert wildcard.worker_id == f"{socket.gethostname()}-5000"
    local = resolve_identity(WorkerServiceConfig(host="127.0.0.1", redis_url=None), 5001, epoch=2)
    assert local.address == "127.0.0.1:5001" and local.epoch == 2
    ipv6 = resolve_identity(WorkerServiceConfig(host="::1", redis_url=None), 5002, epoch=3)
    assert ipv6.address == "[::1]:5002"
    given = WorkerServiceConfig(advertise_address="w.internal:9", worker_id="w", redis_url=None)
    identity = resolve_identity(given, 5003, epoch=4)
    assert (identity.worker_id, identity.address) == ("w", "w.internal:9")
