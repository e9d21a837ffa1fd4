"""allocscope in IPython and Jupyter (as memray's `%load_ext memray`):

    %load_ext allocscope

    %%allocscope [-o FILE] [--device cuda|cpu] [--no-watch] [--ops | --no-ops]
                 [--stacks python|none] [--at MARK] [--text] [--height PIXELS]
    loss = model(batch).sum(); loss.backward(); opt.step()

records the cell (CUDA where torch has it, else the CPU; a model the cell
calls and the optimizer that steps it are watched as `allocscope run
--watch` watches them) and shows its report inline: the page of `allocscope
html` in a frame sized for the notebook, or with --text the text of
`allocscope report`. A cell that raises (an out-of-memory error, say) still
leaves its capture, shows its report, then raises as it would have.
`%allocscope FILE` shows the report of a capture already made.

Nothing here loads IPython or torch until the extension is loaded."""

from __future__ import annotations

import argparse
import html
import os
import shlex
import tempfile
from typing import Any

__all__ = ["register_magics", "report_html", "show_report"]

DEFAULT_HEIGHT = 900  # pixels: the page's header, the timeline and the peak's explanation


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="%%allocscope", add_help=False, exit_on_error=False)
    p.add_argument("-o", "--output", metavar="FILE", help="the capture (default: a new file in a temporary folder)")
    p.add_argument("--device", choices=("cuda", "cpu"), help="default: cuda where torch has it, else cpu")
    p.add_argument("--no-watch", action="store_true", help="do not watch the models the cell calls")
    ops = p.add_mutually_exclusive_group()
    ops.add_argument("--ops", action="store_const", const=True, dest="ops", default=None)
    ops.add_argument("--no-ops", action="store_const", const=False, dest="ops")
    p.add_argument("--stacks", choices=("python", "none"), default="python")
    p.add_argument("--at", metavar="MARK", help="explain the first mark of this label instead of the peak")
    p.add_argument("--text", action="store_true", help="the text report instead of the page")
    p.add_argument("--height", type=int, default=DEFAULT_HEIGHT, metavar="PIXELS", help="the frame's height")
    return p


def _options(line: str) -> argparse.Namespace:
    from ..common.errors import InputError

    try:
        args, rest = _parser().parse_known_args(shlex.split(line))
    except (argparse.ArgumentError, ValueError) as e:
        raise InputError(f"%%allocscope: {e}") from None
    if rest:
        raise InputError(f"%%allocscope: unknown option {rest[0]!r} (options: -o FILE, --device, --no-watch, "
                         "--ops, --no-ops, --stacks, --at, --text, --height)")
    if args.height < 100:
        raise InputError("%%allocscope: --height is in pixels, at least 100")
    return args


def report_html(path: str, *, at: str | None = None, height: int = DEFAULT_HEIGHT) -> str:
    """The report of a capture as HTML for a notebook: the page of `allocscope
    html` in a frame of its own (its script and styles kept apart from the
    notebook's), as wide as the cell and `height` pixels high."""
    from ..capture.reader import load
    from ..reports.html.page import html_data, render

    page = render(html_data(load(path), at=at))
    return (f'<iframe srcdoc="{html.escape(page, quote=True)}" style="width:100%;height:{int(height)}px;'
            f'border:1px solid #d0d5dd" sandbox="allow-scripts" title="allocscope report: '
            f'{html.escape(os.path.basename(path), quote=True)}"></iframe>')


def show_report(path: str, *, at: str | None = None, text: bool = False, height: int = DEFAULT_HEIGHT) -> None:
    """Displays a capture's report in the notebook (the page, or the text)."""
    from IPython.display import HTML, display

    if text:
        from ..capture.reader import load
        from ..reports.report import build_report, render

        print(render(build_report(load(path), at=at)))
        return
    display(HTML(report_html(path, at=at, height=height)))


class _Cells:
    """Where the cells' captures go when no -o is given: one temporary folder
    per session, a file per recorded cell."""

    def __init__(self) -> None:
        self.folder: str | None = None
        self.count = 0

    def next_path(self) -> str:
        if self.folder is None:
            self.folder = tempfile.mkdtemp(prefix="allocscope-notebook-")
        self.count += 1
        return os.path.join(self.folder, f"cell-{self.count}.alsc")


def _record_cell(shell: Any, args: argparse.Namespace, cell: str, cells: _Cells) -> None:
    import torch

    from ..recording.session import record

    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    path = os.path.abspath(args.output) if args.output else cells.next_path()
    code = shell.transform_cell(cell)
    failure: BaseException | None = None
    with record(path, device=device, stacks=args.stacks, ops=args.ops) as rec:
        if not args.no_watch:
            rec.auto_watch()
        try:
            exec(compile(code, "<allocscope cell>", "exec"), shell.user_ns)  # noqa: S102 (the user's own cell)
        except BaseException as e:  # the capture is kept and shown, then the error is the cell's
            failure = e
    print(f"allocscope: recorded the cell on {device} into {path}")
    from ..common.errors import InputError

    try:
        show_report(path, at=args.at, text=args.text, height=args.height)
    except InputError as e:  # --at a mark the cell never made, say: one line, and the cell's own error after
        print(f"allocscope: {e}")
    if failure is not None:
        raise failure


def register_magics(ipython: Any) -> None:
    """Registers %%allocscope (record a cell) and %allocscope FILE (show a
    capture's report): what `%load_ext allocscope` does."""
    from IPython.core.magic import Magics, line_cell_magic, magics_class

    from ..common.errors import InputError

    @magics_class
    class AllocscopeMagics(Magics):
        cells = _Cells()

        @line_cell_magic
        def allocscope(self, line: str, cell: str | None = None) -> None:
            try:  # bad options or a bad file: one line, as on the command line
                if cell is None:
                    words = shlex.split(line)
                    if len(words) != 1:
                        raise InputError("%allocscope FILE shows a capture's report; %%allocscope records a cell")
                    show_report(words[0])
                    return
                args = _options(line)
            except (InputError, OSError) as e:
                print(f"allocscope: {e}")
                return
            _record_cell(self.shell, args, cell, self.cells)  # the cell's own errors are its own

    ipython.register_magics(AllocscopeMagics)
