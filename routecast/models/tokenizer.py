"""The byte-level BPE tokenizer of the built-in model, trained with the `tokenizers` package.

Byte-level means every UTF-8 string round-trips exactly (decode(encode(s)) == s) and no input is
out of vocabulary. Special tokens: ``<|pad|>`` (id 0), ``<|bos|>`` (1), ``<|eos|>`` (2). Encoding with
``add_special_tokens=True`` prepends ``<|bos|>``, as in training, where every document is
``<|bos|> text <|eos|>``.

Training text is balanced across tasks (at most ``max_bytes_per_task`` of each task's train split)
so the larger tasks (docs, code) do not crowd the vocabulary. The result is saved as a
``PreTrainedTokenizerFast`` (tokenizer.json + tokenizer_config.json + special_tokens_map.json), so
``transformers.AutoTokenizer.from_pretrained(dir)`` loads it offline.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from pathlib import Path

from routecast.common.errors import ConfigError
from routecast.models.corpus import Document

PAD, BOS, EOS = "<|pad|>", "<|bos|>", "<|eos|>"
SPECIALS = (PAD, BOS, EOS)


def _single_thread_tokenizers() -> None:
    # The tokenizers crate parallelises with rayon; the machine's cores are shared, so use one.
    os.environ.setdefault("RAYON_NUM_THREADS", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def balanced_texts(docs: Sequence[Document], max_bytes_per_task: int) -> list[str]:
    """Texts of docs, keeping at most max_bytes_per_task UTF-8 bytes per task (whole docs, in order)."""
    used: dict[str, int] = {}
    out = []
    for d in docs:
        n = len(d.text.encode())
        if used.get(d.task, 0) + n <= max_bytes_per_task or d.task not in used:
            out.append(d.text)
            used[d.task] = used.get(d.task, 0) + n
    return out


def train_tokenizer(texts: Iterable[str], *, vocab_size: int, out_dir: str | Path | None = None,
                    model_max_length: int = 1024):
    """Train a byte-level BPE on texts -> transformers.PreTrainedTokenizerFast (saved to out_dir if given)."""
    _single_thread_tokenizers()
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    if not 300 <= vocab_size <= 65_536:
        raise ConfigError(f"vocab_size {vocab_size} is out of range; expected 300..65536 (256 bytes + specials + merges).")
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=list(SPECIALS), min_frequency=2,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(texts, trainer=trainer)
    bos_id = tok.token_to_id(BOS)
    tok.post_processor = processors.TemplateProcessing(single=f"{BOS} $A", pair=f"{BOS} $A {BOS} $B",
                                                       special_tokens=[(BOS, bos_id)])
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token=BOS, eos_token=EOS, pad_token=PAD,
                                   model_max_length=model_max_length, clean_up_tokenization_spaces=False)
    if out_dir is not None:
        save_tokenizer(fast, out_dir)
    return fast


def save_tokenizer(tokenizer, out_dir: str | Path) -> None:
    """Write tokenizer.json, tokenizer_config.json and special_tokens_map.json to out_dir."""
    Path(out_dir).mkdir(parents=True, exist_ok=True)
    tokenizer.save_pretrained(str(out_dir))


def load_tokenizer(model_dir: str | Path):
    """AutoTokenizer.from_pretrained(model_dir) offline, with a clear error when files are missing."""
    _single_thread_tokenizers()
    from transformers import AutoTokenizer

    if not (Path(model_dir) / "tokenizer.json").is_file():
        raise ConfigError(f"{Path(model_dir) / 'tokenizer.json'} not found; expected a tokenizer saved by train_builtin.")
    return AutoTokenizer.from_pretrained(str(model_dir), local_files_only=True)
