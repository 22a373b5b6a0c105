"""Build the tiny Llama model and word-level tokenizer that the real-vLLM tests and demo serve.

Run with the vLLM environment's Python (it has transformers and tokenizers), never imported by
the control plane:

    .venv-vllm/bin/python controlplane/realvllm/model.py var/realvllm/tiny-llama

Random weights (seeded), 2 layers of width 128, a vocabulary of 2048 words ``<pad> <s> </s> <unk>
w4 ... w2047`` split on whitespace, 4096 positions: about 1.6 MB, a few seconds, nothing
downloaded. The folder appears complete or not at all (built beside it, then renamed), and a
folder whose ``prewarm-model.json`` names this recipe is kept as it is.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

RECIPE = {
    "recipe": 1,
    "hidden_size": 128,
    "intermediate_size": 256,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "vocab_size": 2048,
    "max_position_embeddings": 4096,
}
SPECIAL = ["<pad>", "<s>", "</s>", "<unk>"]
MARKER = "prewarm-model.json"


def is_built(out: Path) -> bool:
    try:
        return json.loads((out / MARKER).read_text()) == RECIPE
    except (OSError, ValueError):
        return False


def build(out: Path) -> Path:
    if is_built(out):
        return out
    import torch
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=out.name + ".", dir=out.parent))
    try:
        torch.manual_seed(0)
        params = {k: v for k, v in RECIPE.items() if k != "recipe"}
        config = LlamaConfig(
            **params, pad_token_id=0, bos_token_id=1, eos_token_id=2, tie_word_embeddings=False
        )
        LlamaForCausalLM(config).save_pretrained(tmp)
        vocab = {w: i for i, w in enumerate(SPECIAL)}
        vocab.update({f"w{i}": i for i in range(len(SPECIAL), RECIPE["vocab_size"])})
        words = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
        words.pre_tokenizer = pre_tokenizers.Whitespace()
        PreTrainedTokenizerFast(
            tokenizer_object=words,
            pad_token="<pad>",
            bos_token="<s>",
            eos_token="</s>",
            unk_token="<unk>",
        ).save_pretrained(tmp)
        (tmp / MARKER).write_text(json.dumps(RECIPE))
        if out.exists():  # an older recipe, or a half-built folder of an interrupted run
            shutil.rmtree(out)
        tmp.chmod(0o755)
        os.replace(tmp, out)
    except OSError:
        if is_built(out):  # another process finished first
            return out
        raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: model.py OUT_DIR")
    print(build(Path(sys.argv[1])))
