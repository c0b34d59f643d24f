"""An SFT data path (ignored labels) for the tiny native backend, through torchtitan's own
chat dataset (identical in 0.3.0 and spring 2026) (``ChatDataLoader``: the chat template, prompt
labels set to IGNORE_INDEX, greedy packing with EOS padding whose labels are IGNORE_INDEX,
per-document positions).

The conversations come from the fixture corpus: each record's first sentence is the user turn,
the next two sentences the assistant's (``corpus_to_chat``). Config functions mirror
harness.backends.titan_native's (``tiny``, ``tiny_flex``); ``tiny_sft`` is ``tiny``.

Launch (the harness: ``harness.launch.instrumented`` with HARNESS_INSTRUMENT_TARGET set to this
module; or directly, with the CPU shims):
    torchrun ... -m torchtitan.train --module harness.backends.sft_config --config tiny_sft
"""

from __future__ import annotations

import re

from torchtitan.hf_datasets.text_datasets import ChatDataLoader
from torchtitan.trainer import Trainer

from harness.backends import titan_native
from harness.registry import paths

CORPUS_FILE = paths.CORPUS / "train.jsonl"
_SENTENCE = re.compile(r"(?<=[.!?])\s+")


def corpus_to_chat(sample: dict) -> list[dict[str, str]]:
    sentences = _SENTENCE.split(sample["text"].strip())
    return [
        {"role": "user", "content": sentences[0]},
        {"role": "assistant", "content": " ".join(sentences[1:3]) or sentences[0]},
    ]


def sft_dataloader() -> ChatDataLoader.Config:
    return ChatDataLoader.Config(
        dataset_path="json",
        load_dataset_kwargs={"data_files": str(CORPUS_FILE), "split": "train"},
        sample_processor=corpus_to_chat,
    )


def _with_sft(config: Trainer.Config) -> Trainer.Config:
    config.dataloader = sft_dataloader()
    return config


def tiny() -> Trainer.Config:
    return _with_sft(titan_native.tiny())


def tiny_flex() -> Trainer.Config:
    return _with_sft(titan_native.tiny_flex())


def tiny_sft() -> Trainer.Config:
    return tiny()
