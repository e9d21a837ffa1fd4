"""Values on the virtual GPU: the ops whose results steer shapes and control flow compute for real, on the host,
in the device memory itself (docs/vgpu.md, "Values").

The virtual card's memory is host memory, so a CUDA tensor's bytes can be read and written through a CPU tensor
over the same address (an alias). Each chosen op's CUDA kernel is replaced (through a C++ kernel at the CUDA key
that redispatches to these Python ones: csrc/recorder/value_kernels.cpp) by one that first runs torch's own
CUDA kernel (so that the caching allocator sees exactly the allocations it makes on a card) and then, where the
op is to be computed, runs the op's CPU kernel over aliases of its arguments and writes the result into the
CUDA output.

Which tensors hold values is tracked per storage: a storage holds values when a computed op, a fill or a copy
of values wrote all of it; every other write (a matmul that computed nothing, a Triton kernel, an op over
uncomputed inputs) leaves it uncomputed. An op is computed when every tensor it reads holds values and, in the
default mode, when what it writes is small (COMPUTE_LIMITS): so an activation is never computed, and a dry
run's host memory stays where it was. The registry of storages that hold values is the extension's
(host_tensors.Registry): keyed by data pointer, forgotten when the caching allocator frees the block.

What uncomputed values give where a program looks at them: .item() and copies to the host read 0; a top-k,
argmax or multinomial draw picks by the routing choice (routing.py); nonzero and masked_select select every
element, unique finds every element distinct (the largest results, for a dry run that errs high).
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass
from typing import Any, Callable

import torch

from . import host_ops
from .host_tensors import (GENERATORS, REGISTRY, covers_storage, host_alias, on_cuda, tensors_in, to_host,
                           wrapped_number)
from .routing import ENV_COMPUTE, ENV_ROUTING, Routing, parse_mode, parse_routing, select

__all__ = ["COMPUTED", "COMPUTE_LIMITS", "HEAVY", "Settings", "Values", "install_values", "installed_values",
           "settings_from_environment"]

# The largest result computed in the default mode, by kind: indices, masks and counts steer shapes and can be
# large (a one-hot routing mask of tokens × k × experts); floating-point results of that size are activations.
COMPUTE_LIMITS = {"integral": 256 << 20, "floating": 1 << 20}

# Elementwise ops beyond torch's `pointwise` tag, reductions, indexing, selection and layout: computed.
COMPUTED = (
    "add", "sub", "mul", "div", "neg", "abs", "sign", "remainder", "fmod", "floor_divide", "pow", "exp", "log",
    "log2", "log1p", "expm1", "sqrt", "rsqrt", "sigmoid", "tanh", "relu", "gelu", "silu", "clamp", "clamp_min",
    "clamp_max", "minimum", "maximum", "floor", "ceil", "round", "trunc", "reciprocal", "eq", "ne", "lt", "le",
    "gt", "ge", "bitwise_and", "bitwise_or", "bitwise_xor", "bitwise_not", "logical_and", "logical_or",
    "logical_not", "logical_xor", "where", "masked_fill", "isnan", "isinf", "nan_to_num", "lerp", "addcmul",
    "addcdiv", "_softmax", "_log_softmax", "sum", "mean", "prod", "max", "min", "amax", "amin", "aminmax",
    "all", "any", "linalg_vector_norm", "norm", "cumsum", "cumprod", "logsumexp", "var", "var_mean", "std",
    "std_mean", "sort", "gather", "scatter", "scatter_add", "scatter_reduce", "index_select", "index",
    "_index_put_impl_", "index_add", "index_copy", "index_fill", "masked_scatter", "take", "arange", "fill_",
    "zero_", "linspace", "copy_", "cat", "flip", "roll", "tril", "triu", "bincount", "histc", "repeat_interleave",
    "searchsorted", "bucketize", "isin", "one_hot", "_amp_foreach_non_finite_check_and_unscale_",
    "_amp_update_scale_", "uniform_", "normal", "normal_", "bernoulli", "bernoulli_", "random_", "exponential_",
    "multinomial", "randperm", "native_dropout", "_unique2", "unique_consecutive", "unique_dim", "_unique",
    "topk", "argmax", "argmin", "nonzero", "masked_select", "_local_scalar_dense",
    "empty", "empty_strided",
)
# Computed only with compute=all: the ops whose cost is their result (matmuls, convolutions, attention).
HEAVY = (
    "mm", "bmm", "addmm", "addmv", "addbmm", "baddbmm", "mv", "dot", "_grouped_mm", "_addmm_activation",
    "convolution", "convolution_backward", "cudnn_convolution", "_convolution",
    "_scaled_dot_product_flash_attention", "_scaled_dot_product_efficient_attention",
    "_scaled_dot_product_flash_attention_backward", "_scaled_dot_product_efficient_attention_backward",
    "embedding_dense_backward",
    "native_layer_norm", "native_layer_norm_backward", "_fused_rms_norm", "native_group_norm",
    "native_batch_norm", "_softmax_backward_data", "_log_softmax_backward_data", "gelu_backward",
    "silu_backward", "threshold_backward", "nll_loss_forward", "nll_loss_backward",
)
# Where the Python kernels are registered, behind the C++ CUDA kernel that reaches them (value_kernels.h)
VALUE_KEY = "PrivateUse3"
# Allocations: what they return holds (arbitrary) values, as on a card.
UNINITIALIZED = {"empty", "empty_strided"}
# Composite ops (one kernel for every device) whose CUDA work is a copy: wrapped at the CUDA key too.
COMPOSITE_WRAPPED = {"copy_", "zero_", "fill_"}
# Whatever they write holds values afterwards, whatever it held before.
OVERWRITE = {"fill_", "zero_", "copy_", "uniform_", "normal_", "bernoulli_", "random_", "exponential_",
             "arange", "linspace", "randperm"}
# Their result's size depends on values: computed on the host and allocated to fit.
SIZED_BY_VALUES = {"nonzero", "masked_select", "_unique2", "unique_consecutive", "unique_dim", "_unique"}
# Selections: over uncomputed values they pick by the routing choice.
SELECTIONS = {"topk", "argmax", "argmin", "multinomial", "max.dim", "min.dim"}


@dataclass(frozen=True)
class Settings:
    mode: str = "values"
    routing: Routing = Routing()


def settings_from_environment() -> Settings:
    return Settings(parse_mode(os.environ.get(ENV_COMPUTE, "values") or "values"),
                    parse_routing(os.environ.get(ENV_ROUTING, "balanced") or "balanced"))


def _rewrap_numbers(op: "_Op", args: tuple, kwargs: dict) -> tuple[tuple, dict]:
    if any(i in op.tensor_positions and isinstance(a, (int, float, complex)) for i, a in enumerate(args)):
        args = tuple(wrapped_number(a) if i in op.tensor_positions and isinstance(a, (int, float, complex)) else a
                     for i, a in enumerate(args))
    if any(k in op.tensor_arguments and isinstance(v, (int, float, complex)) for k, v in kwargs.items()):
        kwargs = {k: wrapped_number(v) if k in op.tensor_arguments and isinstance(v, (int, float, complex)) else v
                  for k, v in kwargs.items()}
    return args, kwargs


_TENSOR_TYPES = ("Tensor", "Optional[Tensor]")


def _zero_of(dtype: torch.dtype) -> bool | int | float | complex:
    if dtype == torch.bool:
        return False
    if dtype.is_complex:
        return 0j
    return 0.0 if dtype.is_floating_point else 0


def _small(t: torch.Tensor) -> bool:
    limit = COMPUTE_LIMITS["floating" if t.is_floating_point() or t.is_complex() else "integral"]
    return t.nbytes <= limit


@dataclass
class _Op:
    """One overload's replacement kernel."""

    overload: Any  # torch._ops.OpOverload
    original: Any  # torch._C._SafeKernelFunction
    base: str
    heavy: bool
    written: tuple[int, ...]  # positions of the arguments it writes (in place, out=)
    generator: int | None  # the position of its Generator argument, if it has one
    random: bool  # draws random numbers (torch's nondeterministic_seeded tag)
    tensor_arguments: frozenset[str]  # the names of the arguments typed Tensor (a number there is wrapped)
    tensor_positions: frozenset[int]  # and their positions
    arguments: tuple  # the schema's arguments (read once: every call looks at them)

    def name(self) -> str:
        return f"{self.base}.{self.overload._overloadname}"


