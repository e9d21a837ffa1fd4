"""What both sides of allocscope share and nothing else of it needs to know:
loading the native extensions (native.py), byte sizes as people write them
(units.py), progress on long loads (progress.py), running code right after
torch is imported (torch_hook.py), and the start-up hook of child processes
(bootstrap/). Imports nothing else of allocscope."""

__all__: list[str] = []
