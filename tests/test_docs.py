"""The README and docs/ hold together: the README stays a page people read (at most 15 KB,
linking every docs page; the map, docs/architecture.md, links every design page), every
relative link lands on a file and a heading that exist, every citation of the docs in code
(`docs/design/runs.md, "Runs", "Fencing"`) names a page and a section it has, and the `make`
targets, `trainctl` commands and options, repository paths and service settings the pages
quote are the ones the code has, and the tests docs/extending.md names as a recipe's proof are
tests `make test` runs (tests/support/make_test.py).

Commands are resolved in process against the CLI's click tree (`typer.main.get_command`), so
the check costs no subprocess per command."""

from __future__ import annotations

import ast
import io
import json
import re
import tokenize
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import typer.main

from tests.support.make_test import make_test_selection, why_not_run
from trainctl.service.cli import app
from trainctl.service.settings import Settings
from trainctl.store.worker_settings import WorkerSettings

REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"
DOCS = REPO / "docs"
DESIGN = DOCS / "design"
MAP = DOCS / "architecture.md"
EXTENDING = DOCS / "extending.md"
README_MAX_BYTES = 15 * 1024

FENCE = re.compile(r"^\s*(`{3,}|~{3,})\s*([\w+-]*)")
HEADING = re.compile(r"^(#{1,6})\s+(.+?)\s*#*\s*$")
LINK = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
CODE_SPAN = re.compile(r"`+([^`]+?)`+", re.DOTALL)
SCHEME = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*:|^//")
# Fenced blocks in these languages are programs or files, not shell lines: `from trainctl
# import Client` is no command.
NOT_SHELL = {"python", "py", "toml", "yaml", "yml", "json", "ini"}
# Where a shell line stops being the trainctl command: a pipe, a list, a comment, a redirect.
COMMAND_END = re.compile(r"\s\|\s|\|\||&&|;|\s#|\s\d?>")
QUOTED = re.compile(r"'[^']*'|\"[^\"]*\"")
OPTION = re.compile(r"(?<![\w-])(--?[a-zA-Z][\w-]*)")
TRAINCTL = re.compile(r"(?<![\w./\[-])trainctl(?=\s)")
# What may stand before a command on its line: a prompt, a list or pipe, env assignments,
# `exec`. Elsewhere the word is output or prose ("model step: trainctl model / HF Llama").
COMMAND_POSITION = re.compile(r"(?:^|[;&|(]|\$|\bexec|\b[A-Z_]+=\S*)\s*$")
COMMAND_WORD = re.compile(r"\s+([a-z][a-z0-9-]*)(?=[\s|]|$)")
MAKE = re.compile(r"(?:^|\s|\$\s)make\s+([A-Za-z0-9_.-]+)")
REPO_PATH = re.compile(r"^(?:service|store|worker|tests|docker|openapi|bench|docs)/[\w./-]*$")
# A test file, or a test in one, as a page quotes it: `tests/e2e/test_x.py::test_y`.
TEST_NODE = re.compile(r"^tests/(?:[\w.-]+/)*test_\w+\.py(?:::\w+)*$")


def pages() -> list[Path]:
    return [README, *sorted(DOCS.glob("*.md")), *sorted(DESIGN.glob("*.md"))]


def page_name(page: Path) -> str:
    return str(page.relative_to(REPO))


# --- reading markdown -------------------------------------------------------------------------


@dataclass(frozen=True)
class Block:
    lang: str
    lines: list[str]


@dataclass(frozen=True)
class Page:
    prose: str  # the text outside fenced blocks, blocks blanked out
    blocks: list[Block]