class Values:
    """The replacement kernels and what they do, for one process."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.library: Any = None
        self.value_kernel: Callable[[str, str], None] | None = None
        self.tracking = False
        self.ops: list[_Op] = []

    # ---- installing

    def install(self) -> int:
        import warnings

        if self.settings.mode == "none":
            return 0
        from ..common.native import NativeUnavailableError, native

        try:
            self.value_kernel = native().register_value_kernel
        except (NativeUnavailableError, AttributeError) as e:  # (an extension built without CUDA)
            import sys

            print(f"allocscope: the virtual GPU computes no values here: {e}", file=sys.stderr)
            return 0
        self.library = torch.library.Library("aten", "IMPL")
        names = set(COMPUTED) | set(HEAVY)
        names |= {f"{n}_" for n in names}  # the in-place variants: packets of their own (add_, scatter_)
        # torch's own list of elementwise ops, and the multi-tensor (_foreach) ones, for those not named above
        for qualified in torch._C._dispatch_get_all_op_names():
            if qualified.startswith("aten::"):
                base = qualified[6:].split(".")[0]
                if base.startswith("_foreach_"):
                    names.add(base)
                elif base not in names:
                    packet = getattr(torch.ops.aten, base, None)
                    try:
                        overload = getattr(packet, qualified.split(".", 1)[1] if "." in qualified[6:] else "default")
                    except (AttributeError, RuntimeError):
                        continue
                    if torch.Tag.pointwise in overload.tags:
                        names.add(base)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # "Overriding a previously registered kernel"
            for base in sorted(names):
                packet = getattr(torch.ops.aten, base, None)
                if packet is None:
                    continue
                for overload_name in packet.overloads():
                    self._install_one(base, getattr(packet, overload_name))
        if self.ops:
            _hide_own_frames(self._kernel(self.ops[0]))
        return len(self.ops)

    def _install_one(self, base: str, overload: Any) -> None:
        qualified = overload.name()
        try:
            # A CUDA kernel of its own, or the composite one every device shares (copy_): then autograd has
            # a formula for it too, and a CUDA kernel beside it only changes what runs below autograd.
            has = torch._C._dispatch_has_kernel_for_dispatch_key
            if not (has(qualified, "CUDA") or (has(qualified, "CompositeExplicitAutograd") and
                                                not has(qualified, "CompositeImplicitAutograd") and
                                                base in COMPOSITE_WRAPPED)):
                return
        except RuntimeError:  # a TorchScript-only overload (aten::__lshift__.int)
            return
        schema = overload._schema
        written = tuple(i for i, a in enumerate(schema.arguments) if a.alias_info is not None and a.alias_info.is_write)
        op = _Op(overload, torch.library.get_kernel(overload, "CUDA"), base, base in HEAVY, written,
                 next((i for i, a in enumerate(schema.arguments) if a.name == "generator"), None),
                 torch.Tag.nondeterministic_seeded in overload.tags,
                 frozenset(a.name for a in schema.arguments if str(a.type) in _TENSOR_TYPES),
                 frozenset(i for i, a in enumerate(schema.arguments) if str(a.type) in _TENSOR_TYPES),
                 tuple(schema.arguments))
        # (csrc/recorder/value_kernels.cpp: why the CUDA kernel is a C++ one that redispatches here)
        self.library.impl(overload, self._kernel(op), VALUE_KEY, with_keyset=True)
        self.value_kernel(overload._schema.name.split("::", 1)[1],
                          overload._overloadname if overload._overloadname != "default" else "")
        self.ops.append(op)

    # ---- running

    def _kernel(self, op: _Op) -> Callable:
        def kernel(keyset: Any, *args: Any, **kwargs: Any) -> Any:
            if op.tensor_arguments:
                args, kwargs = _rewrap_numbers(op, args, kwargs)
            if torch.cuda.is_current_stream_capturing():  # recorded for replay: nothing runs now
                return op.original.call_boxed(keyset, *args, **kwargs)
            return self._run(op, keyset, args, kwargs)
        kernel.__name__ = f"allocscope_values_{op.base}"
        return kernel

    def _run(self, op: _Op, keyset: Any, args: tuple, kwargs: dict) -> Any:
        if not self.tracking:  # (CUDA is initialized by the time a CUDA kernel runs)
            self.tracking = REGISTRY.track_frees()
        # Errors of torch's kernel are the program's and pass through; this module's own never do: the op then
        # runs as without it, and what it wrote holds no values.
        try:
            arguments = op.arguments
            # what it reads: every CUDA tensor argument, but what an overwriting op writes
            reads = [t for i, a in enumerate(args) if not (i in op.written and op.base in OVERWRITE)
                     for t in on_cuda([a])]
            written_kw = {arguments[i].name for i in op.written}
            reads += [t for k, v in kwargs.items() if k not in written_kw for t in on_cuda([v])]
            inputs_hold = all(REGISTRY.holds(t) for t in reads)
            written = tensors_in([args[i] for i in op.written if i < len(args)])
            written += tensors_in([kwargs[arguments[i].name] for i in op.written if arguments[i].name in kwargs])
        except Exception as e:  # noqa: BLE001
            _debug(op, e)
            return self._uncomputed(op, keyset, args, kwargs)
        if not inputs_hold and self.settings.mode == "all" and _DEBUG:
            _debug(op, RuntimeError("inputs without values: "
                                    f"{[tuple(t.shape) for t in reads if not REGISTRY.holds(t)]}"))

        if op.base in UNINITIALIZED:
            # What a card's uninitialized memory holds is arbitrary too: a program that writes part of it and
            # reads the rest reads arbitrary values on either, so it counts as holding values.
            result = op.original.call_boxed(keyset, *args, **kwargs)
            REGISTRY.set(result, True)
            return result
        if op.base == "_local_scalar_dense":
            if inputs_hold:
                REGISTRY.write_fills(reads)
                return op.original.call_boxed(keyset, *args, **kwargs)
            return _zero_of(args[0].dtype)  # an uncomputed value reads 0
        if op.base == "_amp_foreach_non_finite_check_and_unscale_":
            return self._unscale(op, keyset, args, kwargs)
        if op.base in SIZED_BY_VALUES and not written:  # (out= variants run as torch's)
            return self._sized_by_values(op, keyset, args, kwargs, inputs_hold)
        if not inputs_hold and (op.base in SELECTIONS or op.name() in SELECTIONS) and \
                self.settings.routing.kind != "computed":
            return self._select(op, keyset, args, kwargs)

        if op.base == "copy_" and inputs_hold:
            REGISTRY.write_fills(reads)  # the stand-in copies bytes: those of a pending fill must be there
        # An in-place op's own kernel may call others that compute into the same tensor (index_add_ calls
        # index_add.out): the op is then computed from what the tensor held before, not twice.
        before = []
        try:
            if inputs_hold and op.base not in OVERWRITE and (self.settings.mode == "all" or not op.heavy):
                updated = on_cuda([args[i] for i in op.written if i < len(args) and not arguments[i].kwarg_only])
                if all(_small(t) or self.settings.mode == "all" for t in updated):
                    REGISTRY.write_fills(updated)
                    before = [(t, host_alias(t).clone()) for t in updated]
        except Exception as e:  # noqa: BLE001
            _debug(op, e)
            inputs_hold = False
        result = op.original.call_boxed(keyset, *args, **kwargs)
        try:
            self._finish(op, args, kwargs, result, written, reads, inputs_hold, before)
        except Exception as e:  # noqa: BLE001
            _debug(op, e)
        return result

    def _finish(self, op: _Op, args: tuple, kwargs: dict, result: Any, written: list, reads: list,
                inputs_hold: bool, before: list) -> None:
        """After torch's kernel ran: computes the op where it is to be, and records what holds values."""
        outputs = written if written else tensors_in(result if isinstance(result, (list, tuple)) else [result])
        outputs = [t for t in outputs if t.is_cuda]
        if op.name() in ("fill_.Scalar", "zero_.default") and self.settings.mode != "all" and len(outputs) == 1 \
                and outputs[0].nbytes > COMPUTE_LIMITS["floating"] and covers_storage(outputs[0]):
            REGISTRY.fill_later(outputs[0], args[1] if op.base == "fill_" else 0)
            return
        compute = inputs_hold and (self.settings.mode == "all" or
                                   (not op.heavy and all(_small(t) for t in outputs)))
        if op.base == "copy_" and not compute and inputs_hold:
            compute = self._copied_bytes(args)
        if compute:  # (a pending fill written first where the op reads it or writes part of it)
            REGISTRY.write_fills(reads + [t for t in outputs if not covers_storage(t)])
            for t, held in before:
                host_alias(t).copy_(held)
            compute = self._compute(op, args, kwargs, result, written, outputs)
        for t in outputs:
            if compute:
                # a partial write into a storage that held no values leaves it without
                if written and op.base in OVERWRITE and not REGISTRY.holds(t) and not covers_storage(t):
                    continue
                REGISTRY.set(t, True)
            else:
                REGISTRY.set(t, False)
        if not compute and op.base == "copy_" and not args[0].is_cuda:
            args[0].zero_()  # an uncomputed value copied to the host reads 0

    def _uncomputed(self, op: _Op, keyset: Any, args: tuple, kwargs: dict) -> Any:
        result = op.original.call_boxed(keyset, *args, **kwargs)
        names = {op.arguments[i].name for i in op.written}
        written = [args[i] for i in op.written if i < len(args)] + [v for k, v in kwargs.items() if k in names]
        for t in on_cuda([*written, *(result if isinstance(result, (list, tuple)) else [result])]):
            REGISTRY.set(t, False)
        return result

    def _unscale(self, op: _Op, keyset: Any, args: tuple, kwargs: dict) -> Any:
        """GradScaler's check for infs: uncomputed gradients hold none (found_inf keeps what it held), so a step
        is skipped only where a computed gradient has one."""
        result = op.original.call_boxed(keyset, *args, **kwargs)
        grads, found_inf, inv_scale = args[0], args[1], args[2]
        held = [g for g in grads if REGISTRY.holds(g) and (self.settings.mode == "all" or _small(g))]
        if held and REGISTRY.holds(found_inf) and REGISTRY.holds(inv_scale):
            try:
                with torch._C._DisableTorchDispatch(), torch.no_grad():
                    op.overload([host_alias(g) for g in held], host_alias(found_inf), host_alias(inv_scale))
            except Exception as e:  # noqa: BLE001
                _debug(op, e)
                held = []
        for g in grads:
            if not any(g is h for h in held):
                REGISTRY.set(g, False)
        return result

    def _copied_bytes(self, args: tuple) -> bool:
        """Whether copy_ moved bytes without a kernel (same dtype, both dense): then the stand-in copied them."""
        dst, src = args[0], args[1]
        if not isinstance(src, torch.Tensor) or dst.dtype != src.dtype or dst.shape != src.shape:
            return False
        if not (dst.is_contiguous() and src.is_contiguous()):
            return False
        if dst.is_cuda and not src.is_cuda:
            return True  # host to device: the stand-in's memcpy
        return dst.is_cuda and src.is_cuda  # device to device: cudaMemcpyAsync, a copy

    def _compute(self, op: _Op, args: tuple, kwargs: dict, result: Any, written: list, outputs: list) -> bool:
        if op.base == "copy_" and self._copied_bytes(args):
            return True  # already done by the stand-in's copy
        generator = None
        if op.random:
            device = next((t.device.index for t in outputs), None)
            generator = GENERATORS.for_device(device if device is not None else torch.cuda.current_device())
        try:
            host_args = to_host(args, generator)
            host_kwargs = {k: to_host(v, generator) for k, v in kwargs.items()}
            if op.generator is not None:  # ours, in its place (none given: the device's default)
                if op.generator < len(host_args):
                    host_args = (*host_args[:op.generator], generator, *host_args[op.generator + 1:])
                else:
                    host_kwargs["generator"] = generator
            results = tensors_in(result if isinstance(result, (list, tuple)) else [result])
            # a random op that takes no generator (native_dropout) draws from the CPU's default one: from a
            # fork of it seeded from ours, so that the program's own CPU random numbers stay as on a card
            rng = contextlib.nullcontext()
            if op.random and op.generator is None:
                rng = torch.random.fork_rng(devices=[])
            with rng, torch._C._DisableTorchDispatch(), torch.no_grad():
                if op.random and op.generator is None:
                    torch.manual_seed(int(torch.randint(1 << 62, (1,), generator=generator)))
                substitute = host_ops.substitute(op.name())
                if substitute is not None:
                    substitute(op.overload, host_args, host_kwargs, [to_host(t, None) for t in results])
                    return True
                host_result = op.overload(*host_args, **host_kwargs)
                if not written:
                    for out, ref in zip(results, tensors_in(host_result if isinstance(host_result, (list, tuple))
                                                          else [host_result]), strict=False):
                        if out.is_cuda:
                            host_alias(out).copy_(ref)
        except Exception as e:  # noqa: BLE001 - a value not computed leaves the program as it was
            _debug(op, e)
            return False
        return True

    def _sized_by_values(self, op: _Op, keyset: Any, args: tuple, kwargs: dict, inputs_hold: bool) -> Any:
        """nonzero, masked_select, unique: computed on the host and allocated to fit; over uncomputed values,
        as if every element were selected and distinct."""
        try:
            if inputs_hold:
                REGISTRY.write_fills(on_cuda(args))
            host_args = list(to_host(args, None))
            if not inputs_hold:
                if op.base == "masked_select":
                    host_args[1] = torch.ones(host_args[1].shape, dtype=torch.bool)
                elif op.base == "nonzero":
                    host_args[0] = torch.ones(host_args[0].shape, dtype=torch.bool)
                elif host_args[0].dtype != torch.bool:
                    host_args[0] = torch.arange(host_args[0].numel()).view(host_args[0].shape).to(host_args[0].dtype)
            with torch._C._DisableTorchDispatch(), torch.no_grad():
                host = op.overload(*host_args, **{k: to_host(v, None) for k, v in kwargs.items()})
        except Exception:  # noqa: BLE001
            return op.original.call_boxed(keyset, *args, **kwargs)
        device = on_cuda(args)[0].device
        outs = []
        for ref in (host if isinstance(host, (list, tuple)) else [host]):
            out = torch.empty_strided(ref.shape, ref.stride(), dtype=ref.dtype, device=device)
            host_alias(out).copy_(ref)
            REGISTRY.set(out, inputs_hold or op.base in ("nonzero",))
            outs.append(out)
        return tuple(outs) if isinstance(host, (list, tuple)) else outs[0]

    def _select(self, op: _Op, keyset: Any, args: tuple, kwargs: dict) -> Any:
        """topk, argmax, max.dim, multinomial over uncomputed values: the routing choice picks."""
        result = op.original.call_boxed(keyset, *args, **kwargs)
        source = args[0]
        arguments = op.arguments
        bound = {a.name: (args[i] if i < len(args) else kwargs.get(a.name, a.default_value))
                 for i, a in enumerate(arguments)}
        if op.base == "topk":
            k, dim = int(bound["k"]), int(bound["dim"] if bound["dim"] is not None else -1)
        elif op.base == "multinomial":
            k, dim = int(bound["num_samples"]), -1
        else:
            k, dim = 1, bound.get("dim")
        indices = result[1] if isinstance(result, (list, tuple)) else result
        if not isinstance(indices, torch.Tensor) or not indices.is_cuda or indices.dtype != torch.int64:
            return result
        try:
            if dim is None:  # argmax over everything
                picked = select((1, source.numel()), 1, self.settings.routing).view(indices.shape)
            else:
                moved = source.movedim(int(dim), -1) if source.dim() else source.view(1)
                picked = select(tuple(moved.shape[:-1]) + (moved.shape[-1],), k, self.settings.routing)
                keepdim = bool(bound.get("keepdim", False))
                if op.base in ("argmax", "argmin", "max", "min") and not keepdim:
                    picked = picked.squeeze(-1)
                elif source.dim():
                    picked = picked.movedim(-1, int(dim))
            host_alias(indices).copy_(picked.view(indices.shape))
        except Exception:  # noqa: BLE001
            return result
        REGISTRY.set(indices, True)
        return result


def _hide_own_frames(kernel: Callable) -> None:
    """An allocation made inside these kernels is the op's that the program called: the recorder leaves the
    frames in which one can happen (those that call torch's CUDA kernel or allocate) out of its stacks, so that
    a stack's innermost frame stays the program's line."""
    from ..common.native import native

    for function in (kernel, Values._run, Values._sized_by_values, Values._select, Values._unscale):
        native().hide_frames_of(function.__code__)


# ALLOCSCOPE_VGPU_VALUES_DEBUG=1: say on stderr why an op was not computed (for allocscope's developers)
_DEBUG = bool(os.environ.get("ALLOCSCOPE_VGPU_VALUES_DEBUG"))


def _debug(op: _Op, error: BaseException) -> None:
    if _DEBUG:
        import sys

        print(f"allocscope values: {op.name()} not computed: {type(error).__name__}: {error}", file=sys.stderr)


_installed: Values | None = None


def install_values(settings: Settings | None = None) -> Values:
    """Replaces the chosen ops' CUDA kernels in this process (once), after torch is imported."""
    global _installed
    if _installed is None:
        _installed = Values(settings or settings_from_environment())
        _installed.install()
    return _installed


def installed_values() -> Values | None:
    return _installed
