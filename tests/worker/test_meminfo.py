from worker.meminfo import meminfo


def test_meminfo_reads_this_machine():
    total, available = meminfo()
    assert 0 < available <= total


def test_meminfo_parses_kib_fields(tmp_path, monkeypatch):
    text = "MemTotal:       24000000 kB\nMemFree:  1 kB\nMemAvailable:   12000000 kB\n"
    path = tmp_path / "meminfo"
    path.write_text(text)
    real_open = open
    monkeypatch.setattr(
        "builtins.open",
        lambda name, *a, **k: real_open(path if name == "/proc/meminfo" else name, *a, **k),
    )
    assert meminfo() == (24000000 * 1024, 12000000 * 1024)
