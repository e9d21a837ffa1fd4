"""One training step of a Llama-2-7B-shaped Hugging Face model (32 layers, width 4096), built on the device in
bf16 (nothing downloaded, nothing built on the host), AdamW; prints torch's peaks as JSON. For dry runs:

    allocscope run --gpu H100-80GB --no-record -- python benchmarks/llama7b_step.py
"""

import json
import sys

import torch
import transformers

layers = int(sys.argv[1]) if len(sys.argv) > 1 else 32
config = transformers.LlamaConfig(hidden_size=4096, intermediate_size=11008, num_hidden_layers=layers,
                                  num_attention_heads=32, num_key_value_heads=32, vocab_size=32000)
with torch.device("cuda"):
    model = transformers.LlamaForCausalLM(config).to(torch.bfloat16)
model.gradient_checkpointing_enable()
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5)
ids = torch.randint(0, 32000, (1, 512), device="cuda")
model(input_ids=ids, labels=ids).loss.backward()
optimizer.step()
print(json.dumps({"parameters": sum(p.numel() for p in model.parameters()),
                  "max_reserved": torch.cuda.max_memory_reserved(), "max_allocated": torch.cuda.max_memory_allocated()}))
