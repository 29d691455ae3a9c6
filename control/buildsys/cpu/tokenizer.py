"""A byte-level BPE tokenizer trained with the ``tokenizers`` library (deterministic for a corpus).

Special tokens: ``<|bos|>`` (id 0), ``<|eos|>`` (id 1), ``<|pad|>`` (id 2). Files are encoded as
``bos + tokens + eos`` and concatenated into one training stream.
"""

from __future__ import annotations

import numpy as np

BOS, EOS, PAD = "<|bos|>", "<|eos|>", "<|pad|>"
SPECIALS = (BOS, EOS, PAD)


def train_tokenizer(texts: list[str], vocab_size: int):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, min_frequency=2, special_tokens=list(SPECIALS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False,
    )
    tok.train_from_iterator(texts, trainer)
    return tok


def special_ids(tok) -> dict[str, int]:
    return {name: tok.token_to_id(t) for name, t in (("bos", BOS), ("eos", EOS), ("pad", PAD))}


def encode_files(tok, texts: list[str]) -> list[np.ndarray]:
    """Each text as int32 ids wrapped in bos ... eos."""
    ids = special_ids(tok)
    out = []
    for enc in tok.encode_batch(texts, add_special_tokens=False):
        arr = np.empty(len(enc.ids) + 2, dtype=np.int32)
        arr[0] = ids["bos"]
        arr[1:-1] = enc.ids
        arr[-1] = ids["eos"]
        out.append(arr)
    return out
