"""Real model architectures at their published sizes, built from
configurations with random weights (no downloads): GPT-2 small, a
Llama-style decoder (TinyLlama-1.1B's shape), BERT-base, ResNet-50,
ConvNeXt-T and a diffusion-style UNet (the convolutional ones: what cuDNN
runs on a card).

build(name, impl) returns (model, make_batch, loss_fn). impl "hf" uses
transformers / torchvision (optional extras), "plain" the plain-PyTorch
equivalents below (same layer shapes, parameter counts within 0.1%), and
"auto" the first that is installed. The plain versions follow the reference
implementations' structure: dropout where GPT-2 and BERT have it, tied
embeddings where they tie them, SDPA attention.
"""

from __future__ import annotations

from typing import Any, Callable

import torch
import torch.nn.functional as F
from torch import nn

MODELS = ("gpt2", "llama", "bert", "resnet50", "convnext", "unet")
CONV_MODELS = ("resnet50", "convnext", "unet")
# Batch size when none is given: real_models.py's and bench_fit.py's
DEFAULT_BATCH = {"resnet50": 32, "convnext": 32, "llama": 1}


def default_batch(name: str) -> int:
    return DEFAULT_BATCH.get(name, 8)

# (what it is, its published parameter count)
ABOUT = {
    "gpt2": ("GPT-2 small: 12 layers, d 768, 12 heads, vocab 50257, 1024 positions", 124_439_808),
    "llama": ("Llama-style decoder, TinyLlama-1.1B's shape: 22 layers, d 2048, 32 heads (4 KV), "
              "SwiGLU 5632, vocab 32000", 1_100_048_384),
    "bert": ("BERT-base with its masked-LM head: 12 layers, d 768, 12 heads, vocab 30522", 109_514_298),
    "resnet50": ("ResNet-50: bottlenecks [3, 4, 6, 3], 224x224 inputs, 1000 classes", 25_557_032),
    "convnext": ("ConvNeXt-T: depths [3, 3, 9, 3], widths [96, 192, 384, 768], 224x224 inputs, 1000 classes",
                 28_589_128),
    "unet": ("diffusion-style UNet (allocscope's own: no published count): 4x64x64 latents, widths "
             "[128, 256, 512], two residual blocks per level with GroupNorm and SiLU, self-attention at 16x16",
             57_569_284),
}


# ---- GPT-2


class _GPT2Block(nn.Module):
    def __init__(self, d: int, heads: int, p: float):
        super().__init__()
        self.heads, self.p = heads, p
        self.ln_1, self.ln_2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.c_attn, self.c_proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(approximate="tanh"), nn.Linear(4 * d, d), nn.Dropout(p))
        self.resid_dropout = nn.Dropout(p)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.c_attn(self.ln_1(x)).split(d, dim=2)
        q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True, dropout_p=self.p if self.training else 0.0)
        x = x + self.resid_dropout(self.c_proj(y.transpose(1, 2).reshape(b, t, d)))
        return x + self.mlp(self.ln_2(x))


class GPT2(nn.Module):
    def __init__(self, vocab: int = 50257, positions: int = 1024, d: int = 768, layers: int = 12, heads: int = 12,
                 p: float = 0.1):
        super().__init__()
        self.wte, self.wpe, self.drop = nn.Embedding(vocab, d), nn.Embedding(positions, d), nn.Dropout(p)
        self.h = nn.ModuleList(_GPT2Block(d, heads, p) for _ in range(layers))
        self.ln_f = nn.LayerNorm(d)
        self.lm_head = nn.Linear(d, vocab, bias=False)
        self.lm_head.weight = self.wte.weight  # tied, as GPT-2's

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        pos = torch.arange(idx.shape[1], device=idx.device)
        x = self.drop(self.wte(idx) + self.wpe(pos))
        for block in self.h:
            x = _maybe_checkpoint(self, block, x)
        return self.lm_head(self.ln_f(x))


# ---- Llama-style decoder


class RMSNorm(nn.Module):
    def __init__(self, d: int, eps: float = 1e-5):
        super().__init__()
        self.weight, self.eps = nn.Parameter(torch.ones(d)), eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        x = x.float()
        return self.weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)).to(dtype)


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rotated * sin


