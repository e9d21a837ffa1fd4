"""allocscope's native core (csrc/). Private: use allocscope.record / load."""

from typing import Any

def built_with_cuda() -> bool: ...
def start(path: str, metadata_json: str, python_stacks: bool, ops: bool = True, checkpoints: bool = False,
          sigterm_over_foreign: bool = False, remove_if_unused: bool = False) -> None:
    """Opens the file (truncating it), writes header and metadata, starts the writer thread;
    ops: record the op behind each allocation (a RecordFunction callback while recording);
    checkpoints: the writer follows the live set, so that arm_checkpoint() can write checkpoints;
    sigterm_over_foreign: finish the file on SIGTERM also where a handler that is not Python's has it
    (faulthandler's), then raise it again with that handler (csrc/recorder/recorder.cpp);
    remove_if_unused: remove the file when the recording ends, however it ends, if it holds no memory event."""
def stop(reason: str) -> dict[str, Any]:
    """Stops recording, waits for threads inside the recorder, writes the footer.
    Keys: events, dropped, bytes, stacks, stack_misses, stack_overflows, error."""
def is_active() -> bool: ...
def ops_active() -> bool:
    """Whether ops are recorded (then autograd nodes write their modules' backward scopes)."""
def module_hooks(name: str, leaf: bool, output_bytes: Any) -> tuple[Any, Any]:
    """(enter, exit) C functions a watched module's calls run (csrc/recorder/module_hooks.h): enter(module, args);
    exit(module, args, output), a leaf's new output bytes through output_bytes(args, output) where they are not
    one plain tensor's."""
def innermost_module(none: str) -> str:
    """The innermost watched module whose forward runs on this thread (`none` when none does)."""
def enable_backward_scopes() -> None:
    """A watch without ops: backward scopes from each event's autograd node (csrc/recorder/backward_scopes.h). Counted."""
def disable_backward_scopes() -> None: ...
def backward_nested_begin() -> bool:
    """A backward begins; True when inside a node of this thread (then backward_nested_end() is due)."""
def backward_nested_end() -> None: ...
def start_ops() -> bool:
    """Starts recording ops in a running recording without them; False when not recording or already on."""
def walker() -> str: ...
def register_value_kernel(name: str, overload: str) -> None:
    """aten::name.overload's CUDA kernel becomes one that moves wrapped numbers made on the device to the CPU
    and redispatches to the kernel registered at PrivateUse3 (vgpu/values.py)."""
def hide_frames_of(code: object) -> bool:
    """Frames of this code object, where innermost, are left out of recorded stacks (the virtual GPU's Python
    kernels); False when the list (64) is full."""
def next_seq() -> int: ...
def arm_checkpoint(at_snapshot: bool) -> int:
    """Asks for a checkpoint at the next event (or at the SNAPSHOT event of the baseline taken next);
    returns that point's first possible sequence number, 2**64 - 1 when none can be written."""
def checkpoint_baseline(json: str) -> None:
    """The armed checkpoint's baseline ("": none could be taken, so no checkpoint)."""
def annotate(kind: int, label: str, addr: int = 0, size: int = 0, with_stack: bool = False) -> bool:
    """Records an annotation event (kind 16..63); False when not recording."""
def label_gradient(param: Any) -> None:
    """A post-accumulate-grad hook: labels a watched parameter's gradient (a GradientWatch's)."""
class Changes:
    """Whether what a watch checks each step changed since the last call (csrc/recorder/fingerprints.h);
    the first call says True."""
    def __init__(self) -> None: ...
    def addresses(self, places: list[tuple[Any, str]]) -> bool:
        """places: (weak reference to a module, parameter name) pairs; compares the data pointers of those
        parameters (0: gone or no storage). No reference to the parameters (swap_tensors refuses those)."""
    def values(self, state: dict[Any, Any]) -> bool:
        """state: an optimizer's state; compares the identity of every inner value, in order."""

class SavedTensorLabeler:
    """The watcher's saved-tensor hook (csrc/recorder/saved.h): labels each storage autograd saves during a
    watched forward as an activation of the innermost module, once per forward."""
    def __init__(self, cuda: bool, cpu: bool, fallback: str, plain_types: list[Any], route: bool = True) -> None:
        """route: autograd asks allocscope's engine for the hooks (csrc/recorder/saved_engine.h), which packs
        in C++ where this labeler's pack_hook is on top of the saved_tensors_hooks stack; until close()."""
    def set_parameters(self, storages: list[int]) -> None:
        """The storages that stay what they are (the parameters'), until the next call."""
    def begin_forward(self) -> None:
        """A forward begins: each storage is labelled once in it."""
    def pack(self, tensor: Any) -> Any: ...
    @staticmethod
    def unpack(tensor: Any) -> Any: ...
    @property
    def pack_hook(self) -> Any:
        """pack as a C function (push it with unpack_hook in saved_tensors_hooks)."""
    unpack_hook: Any
    def close(self) -> None:
        """Releases the engine route (idempotent)."""
    @property
    def packed_natively(self) -> int: ...
    @property
    def packed_in_python(self) -> int: ...

def add_baseline(json: str) -> None: ...
def install_cpu() -> None: ...
def uninstall_cpu() -> None: ...
def cpu_installed() -> bool: ...
def format_constants() -> dict[str, Any]:
    """The format's tables as csrc/format/format.h defines them (capture/format.py mirrors them)."""

# Present when built_with_cuda():
def install_cuda() -> None: ...
def uninstall_cuda() -> None: ...
def cuda_installed() -> bool: ...
def cuda_tracker_attached() -> bool: ...
def cuda_wrapped_name() -> str: ...
def cuda_baseline_json(label: str, devices: list[int], with_context: list[int]) -> str: ...
def set_cuda_environment(environment: Any) -> None:
    """Test seam: where the CUDA wrapper reads the current device and stream (a capsule from the
    test-only extension's install_fake_cuda; None: CUDA's own)."""