def read_page(text: str) -> Page:
    prose: list[str] = []
    blocks: list[Block] = []
    fence: str | None = None
    for line in text.splitlines():
        opened = FENCE.match(line)
        if fence is None and opened:
            fence = opened.group(1)
            blocks.append(Block(opened.group(2).lower(), []))
            prose.append("")
        elif fence is not None and line.strip().startswith(fence) and not line.strip(fence[0]):
            fence = None
            prose.append("")
        elif fence is not None:
            blocks[-1].lines.append(line)
        else:
            prose.append(line)
    return Page("\n".join(prose), blocks)


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: the text without markup, lower case, punctuation
    dropped, spaces as hyphens."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)
    text = re.sub(r"[`*]", "", text).strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(text: str) -> set[str]:
    seen: dict[str, int] = {}
    found = set()
    for line in read_page(text).prose.splitlines():
        heading = HEADING.match(line)
        if not heading:
            continue
        base = slug(heading.group(2))
        count = seen.get(base, 0)
        seen[base] = count + 1
        found.add(base if count == 0 else f"{base}-{count}")
    return found


def link_targets(text: str) -> list[str]:
    prose = CODE_SPAN.sub(lambda m: "x" * len(m.group(0)), read_page(text).prose)
    return LINK.findall(prose)


def broken_links(page: Path) -> list[str]:
    """What is wrong with each relative link of `page`: a missing file, or a missing heading."""
    problems = []
    for target in link_targets(page.read_text(encoding="utf-8")):
        if SCHEME.match(target):
            continue
        path, _, anchor = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        if not dest.exists():
            problems.append(f"{target}: no such file")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest.read_text("utf-8")):
            problems.append(f"{target}: {dest.name} has no heading #{anchor}")
    return problems


def linked_pages(page: Path) -> set[Path]:
    found = set()
    for target in link_targets(page.read_text(encoding="utf-8")):
        path = target.partition("#")[0]
        if path and not SCHEME.match(target):
            found.add((page.parent / path).resolve())
    return found


def readme_links() -> set[Path]:
    return linked_pages(README)


def code_spans(text: str) -> list[str]:
    return [" ".join(m.group(1).split()) for m in CODE_SPAN.finditer(read_page(text).prose)]


def shell_lines(text: str) -> Iterator[str]:
    """Every shell line of the fenced blocks (a trailing backslash joins the next; in a console
    block, the lines after a `$ ` prompt), then every inline code span: where a page quotes a
    command."""
    for block in read_page(text).blocks:
        if block.lang in NOT_SHELL:
            continue
        joined = ""
        for line in block.lines:
            joined += line.rstrip()
            if joined.endswith("\\"):
                joined = joined[:-1] + " "
                continue
            # A console block's commands follow its `$ ` prompts; the other lines are output.
            if block.lang != "console" or joined.lstrip().startswith("$ "):
                yield joined
            joined = ""
        if joined:
            yield joined
    yield from code_spans(text)


# --- the CLI ----------------------------------------------------------------------------------


def cli() -> Any:
    return typer.main.get_command(app)


def option_names(command: Any) -> set[str]:
    names = {"--help"}
    for param in command.params:
        names.update(getattr(param, "opts", []))
        names.update(getattr(param, "secondary_opts", []))
    return names


@dataclass(frozen=True)
class Quoted:
    words: tuple[str, ...]
    options: tuple[str, ...]


def quoted_commands(text: str) -> Iterator[Quoted]:
    for line in shell_lines(text):
        for start in TRAINCTL.finditer(line):
            if not COMMAND_POSITION.search(line[: start.start()]):
                continue
            rest = COMMAND_END.split(line[start.end() :], maxsplit=1)[0]
            words = []
            pos = 0
            while word := COMMAND_WORD.match(rest, pos):
                words.append(word.group(1))
                pos = word.end()
            options = OPTION.findall(QUOTED.sub("", rest[pos:]))
            yield Quoted(tuple(words), tuple(options))


