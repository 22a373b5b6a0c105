"""Build the random-weight Llama models and the word-level tokenizer that the real-vLLM tests,
demo and benches serve.

Run with the vLLM environment's Python (it has transformers and tokenizers); the control plane
reads only ``RECIPES`` (plain data, no imports):

    .venv-vllm/bin/python harness/realvllm/model.py var/realvllm/tiny-llama [tiny|heavy]

Two recipes, both random weights (seeded), a vocabulary of 2048 words ``<pad> <s> </s> <unk>
w4 ... w2047`` split on whitespace and 4096 positions, nothing downloaded:

  tiny   2 layers of width 128 (about 1.6 MB, a few seconds): a prefill costs next to nothing,
         for tests of the mechanism
  heavy  16 layers of width 1024 (about 197M parameters, ~400 MB in bfloat16): prefilling a
         shared prefix of 1-2k tokens costs many times a cached request's own few tokens, as a
         large model's long prefix does on a GPU. Sized by what the A/B measured from the taps'
         records (first run, medians): a hit's fixed costs (HTTP, three processes, a step
         through every layer) set its time, so 8 layers of width 512 gave a miss 5.1x a hit and
         16 of width 768 7.2x (load average 39-53, the engines' scheduling groups at nice
         -10), under the 10x the A/B needs

The folder appears complete or not at all (built beside it, then renamed), and a folder whose
``prewarm-model.json`` names the same recipe is kept as it is.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

RECIPES = {
    "tiny": {
        "recipe": 1,
        "hidden_size": 128,
        "intermediate_size": 256,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "vocab_size": 2048,
        "max_position_embeddings": 4096,
    },
    "heavy": {
        "recipe": 3,
        "hidden_size": 1024,
        "intermediate_size": 3072,
        "num_hidden_layers": 16,
        "num_attention_heads": 16,
        "num_key_value_heads": 4,
        "vocab_size": 2048,
        "max_position_embeddings": 4096,
    },
}
SPECIAL = ["<pad>", "<s>", "</s>", "<unk>"]
MARKER = "prewarm-model.json"


def is_built(out: Path, recipe: dict) -> bool:
    try:
        return json.loads((out / MARKER).read_text()) == recipe
    except (OSError, ValueError):
        return False


def build(out: Path, name: str = "tiny") -> Path:
    recipe = RECIPES[name]
    if is_built(out, recipe):
        return out
    import torch
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=out.name + ".", dir=out.parent))
    try:
        torch.manual_seed(0)
        params = {k: v for k, v in recipe.items() if k != "recipe"}
        config = LlamaConfig(
            **params, pad_token_id=0, bos_token_id=1, eos_token_id=2, tie_word_embeddings=False
        )
        LlamaForCausalLM(config).save_pretrained(tmp)
        vocab = {w: i for i, w in enumerate(SPECIAL)}
        vocab.update({f"w{i}": i for i in range(len(SPECIAL), recipe["vocab_size"])})
        words = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
        words.pre_tokenizer = pre_tokenizers.Whitespace()
        PreTrainedTokenizerFast(
            tokenizer_object=words,
            pad_token="<pad>",
            bos_token="<s>",
            eos_token="</s>",
            unk_token="<unk>",
        ).save_pretrained(tmp)
        (tmp / MARKER).write_text(json.dumps(recipe))
        if out.exists():  # an older recipe, or a half-built folder of an interrupted run
            shutil.rmtree(out)
        tmp.chmod(0o755)
        os.replace(tmp, out)
    except OSError:
        if is_built(out, recipe):  # another process finished first
            return out
        raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out


if __name__ == "__main__":
    if len(sys.argv) not in (2, 3) or sys.argv[2:3] and sys.argv[2] not in RECIPES:
        sys.exit(f"usage: model.py OUT_DIR [{'|'.join(RECIPES)}]")
    print(build(Path(sys.argv[1]), *sys.argv[2:3]))
