"""The CPU kernels' build folder: one per source content, shared by checkouts."""

from __future__ import annotations

import shutil

import kernels.cpu as cpu


def test_same_source_in_another_checkout_shares_the_folder(tmp_path, monkeypatch):
    monkeypatch.setenv("PAGODA_KERNEL_CACHE", str(tmp_path / "cache"))
    here = cpu._build_dir()
    assert cpu._build_dir() == here  # stable
    copy = tmp_path / "other-checkout" / cpu._SOURCES[0].name
    copy.parent.mkdir()
    shutil.copy(cpu._SOURCES[0], copy)
    monkeypatch.setattr(cpu, "_SOURCES", [copy, *cpu._SOURCES[1:]])
    assert cpu._build_dir() == here


def test_another_python_environment_gets_its_own_folder(tmp_path, monkeypatch):
    monkeypatch.setenv("PAGODA_KERNEL_CACHE", str(tmp_path / "cache"))
    here = cpu._build_dir()
    monkeypatch.setattr(cpu, "_toolchain", lambda: "/other/venv|3.11.7|/other/torch|2.13.0")
    assert cpu._build_dir() != here


def test_changed_source_gets_its_own_folder(tmp_path, monkeypatch):
    monkeypatch.setenv("PAGODA_KERNEL_CACHE", str(tmp_path / "cache"))
    here = cpu._build_dir()
    copy = tmp_path / "edited" / cpu._SOURCES[0].name
    copy.parent.mkdir()
    copy.write_bytes(cpu._SOURCES[0].read_bytes() + b"\n// edited\n")
    monkeypatch.setattr(cpu, "_SOURCES", [copy, *cpu._SOURCES[1:]])
    assert cpu._build_dir() != here


def test_sources_compile_from_a_copy_inside_the_folder(tmp_path, monkeypatch):
    # ninja's command names these paths: they must not depend on the checkout.
    monkeypatch.setenv("PAGODA_KERNEL_CACHE", str(tmp_path / "cache"))
    build_dir = cpu._build_dir()
    staged = cpu._staged_sources(build_dir)
    assert staged == [build_dir / "src" / s.name for s in cpu._SOURCES]
    assert all(p.read_bytes() == s.read_bytes() for p, s in zip(staged, cpu._SOURCES))
    for header in cpu._HEADERS:
        assert (build_dir / "src" / header.name).read_bytes() == header.read_bytes()


def test_a_source_edited_after_the_folder_was_chosen_stays_out_of_it(tmp_path, monkeypatch):
    # A load waiting on another process's build stages the bytes its folder is keyed by,
    # not what the checkout holds by then.
    monkeypatch.setenv("PAGODA_KERNEL_CACHE", str(tmp_path / "cache"))
    copy = tmp_path / "checkout" / cpu._SOURCES[0].name
    copy.parent.mkdir()
    copy.write_bytes(cpu._SOURCES[0].read_bytes())
    monkeypatch.setattr(cpu, "_SOURCES", [copy, *cpu._SOURCES[1:]])
    contents = cpu._read_sources()
    build_dir = cpu._build_dir(contents=contents)
    copy.write_bytes(copy.read_bytes() + b"\n// edited while waiting for the lock\n")
    staged = cpu._staged_sources(build_dir, contents=contents)
    assert staged[0].read_bytes() == contents[copy.name]
    assert cpu._build_dir() != build_dir  # the edit gets a folder of its own