def command_problem(root: Any, quoted: Quoted) -> str | None:
    """Why `trainctl <words> <options>` is not a command of the CLI, or None."""
    command, path = root, ["trainctl"]
    for word in quoted.words:
        if not hasattr(command, "commands"):
            break  # the rest are arguments
        if word not in command.commands:
            return f"{' '.join(path)} has no command {word!r}"
        command = command.commands[word]
        path.append(word)
    if command.context_settings.get("ignore_unknown_options"):
        return None  # a pass-through (`trainctl worker`): its options are another parser's
    known = option_names(command) | option_names(root)
    unknown = [option for option in quoted.options if option not in known]
    if unknown:
        return f"{' '.join(path)} takes no {', '.join(unknown)}"
    return None


def makefile_targets() -> set[str]:
    makefile = (REPO / "Makefile").read_text(encoding="utf-8")
    return set(re.findall(r"^([A-Za-z0-9_.-]+)\s*:(?!=)", makefile, re.MULTILINE))


def quoted_make_targets(text: str) -> set[str]:
    return {target for line in shell_lines(text) for target in MAKE.findall(line)}


# --- citations of the docs in code ------------------------------------------------------------

# Where code cites the docs: comments, docstrings and messages in these folders and files.
CITING_FOLDERS = ("service", "store", "worker", "bench", "tests", "docker")
CITING_FILES = ("Makefile", "pyproject.toml", "trainctl/__init__.py")
CITING_SUFFIXES = {".py", ".js", ".html", ".sh", ".toml", ".yaml", ".yml"}
# A comment's line break, with its next line's leader (`#`, `//`), reads as a space; a name
# spans at most one.
GAP = r"(?:[ \t]+|[ \t]*\n[ \t]*(?:(?:#|//)[ \t]*)?)"
NAME = r'"[^"\n]+(?:\n[ \t]*(?:(?:#|//)[ \t]*)?[^"\n]+)?"'
DOC_PAGE = r"(?<![\w/.-])`?(docs/(?:design/)?[\w-]+\.md)`?"
# `docs/design/runs.md, "Runs", "Fencing"`, `docs/operations.md "Notifications"`,
# `docs/design/kinds.md, "Run kinds" and "Requests and plans"`, and in prose
# `"Object storage" in docs/design/checkpoints.md`.
CITATION = re.compile(
    rf"{DOC_PAGE}(?:,{GAP}|[ \t]+)({NAME}(?:(?:,{GAP}|{GAP}and{GAP}){NAME})*)"
    rf"|({NAME}){GAP}in{GAP}{DOC_PAGE}"
)
# The lead of a paragraph or list item (`**Fencing.**`, `- **Memory**`, `*The guard*`): what a
# citation may name after its section.
LEAD = re.compile(r"^\s*(?:[-*]\s+|\d+\.\s+)?(\*\*?)(?![\s*])([^*\n]+?)\1", re.MULTILINE)


@dataclass(frozen=True)
class Citation:
    page: str  # from the repository's root: docs/design/runs.md
    names: tuple[str, ...]  # the quoted names, each on one line
    page_span: tuple[int, int]
    name_spans: tuple[tuple[int, int], ...]  # each name with its quotes

    @property
    def start(self) -> int:
        return min(self.page_span[0], self.name_spans[0][0])


def one_line(name: str) -> str:
    return " ".join(re.sub(r"\n[ \t]*(?:#|//)?", " ", name).split())


def citations(text: str) -> list[Citation]:
    found = []
    for m in CITATION.finditer(text):
        page_group, names_group = (1, 2) if m.group(1) else (4, 3)
        start = m.start(names_group)
        spans = tuple(
            (start + n.start(), start + n.end()) for n in re.finditer(NAME, m.group(names_group))
        )
        names = tuple(one_line(text[a + 1 : b - 1]) for a, b in spans)
        found.append(Citation(m.group(page_group), names, m.span(page_group), spans))
    return found


def section_names(text: str) -> set[str]:
    """What a citation of a page may name: its headings, and its paragraphs' leads."""
    prose = read_page(text).prose
    headings = {h.group(2) for line in prose.splitlines() if (h := HEADING.match(line))}
    leads = {" ".join(m.group(2).split()).rstrip(".:") for m in LEAD.finditer(prose)}
    return headings | leads


