"""The folder `allocscope run` and the virtual GPU put first on a child
process's PYTHONPATH (allocscope.common.startup.with_bootstrap), so that the
child's interpreter imports this folder's sitecustomize.py at startup, which
switches the virtual GPU on and arms recording. An entry point, like the
command line: it sits above every layer, and nothing in allocscope imports
it."""

__all__: list[str] = []
