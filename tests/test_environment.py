"""docs/environment.md lists every MINIDL_* variable the code reads, and nothing else (issue 40).

"The code" is every Python and shell file of the package, the tests, the benchmarks, the examples and
CI. A new variable fails here until its row is written; a row whose variable no code names any more,
or that names a file not reading it, fails too.
"""
import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "environment.md"
NAME = re.compile(r"\bMINIDL_[A-Z0-9_]*[A-Z0-9]\b")
ROW = re.compile(r"^\| `(MINIDL_[A-Z0-9_]+)` \|(.+)\|$", re.M)


def _code_files():
    for folder in ("minidl", "tests", "benchmarks", "examples"):
        for path in sorted((ROOT / folder).rglob("*")):
            if path.suffix in (".py", ".sh") and "__pycache__" not in path.parts:
                yield path
    yield ROOT / ".ci" / "run"


def _in_code():
    """variable -> the files that name it."""
    found: dict[str, set[str]] = {}
    for path in _code_files():
        for name in NAME.findall(path.read_text(errors="replace")):
            found.setdefault(name, set()).add(path.relative_to(ROOT).as_posix())
    return found


def _rows():
    """variable -> [what it does, default, read in], from the page's table."""
    rows = {}
    for name, rest in ROW.findall(PAGE.read_text()):
        assert name not in rows, f"{name}: two rows in docs/environment.md"
        rows[name] = [cell.strip() for cell in rest.split(" | ")]
    return rows


def test_every_variable_the_code_reads_has_a_row_and_every_row_a_variable():
    code, rows = _in_code(), _rows()
    assert len(code) >= 10 and "MINIDL_DATA" in code          # the scan sees the code
    undocumented = {name: sorted(files) for name, files in code.items() if name not in rows}
    assert not undocumented, f"add these to docs/environment.md's table: {undocumented}"
    stale = sorted(set(rows) - set(code))
    assert not stale, f"docs/environment.md has rows for variables no code reads: {stale}"


def test_each_row_says_what_the_default_is_and_names_files_that_read_it():
    code = _in_code()
    for name, cells in _rows().items():
        assert len(cells) == 3 and all(cells), f"{name}: a row is | variable | what | default | read in |"
        files = re.findall(r"`([\w./-]+\.(?:py|sh))`", cells[2])
        assert files, f"{name}: the 'read in' column names no file"
        for f in files:
            assert f in code[name], f"{name}: docs/environment.md says {f} reads it; it does not"


def test_the_page_is_in_the_site_navigation():
    assert "environment.md" in (ROOT / "mkdocs.yml").read_text()