def citing_files(root: Path) -> list[Path]:
    files = [root / name for name in CITING_FILES if (root / name).is_file()]
    for folder in CITING_FOLDERS:
        files += [p for p in sorted((root / folder).rglob("*")) if p.suffix in CITING_SUFFIXES]
    return [p for p in files if p.resolve() != Path(__file__).resolve()]


def published_texts(root: Path) -> list[str]:
    """The descriptions of the committed API schema, each on one line: text published there
    changes with the API, not with the docs."""
    found: list[str] = []

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            for key, value in node.items():
                if key == "description" and isinstance(value, str):
                    found.append(" ".join(value.split()))
                else:
                    walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    walk(json.loads((root / "openapi" / "openapi.json").read_text(encoding="utf-8")))
    return found


def string_literals(source: str) -> list[tuple[int, int, str]]:
    """Each string literal of a Python source: its offsets and its value, on one line."""
    starts = [0]
    for line in source.splitlines(keepends=True):
        starts.append(starts[-1] + len(line))
    found = []
    try:
        for token in tokenize.generate_tokens(io.StringIO(source).readline):
            if token.type != tokenize.STRING:
                continue
            try:
                value = ast.literal_eval(token.string)
            except (ValueError, SyntaxError):
                continue
            start = starts[token.start[0] - 1] + token.start[1]
            end = starts[token.end[0] - 1] + token.end[1]
            found.append((start, end, " ".join(str(value).split())))
    except (tokenize.TokenError, SyntaxError):
        pass
    return found


def is_published(
    citation: Citation, literals: list[tuple[int, int, str]], texts: list[str]
) -> bool:
    """Whether the citation is in a string the API schema publishes (a model's docstring, a
    field's description)."""
    return any(
        start <= citation.start < end and len(value) >= 20 and any(value in t for t in texts)
        for start, end, value in literals
    )


def citation_problems(root: Path, files: Iterable[Path]) -> list[str]:
    """What is wrong with each citation in `files`: a page that does not exist, or a name the
    page has no section or paragraph lead for. A citation the API schema publishes may name a
    section the map (docs/architecture.md) links to on another page."""
    texts = published_texts(root)
    map_anchors = {
        t.partition("#")[2]
        for t in link_targets((root / "docs/architecture.md").read_text("utf-8"))
    }
    problems = []
    for path in files:
        source = path.read_text(encoding="utf-8")
        literals = string_literals(source) if path.suffix == ".py" else []
        for citation in citations(source):
            line = source.count("\n", 0, citation.start) + 1
            where = f"{path.relative_to(root)}:{line}: {citation.page}"
            page = root / citation.page
            if not page.is_file():
                problems.append(f"{where}: no such page")
                continue
            known = section_names(page.read_text(encoding="utf-8"))
            missing = [name for name in citation.names if name not in known]
            if missing and is_published(citation, literals, texts):
                missing = [name for name in missing if slug(name) not in map_anchors]
            if missing:
                problems.append(f"{where} has no section {', '.join(map(repr, missing))}")
    return problems


# --- the tests a page names as proof -----------------------------------------------------------


@dataclass(frozen=True)
class Section:
    level: int  # 1 for `#`, 2 for `##`; 0 before the first heading
    heading: str
    tests: list[str]  # the test files and nodes it quotes, in order


def quoted_tests(text: str) -> list[Section]:
    """The test files and nodes (`tests/e2e/test_x.py::test_y`) each section of a page quotes."""
    sections: list[Section] = []
    level, heading, lines = 0, "", list[str]()
    for line in [*read_page(text).prose.splitlines(), "# end"]:
        if found := HEADING.match(line):
            spans = code_spans("\n".join(lines))
            nodes = list(dict.fromkeys(s for s in spans if TEST_NODE.match(s)))
            sections.append(Section(level, heading, nodes))
            level, heading, lines = len(found.group(1)), found.group(2), []
        else:
            lines.append(line)
    return sections


