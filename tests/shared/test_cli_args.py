from __future__ import annotations

import argparse
import dataclasses

import pytest

from shared.cli_args import parse_bytes
from worker.config import EngineConfig


@pytest.mark.parametrize(
    "text, value",
    [
        ("4GiB", 4 * 2**30),
        ("512MiB", 512 * 2**20),
        ("2GB", 2 * 10**9),
        ("1024", 1024),
        ("1.5 GiB", 3 * 2**29),
    ],
)
def test_parse_bytes(text, value):
    assert parse_bytes(text) == value


def test_parse_bytes_rejects_garbage():
    with pytest.raises(argparse.ArgumentTypeError, match="not a memory size"):
        parse_bytes("lots")


def test_every_config_field_is_one_flag_and_round_trips():
    parser = argparse.ArgumentParser()
    EngineConfig.add_cli_args(parser)
    args = parser.parse_args(
        [
            "m",
            "--block-size",
            "8",
            "--no-enable-prefix-caching",
            "--kv-cache-memory",
            "1GiB",
            "--max-num-seqs",
            "3",
            "--scheduling-policy",
            "priority",
            "--dtype",
            "float32",
        ]
    )
    config = EngineConfig.from_cli_args(args)
    assert config.model.model == "m"
    assert config.cache.block_size == 8 and config.cache.enable_prefix_caching is False
    assert config.cache.kv_cache_memory == 2**30
    assert config.scheduler.max_num_seqs == 3 and config.scheduler.scheduling_policy == "priority"
    flags = {a.dest for a in parser._actions}
    for group in EngineConfig.group_classes():
        for field in dataclasses.fields(group):
            assert field.name in flags, field.name


def test_invalid_config_values_are_refused():
    from shared.errors import ConfigError

    with pytest.raises(ConfigError, match="--block-size must be > 0"):
        EngineConfig.from_kwargs(model="m", block_size=0)
    with pytest.raises(ConfigError, match="unknown engine option 'blocksize'"):
        EngineConfig.from_kwargs(model="m", blocksize=4)
