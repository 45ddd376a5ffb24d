"""bench/engines/source.py: an engine's copy that lacks a file now listed is not taken for the source."""

from bench.engines import source

FILES = ["pkg/a.py", "pkg/b.py"]


def _copy(root, files):
    folder = root / "pkg-1.0"
    for name in files:
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_text("")
    (folder / source._COMPLETE).write_text("wheel\n")
    return folder


def test_a_carried_copy_lacking_a_listed_file_is_passed_over(tmp_path, monkeypatch):
    monkeypatch.setenv("PINSTAGE_ENGINE_SRC", str(tmp_path))
    folder = _copy(tmp_path, FILES[:1])  # made before pkg/b.py was listed
    carried, stale = source._carried("pkg-1.0", FILES)
    assert carried is None and stale == ["%s lacks pkg/b.py" % folder]
    _copy(tmp_path, FILES)
    assert source._carried("pkg-1.0", FILES) == (folder, [])
    # folder prefixes (SGLang's "sglang/srt/") ask only for a complete copy
    assert source._missing(folder, ["pkg/"]) == []
    assert source._missing(tmp_path / "absent", ["pkg/"]) == [source._COMPLETE]