class _LlamaBlock(nn.Module):
    def __init__(self, d: int, heads: int, kv_heads: int, hidden: int):
        super().__init__()
        self.heads, self.kv_heads, self.hd = heads, kv_heads, d // heads
        self.input_layernorm, self.post_attention_layernorm = RMSNorm(d), RMSNorm(d)
        self.q_proj = nn.Linear(d, d, bias=False)
        self.k_proj = nn.Linear(d, kv_heads * self.hd, bias=False)
        self.v_proj = nn.Linear(d, kv_heads * self.hd, bias=False)
        self.o_proj = nn.Linear(d, d, bias=False)
        self.gate_proj, self.up_proj = nn.Linear(d, hidden, bias=False), nn.Linear(d, hidden, bias=False)
        self.down_proj = nn.Linear(hidden, d, bias=False)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        h = self.input_layernorm(x)
        q = self.q_proj(h).view(b, t, self.heads, self.hd).transpose(1, 2)
        k = self.k_proj(h).view(b, t, self.kv_heads, self.hd).transpose(1, 2)
        v = self.v_proj(h).view(b, t, self.kv_heads, self.hd).transpose(1, 2)
        q, k = _rotate(q, cos, sin), _rotate(k, cos, sin)
        k, v = (z.repeat_interleave(self.heads // self.kv_heads, dim=1) for z in (k, v))  # as HF's eager GQA
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.o_proj(y.transpose(1, 2).reshape(b, t, d))
        h = self.post_attention_layernorm(x)
        return x + self.down_proj(F.silu(self.gate_proj(h)) * self.up_proj(h))


class Llama(nn.Module):
    def __init__(self, vocab: int = 32000, d: int = 2048, layers: int = 22, heads: int = 32, kv_heads: int = 4,
                 hidden: int = 5632, positions: int = 2048, theta: float = 10000.0):
        super().__init__()
        self.embed_tokens = nn.Embedding(vocab, d)
        self.layers = nn.ModuleList(_LlamaBlock(d, heads, kv_heads, hidden) for _ in range(layers))
        self.norm = RMSNorm(d)
        self.lm_head = nn.Linear(d, vocab, bias=False)
        hd = d // heads
        inv = 1.0 / theta ** (torch.arange(0, hd, 2, dtype=torch.float32) / hd)
        angles = torch.outer(torch.arange(positions, dtype=torch.float32), inv)
        angles = torch.cat((angles, angles), dim=-1)
        self.register_buffer("cos", angles.cos(), persistent=False)
        self.register_buffer("sin", angles.sin(), persistent=False)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        t = idx.shape[1]
        x = self.embed_tokens(idx)
        cos, sin = self.cos[:t].to(x.dtype), self.sin[:t].to(x.dtype)
        for block in self.layers:
            x = _maybe_checkpoint(self, block, x, cos, sin)
        return self.lm_head(self.norm(x)).float()


# ---- BERT-base (masked LM)


class _BertLayer(nn.Module):
    def __init__(self, d: int, heads: int, hidden: int, p: float):
        super().__init__()
        self.heads, self.p = heads, p
        self.query, self.key, self.value = nn.Linear(d, d), nn.Linear(d, d), nn.Linear(d, d)
        self.attn_out, self.attn_norm = nn.Linear(d, d), nn.LayerNorm(d, eps=1e-12)
        self.intermediate, self.output = nn.Linear(d, hidden), nn.Linear(hidden, d)
        self.out_norm, self.drop = nn.LayerNorm(d, eps=1e-12), nn.Dropout(p)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = (f(x).view(b, t, self.heads, d // self.heads).transpose(1, 2)
                   for f in (self.query, self.key, self.value))
        y = F.scaled_dot_product_attention(q, k, v, dropout_p=self.p if self.training else 0.0)
        x = self.attn_norm(x + self.drop(self.attn_out(y.transpose(1, 2).reshape(b, t, d))))
        return self.out_norm(x + self.drop(self.output(F.gelu(self.intermediate(x)))))


class Bert(nn.Module):
    def __init__(self, vocab: int = 30522, d: int = 768, layers: int = 12, heads: int = 12, hidden: int = 3072,
                 positions: int = 512, p: float = 0.1):
        super().__init__()
        self.word, self.position, self.token_type = nn.Embedding(vocab, d), nn.Embedding(positions, d), nn.Embedding(2, d)
        self.embed_norm, self.drop = nn.LayerNorm(d, eps=1e-12), nn.Dropout(p)
        self.layer = nn.ModuleList(_BertLayer(d, heads, hidden, p) for _ in range(layers))
        self.transform, self.transform_norm = nn.Linear(d, d), nn.LayerNorm(d, eps=1e-12)
        self.decoder = nn.Linear(d, vocab)
        self.decoder.weight = self.word.weight  # tied, as BERT's

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        pos = torch.arange(idx.shape[1], device=idx.device)
        x = self.drop(self.embed_norm(self.word(idx) + self.position(pos) + self.token_type(torch.zeros_like(idx))))
        for layer in self.layer:
            x = _maybe_checkpoint(self, layer, x)
        return self.decoder(self.transform_norm(F.gelu(self.transform(x))))


# ---- ResNet-50


class _Bottleneck(nn.Module):
    def __init__(self, cin: int, width: int, stride: int):
        super().__init__()
        cout = width * 4
        self.body = nn.Sequential(
            nn.Conv2d(cin, width, 1, bias=False), nn.BatchNorm2d(width), nn.ReLU(inplace=True),
            nn.Conv2d(width, width, 3, stride, 1, bias=False), nn.BatchNorm2d(width), nn.ReLU(inplace=True),
            nn.Conv2d(width, cout, 1, bias=False), nn.BatchNorm2d(cout))
        self.downsample = (nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))
                           if stride != 1 or cin != cout else nn.Identity())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.relu(self.body(x) + self.downsample(x))


class ResNet50(nn.Module):
    def __init__(self, classes: int = 1000):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 64, 7, 2, 3, bias=False), nn.BatchNorm2d(64), nn.ReLU(inplace=True),
                                  nn.MaxPool2d(3, 2, 1))
        stages, cin = [], 64
        for width, blocks, stride in ((64, 3, 1), (128, 4, 2), (256, 6, 2), (512, 3, 2)):
            for i in range(blocks):
                stages.append(_Bottleneck(cin, width, stride if i == 0 else 1))
                cin = width * 4
        self.stages = nn.ModuleList(stages)
        self.fc = nn.Linear(2048, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.stem(x)
        for block in self.stages:
            x = _maybe_checkpoint(self, block, x)
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))


