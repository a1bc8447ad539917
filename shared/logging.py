"""One logging setup for every Pagoda process."""

from __future__ import annotations

import logging

from shared import env

_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


def configure_logging(level: str | None = None) -> None:
    """Configure the root logger once; later calls only change the level."""
    level = (level or env.log_level()).upper()
    root = logging.getLogger()
    if not root.handlers:
        logging.basicConfig(format=_FORMAT, level=level)
    root.setLevel(level)


def get_logger(name: str) -> logging.Logger:
    return logging.getLogger(name)
