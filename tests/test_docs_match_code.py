"""The documented signals, exit statuses, settings and links are the code's own.

Tables written by hand drift (issue #12 found the README saying both 3 and
69 for one exit status; issue #13 found three signal tables that disagreed).
Each table now exists once, under docs/reference/, and these tests compare
it with what the code acts on: the signal dispositions each entry point
installs, every ``EX_*`` constant in the source, every setting and every
parent-only topology key. The last test follows every relative link of
README.md and docs/ to a file (and heading) that exists.
"""

from __future__ import annotations

import dataclasses
import json
import re
import signal
import subprocess
import sys
from pathlib import Path

from supervisor import cli as swarm_cli
from supervisor.exits import EX_BOOT, EX_CRASH, EX_OK
from supervisor.remote import SIGNAL_COMMANDS
from supervisor.swarm import EX_KILLED
from supervisor.topology import SLOT_KEYS, SWARM_KEYS
from wurk import admin
from wurk import cli as wurk_cli
from wurk.runtime.heartbeat import REMOTE_SIGNALS
from wurk.settings.config import Config, settable_fields

ROOT = Path(__file__).resolve().parent.parent
REFERENCE = ROOT / "docs" / "reference"
SIGNALS_DOC = (REFERENCE / "signals-and-exit-codes.md").read_text(encoding="utf-8")
SETTINGS_DOC = (REFERENCE / "settings.md").read_text(encoding="utf-8")
TOPOLOGY_DOC = (REFERENCE / "topology.md").read_text(encoding="utf-8")
DOCS = [ROOT / "README.md", ROOT / "deploy" / "README.md",
        *sorted((ROOT / "docs").rglob("*.md"))]


def table_after(text: str, marker: str) -> list[list[str]]:
    """The rows (cells) of the first Markdown table after ``marker``."""
    start = text.index(marker)
    rows: list[list[str]] = []
    for line in text[start:].splitlines()[1:]:
        if line.startswith("|"):
            rows.append([cell.strip() for cell in line.strip("|").split("|")])
        elif rows:
            break
    return rows[2:]  # past the header and its rule


def signal_names(cell: str) -> set[str]:
    return set(re.findall(r"`([A-Z0-9]+)`", cell))


def signal_rows() -> dict[str, dict[str, str]]:
    """Signal name -> its cells, by column: run, parent, child, remote."""
    rows = table_after(SIGNALS_DOC, "## Signals")
    return {name: dict(zip(("run", "parent", "child", "remote"), cells, strict=True))
            for names, *cells in rows for name in signal_names(names)}


def name_of(signum: int) -> str:
    return signal.Signals(signum).name.removeprefix("SIG")


# What the wurk run (and child) column says first for each signal it handles.
# A signal wurk run starts handling needs a row here and in the docs.
RUN_EFFECT = {"TERM": "stop", "INT": "stop", "TSTP": "quiet",
              "TTIN": "log the stack of every thread"}
# What the parent column says first for each command of its dispatch table.
EFFECT = {"shutdown": "drain", "quiet": "quiet", "restart": "rolling restart",
          "more": "one more child", "fewer": "one fewer child", "status": "log each child"}


def child_dispositions() -> dict[str, str]:
    """What a swarm child does with each signal: handled, ignored or default.

    Read in a fresh interpreter from the child's own set-up function, so the
    table is compared with what a child installs rather than with a copy.
    """
    script = (
        "import json, signal\n"
        "from supervisor.child_boot import MANAGED_SIGNALS, _own_signals\n"
        "_own_signals()\n"
        "def kind(h):\n"
        "    return 'ignored' if h is signal.SIG_IGN else 'default' if h in "
        "(signal.SIG_DFL, None) else 'handled'\n"
        "print(json.dumps({s.name[3:]: kind(signal.getsignal(s)) for s in MANAGED_SIGNALS}))\n"
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         check=True, timeout=30, cwd=ROOT).stdout
    dispositions: dict[str, str] = json.loads(out)
    return dispositions


def test_every_signal_any_entry_point_handles_has_one_row() -> None:
    handled = ({name_of(n) for n in swarm_cli.COMMANDS}
               | {name_of(n) for n in wurk_cli.HANDLED_SIGNALS}
               | set(child_dispositions()))
    assert set(signal_rows()) == handled
    assert SIGNALS_DOC.count("| signal |") == 1  # one signal table, not one per program


