"""A Hugging Face script as its docs write it: transformers imported before
torch (transformers looks for torch with importlib.util.find_spec when it is
imported). Trains a tiny GPT-2 a step; appends {"pid", "max_reserved"} to
$FORMS_TRUTH. Never imports allocscope."""
from transformers import GPT2Config, GPT2LMHeadModel

import json
import os

import torch

config = GPT2Config(n_layer=2, n_head=2, n_embd=64, vocab_size=1000, n_positions=64)
model = GPT2LMHeadModel(config).cuda()
optimizer = torch.optim.AdamW(model.parameters())
ids = torch.randint(0, 1000, (4, 32), device="cuda")
model(ids, labels=ids).loss.backward()
optimizer.step()
torch.cuda.synchronize()
with open(os.environ["FORMS_TRUTH"], "a") as f:
    f.write(json.dumps({"pid": os.getpid(), "max_reserved": torch.cuda.max_memory_reserved()}) + "\n")