def recipe_test_problems(root: Path, page: Path) -> list[str]:
    """What is wrong with the tests a page of recipes names as their proof: a recipe (a `##`
    section) that names none, or a test `make test` does not run (tests/support/make_test.py:
    missing, soak- or GPU-only, left out)."""
    selection = make_test_selection(root)
    problems = []
    for section in quoted_tests(page.read_text(encoding="utf-8")):
        if section.level == 2 and not section.tests:
            problems.append(f"{section.heading}: names no test")
        for node in section.tests:
            if why := why_not_run(root, node, selection):
                problems.append(f"{section.heading}: {node}: {why}")
    return problems


# --- the tests --------------------------------------------------------------------------------


def test_the_readme_is_at_most_15_kb() -> None:
    size = len(README.read_bytes())
    assert size <= README_MAX_BYTES, f"README.md is {size:,} bytes; move reference to docs/"


def test_every_relative_link_points_to_a_file_and_heading_that_exist() -> None:
    problems = {page_name(page): broken_links(page) for page in pages()}
    assert not {page: found for page, found in problems.items() if found}


def test_a_broken_link_or_anchor_is_reported(tmp_path: Path) -> None:
    (tmp_path / "other.md").write_text("# Other page\n\n## Run `kinds`: the list\n")
    page = tmp_path / "page.md"
    page.write_text(
        "# Page\n\n[fine](other.md#run-kinds-the-list) [here](#page)\n"
        "[gone](missing.md) [no heading](other.md#nowhere)\n"
        "```\n[in a block](ignored.md)\n```\n`[in code](ignored.md)`\n"
    )
    assert broken_links(page) == [
        "missing.md: no such file",
        "other.md#nowhere: other.md has no heading #nowhere",
    ]


def test_headings_get_githubs_anchors() -> None:
    text = "# A, b & `c`\n\n## 6. API under load\n\n## Twice\n\n## Twice\n```\n# not one\n```\n"
    assert anchors(text) == {"a-b--c", "6-api-under-load", "twice", "twice-1"}


def test_every_docs_page_is_linked_from_the_readme() -> None:
    linked = readme_links()
    top = sorted(DOCS.glob("*.md"))
    unlinked = [page_name(page) for page in top if page.resolve() not in linked]
    assert not unlinked, f"README.md does not link {unlinked}"


def test_every_design_page_is_linked_from_the_map() -> None:
    """The README links the map; the map links the design pages (docs/design/)."""
    assert MAP.resolve() in readme_links()
    linked = linked_pages(MAP)
    design = sorted(DESIGN.glob("*.md"))
    assert design, "no design pages"
    unlinked = [page_name(page) for page in design if page.resolve() not in linked]
    assert not unlinked, f"docs/architecture.md does not link {unlinked}"


def test_the_make_commands_quoted_are_makefile_targets() -> None:
    targets = makefile_targets()
    readme = quoted_make_targets(README.read_text(encoding="utf-8"))
    assert {"serve", "test"} <= readme, "the README's two commands are gone"
    for page in pages():
        missing = quoted_make_targets(page.read_text(encoding="utf-8")) - targets
        assert not missing, f"{page_name(page)} quotes make {sorted(missing)}"


def test_the_trainctl_commands_quoted_exist_with_their_options() -> None:
    root = cli()
    seen = 0
    for page in pages():
        for quoted in quoted_commands(page.read_text(encoding="utf-8")):
            seen += 1
            problem = command_problem(root, quoted)
            assert problem is None, f"{page_name(page)}: {problem}"
    assert seen > 50  # the pages quote commands; a reader that finds none is broken


def test_a_command_or_option_that_does_not_exist_is_reported() -> None:
    root = cli()
    text = (
        "```sh\n$ trainctl runs watch ID --samples | jq .state\n"
        "trainctl runs wait ID\ntrainctl sample EXP TAG 'a --b' --max-new-tokens 5 --tempo 1\n```\n"
    )
    problems = [command_problem(root, quoted) for quoted in quoted_commands(text)]
    assert problems == [
        None,
        "trainctl runs has no command 'wait'",
        "trainctl sample takes no --tempo",
    ]


