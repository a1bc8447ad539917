"""vLLM flags users pass by habit: accepted with a note, or refused naming what to use;
and --help shows the defaults."""

from __future__ import annotations

import pytest

from shared.cli import build_parser
from shared.vllm_flags import NOTES


def parse(*argv: str):
    return build_parser(list(argv)).parse_args(list(argv))


@pytest.mark.parametrize("command", [["serve", "m"], ["worker", "--model", "m"], ["router"]])
def test_accepted_flags_leave_a_note_that_says_how_pagoda_does_it(command):
    args = parse(*command, "--trust-remote-code", "--swap-space", "4")
    notes = getattr(args, NOTES)
    assert notes[0].startswith("--trust-remote-code: not needed")
    assert notes[1].startswith("--swap-space: Pagoda recomputes preempted requests")
    assert getattr(parse(*command), NOTES) == []


def test_refused_flags_name_what_to_use_instead(capsys):
    with pytest.raises(SystemExit) as exc:
        parse("serve", "m", "--download-dir", "/x")
    assert exc.value.code == 2
    assert "--download-dir: Pagoda downloads into the Hugging Face cache" in capsys.readouterr().err


def test_help_shows_the_defaults(capsys):
    with pytest.raises(SystemExit):
        parse("serve", "--help")
    text = " ".join(capsys.readouterr().out.split())
    assert "Worker processes to start. (default: 1)" in text
    assert "Most requests running at once. (default: 256)" in text
    assert "(default: None)" not in text


def test_disable_uvicorn_access_log_turns_the_access_log_off():
    from router.config import RouterConfig
    from shared.cli_args import dataclass_from_args

    args = parse("router", "--worker=h:1", "--disable-uvicorn-access-log")
    assert dataclass_from_args(RouterConfig, args).disable_log_requests is True
    assert dataclass_from_args(RouterConfig, parse("router")).disable_log_requests is False
