"""The command lines README.md and docs/*.md show work as written: every `--flag` of a `cnnpar <sub> ...` command
(a fenced block's line, or an inline code span) is a flag of that subcommand, and every flag of a
`python benchmarks/<script>.py ...` line is one of that script's. A user copies these lines; a renamed or
misspelt flag there fails only when they run it."""

from __future__ import annotations

import argparse
import re
import subprocess
import sys

import pytest

from tests.conftest import REPO, cli_env

DOCS = ["README.md", *sorted(str(p.relative_to(REPO)) for p in (REPO / "docs").glob("*.md"))]
FLAG = re.compile(r"(?<![\w-])(--[a-z][a-z0-9-]*)")


def code_lines(text: str) -> list[tuple[int, str, bool]]:
    """(line number, code, whether it is a block's line) for every line of a fenced or indented block
    (continuations joined, `# comments` cut) and every inline code span elsewhere."""
    out, fenced, indented, pending, before = [], False, False, "", ""
    for n, line in enumerate(text.splitlines(), 1):
        if line.lstrip().startswith("```"):
            fenced = not fenced
            continue
        # an indented block (docs/decoding.md's commands) starts after a blank line; a list item's
        # continuation lines are indented too, but follow its text
        indented = line.startswith("    ") and (indented or not before.strip())
        before = line
        if fenced or indented:
            code = re.split(r"\s#\s", line, maxsplit=1)[0]
            if code.rstrip().endswith("\\"):
                pending += code.rstrip()[:-1] + " "
                continue
            out.append((n, pending + code, True))
            pending = ""
        else:
            out.extend((n, span, False) for span in re.findall(r"`([^`]+)`", line))
    return out


def commands(prefix: str, suffix: str = "") -> list[tuple[str, int, str, str, bool]]:
    """(doc, line, name, the rest, whether in a block) for each `<prefix><name><suffix> ...` in the docs' code."""
    found = []
    for doc in DOCS:
        for n, code, block in code_lines((REPO / doc).read_text()):
            for m in re.finditer(rf"(?<![\w./-]){re.escape(prefix)}(\w[\w-]*){re.escape(suffix)}(?![\w.-])(.*)", code):
                found.append((doc, n, m.group(1), m.group(2), block))
    return found


def parser_flags(parser: argparse.ArgumentParser) -> set[str]:
    return {o for a in parser._actions for o in a.option_strings}


def test_every_cnnpar_command_in_the_docs_uses_its_subcommands_flags():
    from cnnpar.cli import build_parser

    (subs,) = [a.choices for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)]
    shown = commands("cnnpar ")
    assert len(shown) > 50  # the extraction still finds the docs' commands
    wrong = []
    for doc, n, sub, rest, block in shown:
        if sub not in subs:  # an inline span may quote a message ("the older cnnpar that wrote ..."): blocks only
            wrong += [f"{doc}:{n}: cnnpar {sub}: no such subcommand"] if block else []
            continue
        known = parser_flags(subs[sub])
        wrong += [f"{doc}:{n}: cnnpar {sub} {f}" for f in FLAG.findall(rest) if f not in known]
    assert not wrong, "flags the docs show that the subcommand does not take:\n" + "\n".join(wrong)


@pytest.mark.parametrize("script", sorted({s for _, _, s, r, _ in commands("benchmarks/", ".py") if FLAG.search(r)}))
def test_every_benchmark_command_in_the_docs_uses_its_scripts_flags(script):
    shown = [(doc, n, rest) for doc, n, s, rest, _ in commands("benchmarks/", ".py") if s == script]
    helped = subprocess.run(
        [sys.executable, f"benchmarks/{script}.py", "--help"], cwd=REPO, env=cli_env(), capture_output=True, text=True
    )
    assert helped.returncode == 0, helped.stderr
    known = set(FLAG.findall(helped.stdout))
    wrong = [f"{doc}:{n}: {f}" for doc, n, rest in shown for f in FLAG.findall(rest) if f not in known]
    assert not wrong, f"flags the docs show that benchmarks/{script}.py does not take:\n" + "\n".join(wrong)


# the flag tables: README.md's are `cnnpar train`'s (speed switches, other training flags), docs/bench.md's the bench's
FLAG_TABLES = {"README.md": "train", "docs/bench.md": "bench"}


@pytest.mark.parametrize("doc", sorted(FLAG_TABLES))
def test_every_flag_a_docs_flag_table_names_is_its_commands(doc):
    from cnnpar.cli import build_parser

    (subs,) = [a.choices for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)]
    known, rows, in_table = parser_flags(subs[FLAG_TABLES[doc]]), [], False
    for n, line in enumerate((REPO / doc).read_text().splitlines(), 1):
        in_table = line.startswith("|") and (in_table or line.startswith("| flag |"))
        if in_table and line.startswith("| `"):
            rows.append((n, line.split(" | ")[0]))  # the first cell: the flags the row is about
    assert len(rows) > 5
    wrong = [f"{doc}:{n}: {f}" for n, cell in rows for f in FLAG.findall(cell) if f not in known]
    assert not wrong, f"flags the table names that cnnpar {FLAG_TABLES[doc]} does not take:\n" + "\n".join(wrong)