def test_the_swarm_signal_table_is_the_parents_dispatch_table() -> None:
    documented = {name: cells["parent"] for name, cells in signal_rows().items()}
    handled = {name_of(n): c for n, c in swarm_cli.COMMANDS.items()}
    assert set(documented) == set(handled)
    for name, command in handled.items():
        assert documented[name].startswith(EFFECT[command]), (name, command, documented[name])


def test_the_wurk_run_signal_table_is_what_wurk_run_handles() -> None:
    handled = {name_of(n) for n in wurk_cli.HANDLED_SIGNALS}
    assert set(RUN_EFFECT) == handled
    for name, cells in signal_rows().items():
        expected = RUN_EFFECT[name] if name in handled else "not handled"
        assert cells["run"].startswith(expected), (name, cells["run"])


def test_the_child_column_is_what_a_child_installs() -> None:
    rows = signal_rows()
    for name, kind in child_dispositions().items():
        cell = rows[name]["child"]
        expected = {"ignored": "ignored", "default": "not handled"}.get(kind)
        assert cell.startswith(expected or RUN_EFFECT[name]), (name, kind, cell)


def test_the_through_redis_column_names_who_obeys_a_remote_signal() -> None:
    for name, cells in signal_rows().items():
        remote = cells["remote"]
        assert ("process" in remote) == (name in REMOTE_SIGNALS), (name, remote)
        assert ("swarm" in remote) == (name in SIGNAL_COMMANDS), (name, remote)
        if name in SIGNAL_COMMANDS:  # a remote signal means what the real one means
            assert SIGNAL_COMMANDS[name] == swarm_cli.COMMANDS[signal.Signals[f"SIG{name}"]]


def exit_rows() -> list[tuple[int, str, str, str]]:
    return [(int(status), program, constant.strip("`"), when)
            for status, program, constant, when in table_after(SIGNALS_DOC, "## Exit statuses")]


def statuses(program: str) -> set[int]:
    return {status for status, who, _, _ in exit_rows() if who == program}


def test_the_documented_exit_statuses_are_the_codes_constants() -> None:
    assert statuses("`wurk-swarm`") == {0, EX_KILLED, EX_BOOT, swarm_cli.EX_CONFIG}
    assert statuses("`wurk run`") == {0, wurk_cli.EX_CONFIG, wurk_cli.EX_SOFTWARE,
                                      wurk_cli.EX_OVERRAN}
    assert statuses("swarm child") == {EX_OK, EX_BOOT, EX_CRASH}
    assert statuses("admin commands") == {0, admin.EX_FAILED, admin.EX_USAGE, admin.EX_CONFIG}
    for path in DOCS:
        text = path.read_text(encoding="utf-8")
        assert "exit 3" not in text and "status 3 " not in text and "(3, " not in text, path


def test_every_exit_status_the_prose_mentions_is_in_the_table() -> None:
    documented = {status for status, *_ in exit_rows()}
    mention = re.compile(r'(?<!")\b(?:exits?|exit status|status) (\d+)\b')
    for path in DOCS:
        mentioned = {int(n) for n in mention.findall(path.read_text(encoding="utf-8"))}
        assert mentioned <= documented, (path.relative_to(ROOT), mentioned - documented)


def source_constants() -> set[tuple[str, int]]:
    """Every ``EX_NAME = N`` in wurk/ and supervisor/, wherever a module lives."""
    found = set()
    for package in ("wurk", "supervisor"):
        for path in (ROOT / package).rglob("*.py"):
            for name, value in re.findall(r"^(EX_[A-Z_]+) *= *(\d+)", path.read_text(),
                                          re.MULTILINE):
                found.add((name, int(value)))
    return found


def test_every_exit_constant_has_a_row_with_its_number() -> None:
    in_code = source_constants()
    documented = {(constant, status) for status, _, constant, _ in exit_rows() if constant}
    assert {name for name, _ in in_code} == {name for name, _ in documented}
    assert documented <= in_code, documented - in_code
    for name, value in in_code:
        assert (name, value) in documented, (name, value)


