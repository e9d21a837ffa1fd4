"""What both sides of allocscope share and nothing else of it needs to know:
loading the native extensions (native.py), byte sizes as people write them
(units.py), progress on long loads (progress.py), running code right after
torch is imported (torch_hook.py), and where the start-up hook of child
processes lives (startup.py; the hook itself, bootstrap/, is an entry point
above every layer). Imports nothing else of allocscope."""

__all__: list[str] = []
