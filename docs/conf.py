"""Sphinx configuration of the phalanx manual: ``make docs`` builds it into docs/_build/html.

The pages are MyST Markdown; the example notebooks are shown with the outputs they were saved
with (nothing is executed here); the API reference is read from the package's docstrings, and
the magics' options from their argument parsers.  Nothing is fetched from the network: no
intersphinx, no link check of outside addresses.  Internal links and anchors are checked by the
build itself (``-W -n``: a link to a missing page, heading or object fails it).
"""

from __future__ import annotations

import sys
from pathlib import Path

from docutils import nodes
from sphinx.util.docutils import SphinxDirective

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
# The package from this checkout (it is installed editable in .venv too), and links.py beside us.
sys.path[:0] = [str(ROOT / "kernel_ext"), str(HERE)]

import links  # noqa: E402
from phalanx import __version__  # noqa: E402


def copy_notebooks(source: Path = ROOT / "notebooks", pages: Path = HERE / "notebooks") -> None:
    """The example notebooks become pages of their own: copied beside ``notebooks/index.md``
    (git ignores the copies), a file rewritten only when it changed so unchanged pages are not
    read again, and a copy whose notebook is gone removed."""
    wanted = {path.name: path.read_bytes() for path in sorted(source.glob("[0-9]*.ipynb"))}
    for old in pages.glob("[0-9]*.ipynb"):
        if old.name not in wanted:
            old.unlink()
    for name, data in wanted.items():
        copy = pages / name
        if not copy.is_file() or copy.read_bytes() != data:
            copy.write_bytes(data)


copy_notebooks()

project = "phalanx"
author = "the phalanx authors"
copyright = "the phalanx authors, BSD-3-Clause"
release = version = __version__

extensions = ["myst_nb", "sphinx.ext.autodoc"]
exclude_patterns = ["_build", "images", "requirements.txt", "**/.ipynb_checkpoints"]
root_doc = "index"

# MyST: headings get anchors down to level 3, so ``page.md#a-heading`` links are checked.
myst_heading_anchors = 3
myst_enable_extensions = ["colon_fence", "deflist", "substitution"]
# Binder's address derives from pyproject.toml's Repository, as the README's links do (links.py).
myst_substitutions = {
    "binder_link": f"[this Binder link]({links.binder_url(links.repository(), 'notebooks/01-quickstart.ipynb')})",
}
# The notebooks are shown as saved (make notebooks executes them); the docs build runs nothing.
nb_execution_mode = "off"
nb_merge_streams = True

# The API reference: signatures as written, members in source order.
autodoc_member_order = "bysource"
autodoc_typehints = "signature"
autodoc_preserve_defaults = True
# -n: every cross-reference must resolve.  What a signature names from another library is not in
# this manual, and no inventory of theirs is fetched, so those names stay plain text; so does a
# parametrised builtin (``dict[int, dict[str, float]]``), which Sphinx would look up in pieces.
nitpicky = True
nitpick_ignore_regex = [
    (r"py:.*", r"(torch|np|numpy|pd|pandas|sklearn|dask|distributed|IPython|ipywidgets)(\..*)?"),
    (r"py:class", r"(dict|list|tuple|set|frozenset|type)\[.*"),
]

html_theme = "pydata_sphinx_theme"
html_title = f"phalanx {version}"
html_static_path: list[str] = []
html_theme_options = {
    "github_url": f"https://github.com/{links.repository()}",
    "navigation_with_keys": False,
    "show_toc_level": 2,
    "footer_start": ["copyright"],
    "footer_end": [],
}
html_context = {"default_mode": "light"}
# Options and flags stay as typed: no "--" turned into a dash, no quotes curled in prose either.
smartquotes = False


