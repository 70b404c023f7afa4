"""``posttrain chat``: render a conversation with the chat template (and its training mask), or
send one message to a model and print the parsed reply (reasoning, answer, tool calls)."""

from __future__ import annotations

import argparse
import json


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("message", nargs="?", help="a user message to send to --model")
    p.add_argument("--model", default="embedded", help="model spec (default: embedded)")
    p.add_argument("--render", metavar="JSONL", help="render the first row of a conversation JSONL and show the mask")
    p.add_argument("--no-think", action="store_true", help="reasoning off")
    p.add_argument("--max-new-tokens", type=int, default=128)


def run(args: argparse.Namespace) -> int:
    from posttrain.models.chat_template import parse_assistant, render
    from posttrain.models.loading import load_model, load_tokenizer

    if args.render:
        from posttrain.data.conversations import read_conversations

        rows, _ = read_conversations(args.render)
        tok = load_tokenizer(args.model)
        r = render(tok, rows[0]["messages"], rows[0].get("tools"), reasoning=not args.no_think)
        for i, m in zip(r.input_ids, r.loss_mask):
            piece = tok.decode([i])
            print(f"\033[92m{piece}\033[0m" if m else piece, end="")
        print(f"\n\n{len(r)} tokens, {sum(r.loss_mask)} trained on (green)")
        return 0
    if not args.message:
        print("give a message, or --render FILE.jsonl")
        return 2
    import torch

    loaded = load_model(args.model)
    msgs = [{"role": "user", "content": args.message}]
    ids = render(loaded.tokenizer, msgs, add_generation_prompt=True, reasoning=not args.no_think).input_ids
    with torch.inference_mode():
        out = loaded.model.generate(torch.tensor([ids]), max_new_tokens=args.max_new_tokens, do_sample=False,
                                    eos_token_id=loaded.tokenizer.convert_tokens_to_ids("<|im_end|>"))
    text = loaded.tokenizer.decode(out[0, len(ids):], skip_special_tokens=True)
    print(text)
    try:
        turn = parse_assistant(text)
        print(json.dumps(turn.to_message(), indent=2))
    except ValueError as e:
        print(f"(reply does not parse: {e})")
    return 0
