"""Writes what torchtitan's Llama 3 debug config reads from its repository's
tests/assets (its wheel leaves them out): a small word-level tokenizer and a
c4_test data set of made-up text, under DIR/tests/assets.

    python torchtitan_assets.py DIR
"""

import json
import os
import random
import sys

WORDS = ("the quick brown fox jumps over a lazy dog while memory caches tensors of every model "
         "train step batch layer allocator block segment stream graph").split()
SPECIAL = ["<|begin_of_text|>", "<|end_of_text|>", "<|unk|>"]


def write(root: str, documents: int = 400, words_per_document: int = 600) -> None:
    from tokenizers import Tokenizer, models, pre_tokenizers

    folder = os.path.join(root, "tests", "assets", "tokenizer")
    os.makedirs(folder, exist_ok=True)
    vocab = {w: i for i, w in enumerate(SPECIAL + WORDS)}
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="<|unk|>"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer.add_special_tokens(SPECIAL)
    tokenizer.save(os.path.join(folder, "tokenizer.json"))
    with open(os.path.join(folder, "tokenizer_config.json"), "w") as f:
        json.dump({"bos_token": SPECIAL[0], "eos_token": SPECIAL[1], "add_bos_token": True}, f)
    data = os.path.join(root, "tests", "assets", "c4_test")
    os.makedirs(data, exist_ok=True)
    rng = random.Random(0)
    with open(os.path.join(data, "data.json"), "w") as f:
        for _ in range(documents):
            f.write(json.dumps({"text": " ".join(rng.choice(WORDS) for _ in range(words_per_document))}) + "\n")


if __name__ == "__main__":
    write(sys.argv[1])