# ---- ConvNeXt-T (torchvision's structure)


class _LayerNorm2d(nn.LayerNorm):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return super().forward(x.permute(0, 2, 3, 1)).permute(0, 3, 1, 2)


class _ConvNeXtBlock(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.dwconv = nn.Conv2d(dim, dim, 7, padding=3, groups=dim)
        self.norm = nn.LayerNorm(dim, eps=1e-6)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))
        self.layer_scale = nn.Parameter(torch.full((dim, 1, 1), 1e-6))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.mlp(self.norm(self.dwconv(x).permute(0, 2, 3, 1))).permute(0, 3, 1, 2)
        return x + self.layer_scale * y


class ConvNeXt(nn.Module):
    def __init__(self, classes: int = 1000):
        super().__init__()
        widths, depths = (96, 192, 384, 768), (3, 3, 9, 3)
        layers: list[nn.Module] = [nn.Sequential(nn.Conv2d(3, 96, 4, 4), _LayerNorm2d(96, eps=1e-6))]
        for i, (width, depth) in enumerate(zip(widths, depths, strict=True)):
            layers += [_ConvNeXtBlock(width) for _ in range(depth)]
            if i < 3:
                layers.append(nn.Sequential(_LayerNorm2d(width, eps=1e-6), nn.Conv2d(width, widths[i + 1], 2, 2)))
        self.features = nn.ModuleList(layers)
        self.head = nn.Sequential(_LayerNorm2d(768, eps=1e-6), nn.Flatten(1), nn.Linear(768, classes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.features:
            x = _maybe_checkpoint(self, layer, x)
        return self.head[2](self.head[1](self.head[0](F.adaptive_avg_pool2d(x, 1))))


# ---- a diffusion-style UNet (DDPM / Stable Diffusion's layout, smaller)


class _ResBlock(nn.Module):
    def __init__(self, cin: int, cout: int, temb: int):
        super().__init__()
        self.norm1, self.conv1 = nn.GroupNorm(32, cin), nn.Conv2d(cin, cout, 3, padding=1)
        self.temb = nn.Linear(temb, cout)
        self.norm2, self.conv2 = nn.GroupNorm(32, cout), nn.Conv2d(cout, cout, 3, padding=1)
        self.skip = nn.Conv2d(cin, cout, 1) if cin != cout else nn.Identity()

    def forward(self, x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        h = self.conv1(F.silu(self.norm1(x))) + self.temb(t)[:, :, None, None]
        return self.skip(x) + self.conv2(F.silu(self.norm2(h)))


class _Attention2d(nn.Module):
    def __init__(self, dim: int, heads: int = 8):
        super().__init__()
        self.norm, self.heads = nn.GroupNorm(32, dim), heads
        self.qkv, self.out = nn.Conv2d(dim, 3 * dim, 1), nn.Conv2d(dim, dim, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, c, h, w = x.shape
        q, k, v = self.qkv(self.norm(x)).reshape(b, 3, self.heads, c // self.heads, h * w).transpose(-1, -2).unbind(1)
        y = F.scaled_dot_product_attention(q, k, v).transpose(-1, -2).reshape(b, c, h, w)
        return x + self.out(y)


class UNet(nn.Module):
    def __init__(self, channels: int = 4, widths: tuple[int, ...] = (128, 256, 512)):
        super().__init__()
        temb = 4 * widths[0]
        self.time = nn.Sequential(nn.Linear(widths[0], temb), nn.SiLU(), nn.Linear(temb, temb))
        self.inp = nn.Conv2d(channels, widths[0], 3, padding=1)
        self.down, skips, cin = nn.ModuleList(), [widths[0]], widths[0]
        for i, width in enumerate(widths):
            for _ in range(2):
                self.down.append(_ResBlock(cin, width, temb))
                cin = width
                skips.append(cin)
            if i < len(widths) - 1:
                self.down.append(nn.Conv2d(cin, cin, 3, stride=2, padding=1))
                skips.append(cin)
        self.mid = nn.ModuleList([_ResBlock(cin, cin, temb), _Attention2d(cin), _ResBlock(cin, cin, temb)])
        self.up = nn.ModuleList()
        for i, width in reversed(list(enumerate(widths))):
            for _ in range(3):
                self.up.append(_ResBlock(cin + skips.pop(), width, temb))
                cin = width
            if i > 0:
                self.up.append(nn.Conv2d(cin, cin, 3, padding=1))  # after a nearest 2x upsample
        self.out = nn.Sequential(nn.GroupNorm(32, cin), nn.SiLU(), nn.Conv2d(cin, channels, 3, padding=1))
        self.width0 = widths[0]

    def forward(self, x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        half = self.width0 // 2
        freqs = torch.exp(-torch.arange(half, device=x.device) * (9.21 / half))
        t = self.time(torch.cat([torch.sin(t[:, None] * freqs), torch.cos(t[:, None] * freqs)], dim=1))
        h, skips = self.inp(x), []
        skips.append(h)
        for layer in self.down:
            h = _maybe_checkpoint(self, layer, h, t) if isinstance(layer, _ResBlock) else layer(h)
            skips.append(h)
        h = self.mid[2](self.mid[1](self.mid[0](h, t)), t)
        for layer in self.up:
            if isinstance(layer, _ResBlock):
                h = _maybe_checkpoint(self, layer, torch.cat([h, skips.pop()], dim=1), t)
            else:
                h = layer(F.interpolate(h, scale_factor=2.0, mode="nearest"))
        return self.out(h)


def _maybe_checkpoint(owner: nn.Module, block: nn.Module, *args: Any) -> torch.Tensor:
    if getattr(owner, "checkpointing", False) and owner.training:
        from torch.utils.checkpoint import checkpoint

        return checkpoint(block, *args, use_reentrant=False)
    return block(*args)


# ---- building


def _hf(name: str) -> nn.Module:
    if name in ("resnet50", "convnext"):
        import torchvision

        return torchvision.models.resnet50() if name == "resnet50" else torchvision.models.convnext_tiny()
    import transformers as T

    if name == "gpt2":
        return T.GPT2LMHeadModel(T.GPT2Config())
    if name == "llama":
        return T.LlamaForCausalLM(T.LlamaConfig(vocab_size=32000, hidden_size=2048, intermediate_size=5632,
                                                num_hidden_layers=22, num_attention_heads=32, num_key_value_heads=4,
                                                max_position_embeddings=2048))
    return T.BertForMaskedLM(T.BertConfig())


def installed(impl: str, name: str) -> bool:
    import importlib.util

    if name == "unet":
        return impl == "plain"
    module = "torchvision" if name in ("resnet50", "convnext") else "transformers"
    return impl == "plain" or importlib.util.find_spec(module) is not None


def build(name: str, impl: str = "auto", *, seq: int | None = None,
          checkpointing: bool = False) -> tuple[nn.Module, Callable[[int, torch.device], Any], Callable[..., Any]]:
    """(model, make_batch(batch, device) -> inputs, loss(model, inputs) -> scalar)."""
    if name not in MODELS:
        raise ValueError(f"unknown model {name!r}: one of {', '.join(MODELS)}")
    if impl == "auto":
        impl = "hf" if installed("hf", name) else "plain"
    hf = impl == "hf"
    model = _hf(name) if hf else {"gpt2": GPT2, "llama": Llama, "bert": Bert, "resnet50": ResNet50,
                                  "convnext": ConvNeXt, "unet": UNet}[name]()
    if checkpointing:
        if hf and name not in CONV_MODELS:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        elif hf:
            raise ValueError(f"activation checkpointing of torchvision's {name}: use --impl plain")
        else:
            model.checkpointing = True
    if name == "unet":  # denoising: predict the noise added to a latent at a random step
        def make_latents(batch: int, device: torch.device) -> Any:
            return (torch.randn(batch, 4, 64, 64, device=device), torch.randint(0, 1000, (batch,), device=device))

        def denoise_loss(model: nn.Module, inputs: Any) -> torch.Tensor:
            noise = torch.randn_like(inputs[0])
            return F.mse_loss(model(inputs[0] + noise, inputs[1].float()), noise)
        return model, make_latents, denoise_loss
    if name in ("resnet50", "convnext"):
        def make_batch(batch: int, device: torch.device) -> Any:
            return (torch.randn(batch, 3, 224, 224, device=device), torch.randint(0, 1000, (batch,), device=device))

        def loss(model: nn.Module, inputs: Any) -> torch.Tensor:
            return F.cross_entropy(model(inputs[0]), inputs[1])
        return model, make_batch, loss
    vocab = {"gpt2": 50257, "llama": 32000, "bert": 30522}[name]
    length = seq or {"gpt2": 1024, "llama": 2048, "bert": 512}[name]

    def make_tokens(batch: int, device: torch.device) -> Any:
        return torch.randint(0, vocab, (batch, length), device=device)

    def lm_loss(model: nn.Module, idx: torch.Tensor) -> torch.Tensor:
        if hf:
            return model(input_ids=idx, labels=idx).loss
        logits = model(idx)
        if name == "bert":  # masked LM: every position predicts its token
            return F.cross_entropy(logits.view(-1, vocab), idx.view(-1))
        return F.cross_entropy(logits[:, :-1].reshape(-1, vocab), idx[:, 1:].reshape(-1))
    return model, make_tokens, lm_loss


def train_steps(model: nn.Module, opt: torch.optim.Optimizer, make_batch: Callable[[int, torch.device], Any],
                loss_fn: Callable[..., Any], *, batch: int, steps: int, device: torch.device, accumulate: int = 1,
                amp: str | None = None, after_step: Callable[[int], Any] | None = None) -> None:
    """The training loop of real_models.py (and of the benchmark's MemTracker
    runs): steps optimizer steps of accumulate micro-batches each, under
    torch.autocast to amp ("bf16", "fp16": with a GradScaler) if given."""
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(amp or "")
    scaler = torch.amp.GradScaler(device.type) if amp == "fp16" else None
    for step in range(steps):
        for _ in range(accumulate):
            inputs = make_batch(batch, device)
            with torch.autocast(device.type, dtype=dtype, enabled=dtype is not None):
                loss = loss_fn(model, inputs) / accumulate
            (scaler.scale(loss) if scaler else loss).backward()
        if scaler:
            scaler.step(opt)
            scaler.update()
        else:
            opt.step()
        opt.zero_grad(set_to_none=True)
        if after_step is not None:
            after_step(step)


def parameters(model: nn.Module) -> int:
    return sum(p.numel() for p in {id(p): p for p in model.parameters()}.values())


__all__ = ["ABOUT", "CONV_MODELS", "DEFAULT_BATCH", "MODELS", "build", "default_batch", "installed", "parameters",
           "train_steps"]