class MagicOptions(SphinxDirective):
    """``{magic-options} cluster``: a table of a magic's options, read from its parser."""

    required_arguments = 1

    def run(self) -> list[nodes.Node]:
        from phalanx._magics import PhalanxMagics

        parser = getattr(PhalanxMagics, self.arguments[0]).parser
        rows = []
        for action in parser._actions:
            if "-h" in action.option_strings:
                continue
            flags = ", ".join(action.option_strings) or action.dest
            if action.option_strings and action.nargs != 0:
                metavar = action.metavar or action.dest.upper()
                flags += f" {metavar}" if action.nargs != "?" else f" [{metavar}]"
            shown = action.default not in (None, False) and action.nargs != 0
            rows.append((flags, repr(action.default) if shown else "", _help(parser, action)))
        return [_table(("option", "default", "what it does"), rows, widths=(30, 12, 58))]


def _help(parser, action) -> str:  # noqa: ANN001 - argparse's own objects
    """The option's help as ``%cluster?`` prints it (argparse expands ``%(default)s``, ``%%``)."""
    try:
        return (action.help or "") % {**vars(action), "prog": parser.prog}
    except (KeyError, TypeError, ValueError):
        return action.help or ""


def _table(header: tuple[str, ...], rows: list[tuple[str, ...]], widths: tuple[int, ...]) -> nodes.table:
    table = nodes.table(classes=["magic-options"])
    group = nodes.tgroup(cols=len(header))
    table += group
    group.extend(nodes.colspec(colwidth=w) for w in widths)

    def row(cells: tuple[str, ...], code: tuple[bool, ...]) -> nodes.row:
        out = nodes.row()
        for text, literal in zip(cells, code):
            entry = nodes.entry()
            entry += nodes.paragraph("", "", nodes.literal(text, text) if literal and text
                                     else nodes.Text(text))
            out += entry
        return out

    group += nodes.thead("", row(header, (False,) * len(header)))
    group += nodes.tbody("", *(row(r, (True, True, False)) for r in rows))
    return table


def internal_reference(app, env, node, contnode):  # noqa: ANN001, ANN201 - Sphinx's event
    """A docstring's reference to a part of phalanx this manual leaves out (a private module,
    a constant, the kernel's side of a run) is shown as its name.  The name must still exist:
    a reference to nothing stays a warning, and fails the build."""
    if node.get("refdomain") != "py":
        return None
    target = node["reftarget"].lstrip(".~")
    module = node.get("py:module") or ""
    places = [module.rsplit(".", k)[0] for k in range(module.count(".") + 1)] if module else []
    places += [name for name in sys.modules if name.startswith("phalanx")]
    for place in ["", *places]:
        if _exists(f"{place}.{target}" if place else target):
            return contnode
    return None


def _exists(dotted: str) -> bool:
    import importlib

    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:cut]))
        except (ImportError, ValueError):
            continue
        try:
            for attribute in parts[cut:]:
                obj = getattr(obj, attribute)
        except AttributeError:
            return False
        return True
    return False


RESULTS_MARK = "<!-- results: every benchmarks/results/*.md is included here when the manual is built -->"


def results_tables(app, docname: str, source: list[str]) -> None:  # noqa: ANN001 - Sphinx's event
    """The benchmarks page shows every table of benchmarks/results/, a new one included."""
    if docname != "benchmarks":
        return
    parts = []
    for path in sorted((ROOT / "benchmarks" / "results").glob("*.md")):
        skip = 1 if path.read_text().startswith("# ") else 0  # its own title: the section's is ours
        parts.append(f"### `{path.name}`\n\n```{{include}} ../benchmarks/results/{path.name}\n"
                     f":start-line: {skip}\n```\n")
    source[0] = source[0].replace(RESULTS_MARK, "\n".join(parts))


def setup(app):  # noqa: ANN001, ANN201 - Sphinx's extension hook
    app.add_directive("magic-options", MagicOptions)
    app.connect("source-read", results_tables)
    app.connect("missing-reference", internal_reference)
    return {"parallel_read_safe": True}
