"""``forkless generate [MODEL] --prompt TEXT``: one-off generation from the command line."""

from __future__ import annotations

import argparse
import dataclasses
import sys

from forkless.config import EngineArgs


def add_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Register the ``generate`` sub-command."""
    parser = subparsers.add_parser(
        "generate", help="generate text for one or more prompts",
        description="Generate text for prompts with an in-process engine and print it.",
    )
    EngineArgs.add_cli_args(parser)
    g = parser.add_argument_group("generation")
    g.add_argument("--prompt", action="append", required=True,
                   help="prompt text (repeat the flag for several prompts)")
    g.add_argument("--chat", action="store_true", help="wrap each prompt as a user message in the chat template")
    g.add_argument("--max-tokens", type=int, default=128, help="most tokens to generate per prompt")
    g.add_argument("--temperature", type=float, default=0.0, help="0 for greedy")
    g.add_argument("--top-p", type=float, default=1.0)
    g.add_argument("--top-k", type=int, default=0)
    g.add_argument("--stop", action="append", default=None, help="stop string (repeatable)")
    parser.set_defaults(func=run)
    return parser


#: Engine flags that mean something to a server only (or to a LoRA adapter, which generate
#: cannot name).
_SERVER_ONLY = ("served_model_name", "stream_interval", "max_prefill_tokens_per_client", "enable_lora")


def run(args: argparse.Namespace) -> int:
    from forkless.executor import get_executor_cls
    from forkless.model_loader.default_model import ModelNotFoundError
    from forkless.plugins import PluginLoadError
    from forkless.sampling_params import SamplingParams

    engine_args = EngineArgs.from_cli_args(args)
    # Given, they are refused rather than ignored.
    defaults = {f.name: f.default for f in dataclasses.fields(EngineArgs)}
    for name in _SERVER_ONLY:
        if getattr(engine_args, name) != defaults[name]:
            print(f"forkless generate: error: --{name.replace('_', '-')} has no use here (serve it with forkless "
                  "serve, or use the Python API)", file=sys.stderr)
            return 2
    # Every class path on the command line is imported and checked before the model
    # loads: a typo fails in a second with one line, like an argparse error.
    try:
        engine_args.check_class_paths()
        get_executor_cls(engine_args.distributed_executor_backend)
    except (ValueError, TypeError, ImportError, PluginLoadError) as exc:
        print(f"forkless generate: error: {exc}", file=sys.stderr)
        return 2
    from forkless.entrypoints.llm import LLM

    try:
        params = SamplingParams(
            max_tokens=args.max_tokens, temperature=args.temperature, top_p=args.top_p,
            top_k=args.top_k, seed=args.seed, stop=args.stop,
        )
        llm = LLM(**vars(engine_args))
        if args.chat:
            outputs = llm.chat([[{"role": "user", "content": p}] for p in args.prompt], params, use_tqdm=False)
        else:
            outputs = llm.generate(args.prompt, params, use_tqdm=False)
    except (ValueError, ModelNotFoundError) as exc:
        print(f"forkless generate: error: {exc}", file=sys.stderr)
        return 2
    for output in outputs:
        if len(outputs) > 1:
            print(f"--- {output.prompt!r}" if not args.chat else "---")
        print(output.outputs[0].text)
    llm.shutdown()
    return 0