def test_every_service_setting_is_in_the_operations_table_with_its_default() -> None:
    """And every worker setting: the service's default where it has the setting too."""
    text = (DOCS / "operations.md").read_text(encoding="utf-8")
    rows = dict(re.findall(r"^\| `(TRAINCTL_\w+)` \| ([^|]+?) \|", text, re.MULTILINE))
    expected = {}
    for name, field in {**WorkerSettings.model_fields, **Settings.model_fields}.items():
        default = field.get_default(call_default_factory=True)
        if isinstance(default, float) and default.is_integer():
            default = int(default)
        expected[f"TRAINCTL_{name.upper()}"] = (
            "unset" if default in (None, [], "") else f"`{default}`"
        )
    differ = {k: (rows.get(k), expected.get(k)) for k in rows.keys() | expected.keys()}
    assert rows == expected, {k: pair for k, pair in differ.items() if pair[0] != pair[1]}


def repository_path_exists(quoted: str) -> bool:
    """`store/plans.py` as a file or folder, `worker/checkpoint.write_checkpoint` as a module's
    attribute."""
    module = re.sub(r"\.[A-Za-z_]\w*$", ".py", quoted)
    return (REPO / quoted).exists() or (REPO / module).is_file()


def test_the_repository_paths_quoted_exist() -> None:
    for page in pages():
        quoted = set(code_spans(page.read_text(encoding="utf-8")))
        missing = sorted(p for p in quoted if REPO_PATH.match(p) and not repository_path_exists(p))
        assert not missing, f"{page_name(page)} quotes {missing}"


def test_every_citation_in_code_names_a_page_and_a_section_it_has() -> None:
    files = citing_files(REPO)
    assert sum(len(citations(p.read_text(encoding="utf-8"))) for p in files) > 100
    assert not citation_problems(REPO, files)


def test_a_broken_citation_is_reported(tmp_path: Path) -> None:
    (tmp_path / "docs" / "design").mkdir(parents=True)
    (tmp_path / "openapi").mkdir()
    (tmp_path / "openapi" / "openapi.json").write_text(
        json.dumps(
            {"Parent": {"description": 'Where a fork started (docs/architecture.md, "Forks").'}}
        )
    )
    (tmp_path / "docs" / "architecture.md").write_text("# Map\n\n[Forks](design/forks.md#forks)\n")
    (tmp_path / "docs" / "design" / "forks.md").write_text(
        "# Design: forks\n\n## Forks\n\n**What it keeps.** All.\n\n- **Lineage** too\n"
    )
    code = tmp_path / "code.py"
    code.write_text(
        '"""Forks (docs/design/forks.md, "Forks", "What it keeps"; docs/design/forks.md,\n'
        '"Lineage")."""\n\n\n'
        'class Parent:\n    """Where a fork started (docs/architecture.md, "Forks")."""\n\n\n'
        '# A fork (docs/architecture.md, "Forks"); its sweeps (docs/design/forks.md,\n'
        '# "Sweeps"), its parent (docs/design/parents.md "Parents")\n'
    )
    assert citation_problems(tmp_path, [code]) == [
        "code.py:9: docs/architecture.md has no section 'Forks'",
        "code.py:9: docs/design/forks.md has no section 'Sweeps'",
        "code.py:10: docs/design/parents.md: no such page",
    ]


def test_citations_are_read_across_lines_and_comment_leaders() -> None:
    text = (
        '# docs/design/kinds.md, "Run kinds" and "Requests and\n#   plans"; `docs/x.md`\n'
        '// "Object storage" in docs/design/checkpoints.md\n'
        'see docs/performance.md item 7, docs/operations.md "Notifications" gives\n'
    )
    assert [(c.page, c.names) for c in citations(text)] == [
        ("docs/design/kinds.md", ("Run kinds", "Requests and plans")),
        ("docs/design/checkpoints.md", ("Object storage",)),
        ("docs/operations.md", ("Notifications",)),
    ]


