"""Make a model folder for the ToyLlamaForCausalLM architecture: tiny random weights.

Usage: python make_toy_model.py OUT_FOLDER [TOKENIZER_FOLDER]

A model folder is what forkless loads: config.json (its `architectures` picks the model
class), the weights as *.safetensors, and the tokenizer files. The tokenizer is copied
from TOKENIZER_FOLDER, by default the folder of forkless's embedded SmolLM2 model.
"""

import json
import sys
from pathlib import Path

from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

out = Path(sys.argv[1])
if len(sys.argv) > 2:
    tokenizer_folder = sys.argv[2]
else:
    from forkless.model_loader.default_model import default_model_path

    tokenizer_folder = str(default_model_path())

tokenizer = AutoTokenizer.from_pretrained(tokenizer_folder)
config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128,
                     num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                     max_position_embeddings=512, tie_word_embeddings=True,
                     bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id)
LlamaForCausalLM(config).save_pretrained(out)  # config.json + model.safetensors
tokenizer.save_pretrained(out)  # tokenizer.json, tokenizer_config.json, ...

# The weights are Llama's; the architecture name is the one the plugin registers.
config_file = out / "config.json"
hf_config = json.loads(config_file.read_text())
hf_config["architectures"] = ["ToyLlamaForCausalLM"]
config_file.write_text(json.dumps(hf_config, indent=2))
print(f"wrote {out}")
