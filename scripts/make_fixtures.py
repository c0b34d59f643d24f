#!/usr/bin/env python3
"""Regenerate the self-made test fixtures under ``fixtures/`` (nothing comes from the Hub).

    python scripts/make_fixtures.py                        # rewrite every fixture
    python scripts/make_fixtures.py --only tokenizer,corpus  # skip the slow checkpoint training
    python scripts/make_fixtures.py --check                # regenerate into a temp dir, compare bytes

Everything is seeded and single-threaded so the output is bit-identical from run to run on the
pinned stack (torch / transformers / tokenizers versions are recorded in each fixture_card.json).
"""

from __future__ import annotations

import os

# Must be set before tokenizers/torch are imported: the BPE trainer's merge order and CPU
# kernels' reduction order depend on the thread pool, and nothing here may touch the network.
os.environ.update(RAYON_NUM_THREADS="1", OMP_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false",
                  HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", TRANSFORMERS_VERBOSITY="error")

import argparse
import filecmp
import gzip
import io
import json
import math
import random
import shutil
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
FIXTURES = REPO / "fixtures"
ALL_PARTS = ("corpus", "c4", "tokenizer", "tiny_dense", "tiny_moe", "recorded")
MODEL_PARTS = ("tiny_dense", "tiny_moe")
REGENERATE_CMD = "python scripts/make_fixtures.py"

# ---------------------------------------------------------------------------------------------
# corpus: a seeded pseudo-random grammar
# ---------------------------------------------------------------------------------------------
CORPUS_SEED = 20250101
N_DOCS = 3600
# The first HELD_OUT docs of each contiguous quarter are never used for fixture training:
# torchtitan gives dp rank r of W the contiguous shard starting at doc r*N/W, so runs with
# dp <= 4 (and a few dozen steps) start on text the checkpoints have not seen.
HELD_OUT = 150

NOUNS = ("apple box lamp chair bottle kettle basket ribbon candle drum whistle lantern blanket "
         "hammer ladder bucket mirror pillow shovel bell kite cart boat coin map key book cup "
         "plate spoon stone feather shell rope wheel").split()
ADJECTIVES = ("red blue green yellow small large heavy light old new bright dark warm cold "
              "broken shiny quiet loud round square wooden golden").split()
PLACES = ("river garden market bridge forest harbor library bakery tower meadow station "
          "orchard workshop chapel square mill").split()
VERBS_PAST = ("found carried painted sold bought fixed hid lost cleaned opened gave dropped "
              "borrowed wrapped polished").split()
DAYS = "Monday Tuesday Wednesday Thursday Friday Saturday Sunday".split()
NUMBER_WORDS = ("one two three four five six seven eight nine ten eleven twelve thirteen "
                "fourteen fifteen sixteen seventeen eighteen nineteen twenty").split()
ONSETS = "b br c d dr f g gr h j k kl l m n p pr r s st t tr v w z".split()
VOWELS = "a e i o u ai ea ou".split()
CODAS = ["", "", "", "n", "r", "l", "s", "th", "m", "nd", "x"]
TOWN_SUFFIXES = "ford vale wick ton bury moor haven field".split()


def plural(noun: str) -> str:
    """English plural for the small noun list (enough rules to give the model real agreement)."""
    return noun + ("es" if noun.endswith(("x", "sh", "ch", "s")) else "s")


def make_names(rng: random.Random, count: int, syllables: tuple[int, int]) -> list[str]:
    """Pseudo-words built from syllables: they give the BPE trainer enough distinct
    character sequences to learn 2048 tokens, and give the model names to copy in context."""
    names: set[str] = set()
    while len(names) < count:
        word = "".join(rng.choice(ONSETS) + rng.choice(VOWELS) + rng.choice(CODAS)
                       for _ in range(rng.randint(*syllables)))
        names.add(word.capitalize())
    return sorted(names)


def story(rng: random.Random, names: list[str], towns: list[str]) -> str:
    """A short narrative: a character, pronoun agreement, and objects that are mentioned again."""
    hero, friend = rng.sample(names, 2)
    pron, poss = rng.choice([("he", "his"), ("she", "her"), ("they", "their")])
    town = rng.choice(towns)
    place = rng.choice(PLACES)
    walks = "walk" if pron == "they" else "walks"
    out = [f"{hero} lived in {town}. Every morning, {pron} {walks} to the {place}."]
    for _ in range(rng.randint(3, 9)):
        adj, noun = rng.choice(ADJECTIVES), rng.choice(NOUNS)
        verb = rng.choice(VERBS_PAST)
        where = rng.choice(PLACES)
        day = rng.choice(DAYS)
        out.append(rng.choice([
            f"On {day}, {hero} {verb} a {adj} {noun} near the {where}.",
            f"{friend} asked {hero} about the {adj} {noun}. \"It is mine,\" said {hero}.",
            f"The {noun} was {adj}, so {pron} {verb} it with {friend}.",
            f"After that, {hero} put {poss} {noun} in the {where}.",
            f"\"Where is the {adj} {noun}?\" asked {friend}. \"In the {where},\" said {hero}.",
        ]))
    out.append(f"In the evening, {hero} went back to {town}.")
    return " ".join(out)


def ledger(rng: random.Random, names: list[str], towns: list[str]) -> str:
    """Numbers with singular/plural agreement, and a price that is count x unit price."""
    town = rng.choice(towns)
    lines = [f"Market ledger of {town}."]
    for day in rng.sample(DAYS, rng.randint(3, 7)):
        name, noun = rng.choice(names), rng.choice(NOUNS)
        n = rng.randint(1, 60)
        things = noun if n == 1 else plural(noun)
        price = rng.randint(1, 9)
        lines.append(f"{day}: {name} bought {n} {rng.choice(ADJECTIVES)} {things} for "
                     f"{n * price} coins, {price} coins each.")
    return "\n".join(lines)


def facts_quiz(rng: random.Random, names: list[str], towns: list[str]) -> str:
    """In-context retrieval: facts first, then questions whose answers are copied from them."""
    people = rng.sample(names, rng.randint(3, 6))
    facts = {p: (rng.choice(ADJECTIVES), rng.choice(NOUNS), rng.choice(towns)) for p in people}
    lines = [f"{p} has a {a} {n} and lives in {t}." for p, (a, n, t) in facts.items()]
    for p in rng.sample(people, len(people)):
        a, n, t = facts[p]
        lines.append(rng.choice([f"Question: What does {p} have? Answer: a {a} {n}.",
                                 f"Question: Where does {p} live? Answer: in {t}."]))
    return "\n".join(lines)


def counting(rng: random.Random, names: list[str], towns: list[str]) -> str:
    """Ordered sequences (number words, weekdays): trivially predictable continuations."""
    start = rng.randint(0, 10)
    count = " ".join(NUMBER_WORDS[start:start + rng.randint(5, 10)])
    first = rng.randint(0, 6)
    week = ", ".join(DAYS[(first + i) % 7] for i in range(rng.randint(3, 7)))
    return f"{rng.choice(names)} counted: {count}. Then {rng.choice(names)} listed the days: {week}."


def corpus_world(rng: random.Random) -> tuple[list[str], list[str]]:
    """The names and towns every document draws from."""
    names = make_names(rng, 900, (2, 3))
    towns = sorted({n + rng.choice(TOWN_SUFFIXES).lower() for n in make_names(rng, 150, (1, 2))})
    return names, towns


def make_docs(rng: random.Random, names: list[str], towns: list[str], count: int) -> list[str]:
    kinds = [story, story, ledger, facts_quiz, counting]
    docs = []
    for _ in range(count):
        paragraphs = [rng.choice(kinds)(rng, names, towns) for _ in range(rng.randint(1, 3))]
        docs.append("\n\n".join(paragraphs))
    return docs


def make_corpus(out_dir: Path) -> None:
    """Write ``train.jsonl`` (one ``{"text": ...}`` per line), the layout ``load_dataset(dir)``
    and torchtitan's ``c4_test`` loader read."""
    rng = random.Random(CORPUS_SEED)
    names, towns = corpus_world(rng)
    docs = make_docs(rng, names, towns, N_DOCS)
    out_dir.mkdir(parents=True, exist_ok=True)
    with open(out_dir / "train.jsonl", "w", encoding="utf-8", newline="\n") as f:
        f.writelines(json.dumps({"text": d}, ensure_ascii=False) + "\n" for d in docs)


# ---------------------------------------------------------------------------------------------
# c4: documents of the same world in allenai/c4's own layout (harness/backends/c4.py), for 2 ranks
# ---------------------------------------------------------------------------------------------
C4_SEED = 20261202
C4_DOCS_PER_SHARD = 120
C4_RANKS = 2
C4_README = """---
pretty_name: C4 (synthetic stand-in)
configs:
- config_name: en
  data_files:
  - split: train
    path: en/c4-train.*.json.gz
  - split: validation
    path: en/c4-validation.*.json.gz
---
# A synthetic stand-in for allenai/c4

allenai/c4's layout and its README's `en` config (train and validation data files), with
documents of this project's synthetic corpus world (scripts/make_fixtures.py --only c4): what
`load_dataset(<dir>, name="en", split="train", streaming=True)` reads, as torchtitan's `c4`
dataset does. Two train shards: rank r of 2 reads shard r, as rank r of 64 reads shard r of the
Hub's 1024 (harness/backends/c4.py).
"""


def write_gzip_jsonl(path: Path, records: list[dict]) -> None:
    """Gzip with no name and mtime 0, so the bytes depend on the records only."""
    buffer = io.BytesIO()
    with gzip.GzipFile(filename="", mode="wb", fileobj=buffer, mtime=0, compresslevel=9) as f:
        f.write("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records).encode())
    path.write_bytes(buffer.getvalue())


def make_c4(out_dir: Path) -> None:
    sys.path.insert(0, str(REPO))
    from harness.backends import c4  # noqa: PLC0415  order: after sys.path holds this tree

    names, towns = corpus_world(random.Random(CORPUS_SEED))
    rng = random.Random(C4_SEED)
    (out_dir / c4.CONFIG).mkdir(parents=True, exist_ok=True)
    (out_dir / c4.README).write_text(C4_README, encoding="utf-8")
    shards = [c4.validation_shard(), *(c4.train_shard(i) for i in range(C4_RANKS))]
    assert sorted([c4.README, *shards]) == sorted(c4.files_for(C4_RANKS))
    for shard in shards:
        docs = make_docs(rng, names, towns, C4_DOCS_PER_SHARD)
        write_gzip_jsonl(out_dir / shard, [
            {"text": doc, "timestamp": f"2019-04-{1 + i % 28:02d}T12:00:00Z",
             "url": f"https://{towns[i % len(towns)].lower()}.example/{shard.split('/')[1][:-8]}/{i}"}
            for i, doc in enumerate(docs)])


def read_corpus(corpus_dir: Path) -> list[str]:
    with open(corpus_dir / "train.jsonl", encoding="utf-8") as f:
        return [json.loads(line)["text"] for line in f]


# ---------------------------------------------------------------------------------------------
# tokenizer: byte-level BPE, Qwen2/3 layout (no BOS, EOS = <|endoftext|>)
# ---------------------------------------------------------------------------------------------
VOCAB_SIZE = 2048
EOS = "<|endoftext|>"
SPECIAL_TOKENS = [EOS, "<|im_start|>", "<|im_end|>"]  # ids 0, 1, 2
# Qwen2/Qwen3's pre-tokenizer split pattern (digits are split one by one).
QWEN_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+"
              r"[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
CHAT_TEMPLATE = ("{%- for message in messages %}{{- '<|im_start|>' + message['role'] + '\\n' + "
                 "message['content'] + '<|im_end|>' + '\\n' }}{%- endfor %}"
                 "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}")
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")


def tokenizer_config() -> dict:
    """Like Qwen3-Base's tokenizer_config.json: ``bos_token`` null, EOS = pad = <|endoftext|>,
    no add_bos/add_eos keys. torchtitan's HuggingFaceTokenizer then has bos_id None (never adds
    a BOS) and appends EOS only where the caller asks (the text dataset does, per document)."""
    added = {str(i): {"content": t, "lstrip": False, "normalized": False, "rstrip": False,
                      "single_word": False, "special": True}
             for i, t in enumerate(SPECIAL_TOKENS)}
    return {"add_prefix_space": False, "added_tokens_decoder": added,
            "additional_special_tokens": SPECIAL_TOKENS[1:], "bos_token": None,
            "chat_template": CHAT_TEMPLATE, "clean_up_tokenization_spaces": False,
            "eos_token": EOS, "errors": "replace", "model_max_length": 1024, "pad_token": EOS,
            "split_special_tokens": False, "tokenizer_class": "Qwen2Tokenizer",
            "unk_token": None}


def make_tokenizer(corpus_dir: Path, out_dir: Path) -> None:
    """Train a 2048-token byte-level BPE on the corpus (single-threaded: deterministic)."""
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers  # noqa: PLC0415  heavy: the corpus and tokenizer parts run without it

    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN_SPLIT), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(vocab_size=VOCAB_SIZE, special_tokens=SPECIAL_TOKENS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train_from_iterator(read_corpus(corpus_dir), trainer)
    if tok.get_vocab_size() != VOCAB_SIZE:
        raise RuntimeError(f"BPE stopped at {tok.get_vocab_size()} tokens, need {VOCAB_SIZE}: "
                           "the corpus has too little lexical variety")
    out_dir.mkdir(parents=True, exist_ok=True)
    tok.save(str(out_dir / "tokenizer.json"))
    write_json(out_dir / "tokenizer_config.json", tokenizer_config())


# ---------------------------------------------------------------------------------------------
# tiny "pretrained" checkpoints
# ---------------------------------------------------------------------------------------------
# Every dimension real Qwen3 keeps distinct is distinct here too, so a defect that confuses
# two of them cannot hide: head_dim 48 != hidden/heads 32 (Qwen3-4B: 128 vs 80), kv heads !=
# heads, intermediate != hidden, moe_intermediate != head_dim; the MoE's own (below).
COMMON_CONFIG = dict(vocab_size=VOCAB_SIZE, hidden_size=128, num_hidden_layers=2,
                     num_attention_heads=4, num_key_value_heads=2, head_dim=48,
                     intermediate_size=384, rope_theta=1_000_000.0, rms_norm_eps=1e-6,
                     max_position_embeddings=1024, bos_token_id=0, eos_token_id=0)
MODELS = {
    "tiny_dense": ("Qwen3ForCausalLM", dict(tie_word_embeddings=True)),
    # As wide as real MoE (Qwen3-30B-A3B: 128 experts, top-8; the source's cut: 64, top-4):
    # 32 experts, top-4, and every MoE dimension apart from the others: experts 32 vs
    # hidden/heads 16 vs head_dim 48 vs moe_intermediate 64 vs hidden 128, top_k 4 vs heads 8
    # vs kv heads 2. Eight heads (not four) keep top_k off the head count; the dense
    # intermediate (unused by an all-sparse model, but in config.json) moves off the query
    # width heads*head_dim = 384.
    "tiny_moe": ("Qwen3MoeForCausalLM", dict(
        num_attention_heads=8, intermediate_size=320,
        num_experts=32, num_experts_per_tok=4, moe_intermediate_size=64, norm_topk_prob=True,
        decoder_sparse_step=1, mlp_only_layers=[], tie_word_embeddings=False,
        output_router_logits=False)),
}
TRAIN = dict(seed=1234, steps=600, batch_size=8, seq_tokens=257, lr=3e-3, warmup_steps=40,
             min_lr_ratio=0.1, weight_decay=0.01, betas=(0.9, 0.95))
RECORDED = "recorded_losses.json"  # per torchtitan API generation: {generation: {masking: {shape: loss}}}
RECORD_SHAPES = {"dp1_lbs2_seq256": (1, 2, 256), "dp2_lbs2_seq256": (2, 2, 256)}
# The full-size runs' shape on the assets twin (2 ranks, local batch 1, seq 256: harness/
# launch/run_matrix.py TWIN_OVERRIDES), reading fixtures/c4 as torchtitan's "c4" dataset: the twin's
# stand-ins for the source's published numbers (fixtures/expectations.toml [[published]]).
C4_RECORD_SHAPES = {"c4_dp2_lbs1_seq256": (2, 1, 256)}
C4_RECORDED_MODELS = ("tiny_dense",)  # the twin's weights (harness/registry/assets_twin.py)
RECORD_NOTES = (
    "Step-1 global_avg_loss torchtitan should log when starting from this checkpoint (before any "
    "update): sum over dp ranks of (rank's summed token CE / global valid tokens). One section "
    "per torchtitan API generation (harness/upstream/titan_api): its HuggingFaceTextDataLoader "
    "(dataset='c4_test', dataset_path=fixtures/corpus, HuggingFaceTokenizer(fixtures/tokenizer)) "
    "decides the batches (0.3.0 shifts labels within each document, spring-2026 main across the "
    "packed row). Shape keys are dp<world size>_lbs<local batch>_seq<seq_len>; rank r reads shard "
    "r of the docs. Masking: 'document' confines attention to each packed document, RoPE at "
    "per-document positions (native qwen3 flex/varlen; transformers backend with "
    "attn_mask_type='block_causal'); 'causal' is causal attention across the packed row with "
    "per-document positions (transformers backend default attn_mask_type='causal' on 0.3.0); "
    "'row_causal' is causal attention over the row with row positions 0..seq-1, the row read as "
    "one sequence (native qwen3 attn_backend='sdpa'). Computed with the HF model in float32, not "
    "with torchtitan's trainer. Regenerate in each generation's environment: "
    "python scripts/make_fixtures.py --only recorded")


def build_model(name: str):
    """A freshly initialised float32 model; call after seeding torch."""
    import torch  # noqa: PLC0415  heavy: the corpus and tokenizer parts run without it
    import transformers  # noqa: PLC0415  heavy: the corpus and tokenizer parts run without it

    cls_name, extra = MODELS[name]
    cls = getattr(transformers, cls_name)
    config = cls.config_class(**{**COMMON_CONFIG, **extra}, dtype="float32")
    # The MoE uses transformers' default experts kernel (grouped_mm), which runs on CPU in fp32.
    return cls(config).to(torch.float32)


def pretraining_sequences(corpus_dir: Path, tokenizer_dir: Path):
    """Tokenize the non-held-out docs as torchtitan does (text + EOS, no BOS), concatenate and
    cut into ``seq_tokens``-long rows (model input and its shifted labels come from one row)."""
    import torch  # noqa: PLC0415  heavy: the corpus and tokenizer parts run without it
    from tokenizers import Tokenizer  # noqa: PLC0415  heavy: the corpus and tokenizer parts run without it

    tok = Tokenizer.from_file(str(tokenizer_dir / "tokenizer.json"))
    eos_id = tok.token_to_id(EOS)
    docs = read_corpus(corpus_dir)
    quarter = len(docs) // 4
    held_out = {q * quarter + i for q in range(4) for i in range(HELD_OUT)}
    stream: list[int] = []
    for i, enc in enumerate(tok.encode_batch(docs)):
        if i not in held_out:
            stream.extend(enc.ids + [eos_id])
    n = TRAIN["seq_tokens"]
    return torch.tensor(stream[: len(stream) // n * n]).view(-1, n)


def lr_factor(step: int) -> float:
    """Linear warmup, then cosine decay to ``min_lr_ratio`` of the peak."""
    if step < TRAIN["warmup_steps"]:
        return (step + 1) / TRAIN["warmup_steps"]
    t = (step - TRAIN["warmup_steps"]) / max(1, TRAIN["steps"] - TRAIN["warmup_steps"])
    return TRAIN["min_lr_ratio"] + (1 - TRAIN["min_lr_ratio"]) * 0.5 * (1 + math.cos(math.pi * t))


def pretrain(name: str, rows):
    """Plain AdamW training, seeded and deterministic; returns the model and per-step losses."""
    import torch  # noqa: PLC0415  heavy: the corpus and tokenizer parts run without it

    torch.manual_seed(TRAIN["seed"])
    model = build_model(name).train()
    opt = torch.optim.AdamW(model.parameters(), lr=TRAIN["lr"], betas=TRAIN["betas"],
                            weight_decay=TRAIN["weight_decay"])
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lr_factor)
    gen = torch.Generator().manual_seed(TRAIN["seed"])
    order = torch.empty(0, dtype=torch.long)
    losses = []
    for step in range(TRAIN["steps"]):
        if len(order) < TRAIN["batch_size"]:  # new epoch, new seeded shuffle
            order = torch.cat([order, torch.randperm(len(rows), generator=gen)])
        batch, order = rows[order[: TRAIN["batch_size"]]], order[TRAIN["batch_size"]:]
        loss = model(input_ids=batch, labels=batch, use_cache=False).loss
        loss.backward()
        opt.step()
        sched.step()
        opt.zero_grad(set_to_none=True)
        losses.append(loss.item())
        if step % 100 == 0 or step == TRAIN["steps"] - 1:
            print(f"  [{name}] step {step:4d} loss {loss.item():.4f}", flush=True)
    return model.eval(), losses


def first_global_batch(corpus_dir: Path, tokenizer_dir: Path, dp: int, lbs: int, seq_len: int,
                       dataset: str = "c4_test"):
    """The batch each dp rank gets first, from torchtitan's own tokenizer and dataloader as its
    trainer builds them (harness.parity.models ``dataloader_batches``; "c4" reads
    ``corpus_dir`` as a local C4 copy)."""
    from harness.parity.models import dataloader_batches  # noqa: PLC0415  heavy: the corpus and tokenizer parts run without it

    return dataloader_batches(tokenizer_dir, 1, dp, lbs, seq_len, dataset, corpus_dir)[0]


def record_first_step_losses(model, corpus_dir: Path, tokenizer_dir: Path,
                             c4_dir: Path | None = None) -> dict:
    """``{"document": {shape_key: loss}, "causal": {...}, "row_causal": {...}}`` for every
    RECORD_SHAPES (the masking names of harness/backends BackendSpec.attention), and with
    ``c4_dir`` every C4_RECORD_SHAPES read from it as torchtitan's "c4" dataset."""
    import torch  # noqa: PLC0415  heavy: the corpus and tokenizer parts run without it

    from harness.checks.reference_forward import MASKINGS, first_step_loss  # noqa: PLC0415  heavy: the corpus and tokenizer parts run without it

    recorded: dict[str, dict[str, float]] = {mask: {} for mask in MASKINGS}
    shapes = [(key, shape, corpus_dir, "c4_test") for key, shape in RECORD_SHAPES.items()]
    if c4_dir is not None:
        shapes += [(key, shape, c4_dir, "c4") for key, shape in C4_RECORD_SHAPES.items()]
    for key, (dp, lbs, seq_len), data_dir, dataset in shapes:
        batches = first_global_batch(data_dir, tokenizer_dir, dp, lbs, seq_len, dataset)
        for mask in MASKINGS:  # torchtitan's logged loss: the trainer's float32 arithmetic
            recorded[mask][key] = first_step_loss(model, batches, mask, dtype=torch.float32)
    return recorded


def fixture_card(name: str, model, losses: list[float]) -> dict:
    """What the harness asserts against, plus enough provenance to tell why it might change."""
    import tokenizers  # noqa: PLC0415  heavy: the corpus and tokenizer parts run without it
    import torch  # noqa: PLC0415  heavy: the corpus and tokenizer parts run without it
    import transformers  # noqa: PLC0415  heavy: the corpus and tokenizer parts run without it

    summary_keys = [k for k in dict.fromkeys((*COMMON_CONFIG, *MODELS[name][1])) if k != "rope_theta"]
    summary_keys.append("rope_parameters")  # where transformers 5 keeps rope_theta
    card = {
        "model_class": MODELS[name][0],
        "config_summary": {k: getattr(model.config, k) for k in summary_keys},
        "num_parameters": sum(p.numel() for p in model.parameters()),
        "hf_attn_implementation": model.config._attn_implementation,
    }
    if name == "tiny_moe":
        card["hf_experts_implementation"] = model.config._experts_implementation
    return card | {
        "training": {**TRAIN, "optimizer": "torch.optim.AdamW", "dtype": "float32",
                     "data": f"fixtures/corpus minus the first {HELD_OUT} docs of each quarter",
                     "first_train_loss": losses[0], "final_train_loss": losses[-1],
                     "final_train_loss_mean_last_20": sum(losses[-20:]) / 20},
        "versions": {"torch": torch.__version__.split("+")[0],
                     "transformers": transformers.__version__,
                     "tokenizers": tokenizers.__version__},
        "regenerate": f"{REGENERATE_CMD} --only {name}  (reads fixtures/corpus, fixtures/tokenizer)",
    }


def make_model_fixture(name: str, corpus_dir: Path, tokenizer_dir: Path, out_dir: Path) -> None:
    """Train, save as an HF snapshot (weights, config, tokenizer files) and write the card."""
    import torch  # noqa: PLC0415  heavy: the corpus and tokenizer parts run without it
    import transformers  # noqa: PLC0415  heavy: the corpus and tokenizer parts run without it

    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    start = time.perf_counter()
    model, losses = pretrain(name, pretraining_sequences(corpus_dir, tokenizer_dir))
    print(f"  [{name}] trained in {time.perf_counter() - start:.0f}s", flush=True)
    out_dir.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out_dir, safe_serialization=True)
    for f in TOKENIZER_FILES:
        shutil.copyfile(tokenizer_dir / f, out_dir / f)
    saved = getattr(transformers, MODELS[name][0]).from_pretrained(out_dir).eval()
    write_json(out_dir / "fixture_card.json", fixture_card(name, saved, losses))


def record_losses(name: str, corpus_dir: Path, tokenizer_dir: Path, model_dir: Path,
                  previous: Path, out: Path, c4_dir: Path) -> None:
    """The recorded first-step losses of the saved model, for the installed torchtitan API
    generation (its dataloader decides the batches), into ``out`` (recorded_losses.json);
    the other generations' sections are kept from ``previous``. Run it in each generation's
    environment (CI checks each section in its own)."""
    import transformers  # noqa: PLC0415  heavy: the corpus and tokenizer parts run without it

    from harness.upstream.titan_api import generation  # noqa: PLC0415  heavy: the corpus and tokenizer parts run without it

    # Recorded with the model as saved and reloaded, i.e. exactly what a run will load.
    saved = getattr(transformers, MODELS[name][0]).from_pretrained(model_dir).eval()
    data = json.loads(previous.read_text()) if previous.is_file() else {"notes": RECORD_NOTES}
    data["notes"] = RECORD_NOTES
    data[generation()] = record_first_step_losses(
        saved, corpus_dir, tokenizer_dir, c4_dir if name in C4_RECORDED_MODELS else None)
    write_json(out, data)
    print(f"  [{name}] recorded for {generation()}: {json.dumps(data[generation()])}", flush=True)


# ---------------------------------------------------------------------------------------------
# driver
# ---------------------------------------------------------------------------------------------
def write_json(path: Path, obj) -> None:
    path.write_text(json.dumps(obj, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


def generate(root: Path, parts: list[str], inputs: Path) -> None:
    """Generate ``parts`` under ``root``. Parts not regenerated are read from ``inputs``
    (so ``--only tiny_dense`` trains against the committed corpus and tokenizer)."""
    import datasets  # noqa: PLC0415  heavy: the corpus and tokenizer parts run without it
    import transformers  # noqa: PLC0415  heavy: the corpus and tokenizer parts run without it

    transformers.utils.logging.disable_progress_bar()
    datasets.disable_progress_bars()
    corpus = (root if "corpus" in parts else inputs) / "corpus"
    c4_dir = (root if "c4" in parts else inputs) / "c4"
    tokenizer = (root if "tokenizer" in parts else inputs) / "tokenizer"
    if set(parts) & set(MODEL_PARTS) and "recorded" not in parts:
        parts = [*parts, "recorded"]  # new weights, new recorded losses

    def record():
        for name in MODEL_PARTS:
            retrained = name in parts
            model_dir = (root if retrained else inputs) / name
            (root / name).mkdir(parents=True, exist_ok=True)
            # Weights that changed make every generation's old section stale: only this one is
            # kept. Weights retrained bit-identically (--check) keep every section.
            changed = retrained and not filecmp.cmp(model_dir / "model.safetensors",
                                                    inputs / name / "model.safetensors", shallow=False)
            previous = Path("/nonexistent") if changed else inputs / name / RECORDED
            record_losses(name, corpus, tokenizer, model_dir, previous, root / name / RECORDED, c4_dir)

    steps = {
        "corpus": lambda: make_corpus(root / "corpus"),
        "c4": lambda: make_c4(root / "c4"),
        "tokenizer": lambda: make_tokenizer(corpus, root / "tokenizer"),
        "tiny_dense": lambda: make_model_fixture("tiny_dense", corpus, tokenizer, root / "tiny_dense"),
        "tiny_moe": lambda: make_model_fixture("tiny_moe", corpus, tokenizer, root / "tiny_moe"),
        "recorded": record,
    }
    for part in ALL_PARTS:
        if part in parts:
            start = time.perf_counter()
            print(f"{part}: generating", flush=True)
            if part != "recorded":
                shutil.rmtree(root / part, ignore_errors=True)
            steps[part]()
            print(f"{part}: done in {time.perf_counter() - start:.1f}s", flush=True)


def compare(generated: Path, committed: Path, parts: list[str]) -> list[str]:
    """Relative paths that differ (or exist on one side only) between the two trees."""
    bad = []
    for part in parts:
        if part == "recorded":
            files = {Path(name) / RECORDED for name in MODEL_PARTS}
        else:  # a model's recorded losses belong to the "recorded" part
            files = {p.relative_to(generated) for p in (generated / part).rglob("*") if p.is_file()}
            files |= {p.relative_to(committed) for p in (committed / part).rglob("*") if p.is_file()}
            files = {f for f in files if f.name != RECORDED}
        for rel in sorted(files):
            a, b = generated / rel, committed / rel
            if not (a.is_file() and b.is_file() and filecmp.cmp(a, b, shallow=False)):
                bad.append(str(Path("fixtures") / rel))
    return bad


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true",
                        help="regenerate into a temp dir and compare bytes with fixtures/")
    parser.add_argument("--only", default=",".join(ALL_PARTS),
                        help=f"comma-separated subset of {','.join(ALL_PARTS)}")
    args = parser.parse_args()
    parts = [p for p in args.only.split(",") if p]
    if unknown := set(parts) - set(ALL_PARTS):
        parser.error(f"unknown parts: {sorted(unknown)}")
    if not args.check:
        generate(FIXTURES, parts, FIXTURES)
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        generate(Path(tmp), parts, FIXTURES)
        bad = compare(Path(tmp), FIXTURES, parts)
    for rel in bad:
        print(f"DIFFERS: {rel}", file=sys.stderr)
    print("check: " + ("FAILED" if bad else f"OK ({', '.join(parts)} byte-identical)"))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