def test_every_setting_has_a_row_in_the_settings_table_with_its_default() -> None:
    rows = table_after(SETTINGS_DOC, "# Settings\n")
    documented = {re.sub(r"`", "", key): default for key, _kind, default, *_ in rows}
    assert set(documented) == settable_fields()
    defaults = Config(redis_url="redis://localhost:6379/0")
    for field in dataclasses.fields(Config):
        shown = documented.get(field.name)
        value = getattr(defaults, field.name)
        if shown is None or value is None or isinstance(value, list | bool):
            continue
        assert shown.strip("`\"").startswith(str(value).rstrip("0").rstrip(".")
                                             if isinstance(value, float) else str(value)), \
            (field.name, shown, value)


def test_the_topology_page_lists_every_parent_and_slot_key() -> None:
    rows = table_after(SETTINGS_DOC, "## The swarm parent's keys")
    assert {key.strip("`") for key, *_ in rows} == SWARM_KEYS
    start = TOPOLOGY_DOC.index("## A `[[slot]]` table")
    slot_section = TOPOLOGY_DOC[start:TOPOLOGY_DOC.index("\n## ", start + 1)]
    assert set(re.findall(r"`([a-z_]+)`", slot_section)) >= SLOT_KEYS


# -- links ---------------------------------------------------------------------------

LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^```.*?^```", re.MULTILINE | re.DOTALL)


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to dashes."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    text = FENCE.sub("", path.read_text(encoding="utf-8"))
    return {slug(line.lstrip("#")) for line in text.splitlines() if line.startswith("#")}


def has_anchor(path: Path, anchor: str) -> bool:
    return path.suffix != ".md" or anchor in anchors(path)


def broken_links(path: Path) -> list[str]:
    broken = []
    for target in LINK.findall(FENCE.sub("", path.read_text(encoding="utf-8"))):
        if re.match(r"[a-z]+:", target):
            continue  # http(s), mailto: not ours to check offline
        file_part, _, anchor = target.partition("#")
        linked = (path.parent / file_part).resolve() if file_part else path
        if not linked.exists() or (anchor and not has_anchor(linked, anchor)):
            broken.append(target)
    return broken


def test_every_relative_link_in_the_docs_resolves() -> None:
    assert len(DOCS) > 10
    for path in DOCS:
        assert broken_links(path) == [], path.relative_to(ROOT)


def test_the_link_checker_catches_a_missing_file_and_a_missing_anchor(tmp_path: Path) -> None:
    (tmp_path / "a.md").write_text("# Title here\n\n## The `[wurk]` table\n")
    page = tmp_path / "b.md"
    page.write_text("[ok](a.md#the-wurk-table) [ok](#local) [gone](c.md) [bad](a.md#nope)\n"
                    "## Local\n```\n[in code](nowhere.md)\n```\n")
    assert broken_links(page) == ["c.md", "a.md#nope"]


# Paths the docs name in code spans (`wurk/runtime/fetch.py`): a rename that
# leaves a page pointing at a file that is gone is caught here.
_PATH_SPAN = re.compile(r"`((?:wurk|supervisor|tests|bench|deploy|docs|examples|scripts)"
                        r"/[A-Za-z0-9_./-]*[A-Za-z0-9_/])`")


def test_every_path_the_docs_name_exists() -> None:
    missing = []
    for doc in [*DOCS, ROOT / "bench" / "README.md", ROOT / "CHANGELOG.md"]:
        if doc.name == "CHANGELOG.md":
            continue  # history: it may name what was since renamed
        for number, line in enumerate(doc.read_text(encoding="utf-8").splitlines(), 1):
            for named in _PATH_SPAN.findall(line):
                # `wurk/redis/` names a folder; `tests/test_x.py::name` a test in a file.
                if not (ROOT / named.split("::")[0]).exists():
                    missing.append((f"{doc.relative_to(ROOT)}:{number}", named))
    # Folders a run makes and git ignores (bench/results/) are not renames.
    ignored = subprocess.run(["git", "check-ignore", "--no-index", "--stdin"], cwd=ROOT,
                             input="\n".join(named for _, named in missing), text=True,
                             capture_output=True, check=False).stdout.split()
    assert [f"{where}: {named}" for where, named in missing if named not in ignored] == []