def test_every_test_extending_names_is_one_make_test_runs() -> None:
    """docs/extending.md's recipes each name the tests that prove them: every one must exist
    and run in `make test`, not only in `make soak` or on a GPU."""
    sections = quoted_tests(EXTENDING.read_text(encoding="utf-8"))
    recipes = [s for s in sections if s.level == 2]
    assert len(recipes) == 5 and sum(len(s.tests) for s in recipes) > 10
    assert not recipe_test_problems(REPO, EXTENDING)


def test_a_recipe_naming_a_test_make_test_does_not_run_is_reported(tmp_path: Path) -> None:
    (tmp_path / "Makefile").write_text(
        "PY := .venv/bin/python\nLEAVE_OUT := --ignore=tests/slow \\\n"
        "\t--deselect tests/test_a.py::test_deselected\n\n"
        "test: lint pytest\nlint:\n\truff check .\npytest:\n"
        '\t$(PY) -m pytest -q $(LEAVE_OUT) -m "not gpu and not slow"\n'
        "soak:\n\tTRAINCTL_SOAK_ROUNDS=1 pytest -m soak --ignore=tests/test_a.py\n"
    )
    (tmp_path / "pyproject.toml").write_text('[tool.pytest.ini_options]\ntestpaths = ["tests"]\n')
    tests = tmp_path / "tests"
    (tests / "slow").mkdir(parents=True)
    (tests / "test_a.py").write_text(
        "import pytest\n\ndef test_good(): pass\n\n@pytest.mark.soak\ndef test_soaked(): pass\n"
        "\n@pytest.mark.slow\ndef test_slow(): pass\n\ndef test_deselected(): pass\n\n"
        "@pytest.mark.parametrize('x', [pytest.param(1, marks=pytest.mark.soak), 2])\n"
        "def test_partly(x): pass\n\n@pytest.mark.gpu\nclass TestOnGpu:\n"
        "    def test_in_class(self): pass\n"
    )
    (tests / "test_soak.py").write_text("import pytest\npytestmark = [pytest.mark.soak]\n"
                                        "def test_x(): pass\n")  # fmt: skip
    (tests / "slow" / "test_b.py").write_text("def test_y(): pass\n")
    page = tmp_path / "extending.md"
    page.write_text(
        "# Extending\n\nSee `tests/test_a.py`.\n\n## 1. Fine\n\n`tests/test_a.py::test_good`, "
        "`tests/test_a.py::test_partly`, `tests/test_a.py`, `tests/helper.py`\n\n"
        "## 2. Broken\n\n`tests/test_gone.py`, `tests/test_a.py::test_gone`,\n"
        "`tests/test_a.py::test_soaked`, `tests/test_a.py::test_slow`,\n"
        "`tests/test_a.py::test_deselected`, `tests/test_a.py::TestOnGpu::test_in_class`,\n"
        "`tests/slow/test_b.py::test_y`, `tests/test_soak.py`\n\n"
        "## 3. Untested\n\n```\ntests/test_a.py::test_good\n```\n"
    )
    assert recipe_test_problems(tmp_path, page) == [
        "2. Broken: tests/test_gone.py: no such file",
        "2. Broken: tests/test_a.py::test_gone: it has no test test_gone",
        "2. Broken: tests/test_a.py::test_soaked: test_soaked is marked soak",
        "2. Broken: tests/test_a.py::test_slow: test_slow is marked slow",
        "2. Broken: tests/test_a.py::test_deselected: make test deselects it",
        "2. Broken: tests/test_a.py::TestOnGpu::test_in_class: TestOnGpu::test_in_class is "
        "marked gpu",
        "2. Broken: tests/slow/test_b.py::test_y: make test leaves out tests/slow",
        "2. Broken: tests/test_soak.py: the whole file is marked soak",
        "3. Untested: names no test",
    ]
