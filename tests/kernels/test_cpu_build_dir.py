"""The CPU kernels' build folder: one per source content and checkout."""

from __future__ import annotations

import shutil

import kernels.cpu as cpu


def test_same_source_in_another_checkout_builds_in_its_own_folder(tmp_path, monkeypatch):
    monkeypatch.setenv("PAGODA_KERNEL_CACHE", str(tmp_path / "cache"))
    here = cpu._build_dir()
    assert cpu._build_dir() == here  # stable
    copy = tmp_path / "other-checkout" / cpu._SOURCES[0].name
    copy.parent.mkdir()
    shutil.copy(cpu._SOURCES[0], copy)
    monkeypatch.setattr(cpu, "_SOURCES", [copy])
    # ninja's build command names the source path: sharing a folder would make each
    # checkout rebuild the other's kernel on every load.
    assert cpu._build_dir() != here
