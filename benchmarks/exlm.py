"""Step time and peak memory of the ExLM objective versus plain MLM, at the same batch.

One training step = forward + backward + AdamW step on MiniLM (the offline
all-MiniLM-L6-v2 with a fresh MLM head), on real text: Debian descriptions packed into
sequences of `--seq-len` tokens ([CLS] ... [SEP]), the same seeded 15% random selection of
positions for both objectives. Plain MLM replaces every chosen token by [MASK]; the
baseline computes vocabulary logits at the chosen positions only, as `maskstream train
--objective mlm` (and fairseq/RoBERTa) do, and a second row is Hugging Face's
`BertForMaskedLM(labels=...)`, which projects every position onto the vocabulary. ExLM
expands each chosen token and the two markers into k states and projects at its DAG
vertices only (`trainer/exlm.py`); its step includes the Viterbi read-out the trainer logs
as masked-token accuracy. The last row runs ExLM k=max with `--exlm-token-budget` set to
the plain batch's tokens.

Each configuration runs in its own subprocess so that its peak memory can be read
cleanly: on CPU the growth of the process's peak RSS (`resource` ru_maxrss) over the peak
after loading the model and the batch (activations, gradients and AdamW state); on CUDA
`torch.cuda.max_memory_allocated` during the steps.

    python -m benchmarks.exlm                 # CPU, batch 8, seq len 128, k = 2, 4
    python -m benchmarks.exlm --device cuda --batch-size 64
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]


def packed_batch(tokenizer, corpus: Path, batch_size: int, seq_len: int, seed: int):
    """`batch_size` sequences of exactly `seq_len` tokens of real text, and a 15% random selection."""
    import torch

    ids: list[int] = []
    body = seq_len - 2
    with open(corpus, encoding="utf-8") as f:
        for line in f:
            ids.extend(tokenizer(json.loads(line)["text"], add_special_tokens=False)["input_ids"])
            if len(ids) >= batch_size * body:
                break
    rows = torch.tensor(ids[: batch_size * body]).view(batch_size, body)
    input_ids = torch.cat(
        (
            torch.full((batch_size, 1), tokenizer.cls_token_id),
            rows,
            torch.full((batch_size, 1), tokenizer.sep_token_id),
        ),
        dim=1,
    )
    attention_mask = torch.ones_like(input_ids)
    gen = torch.Generator().manual_seed(seed)
    chosen = torch.rand(input_ids.shape, generator=gen) < 0.15
    chosen[:, 0] = chosen[:, -1] = False
    return input_ids, attention_mask, chosen


def worker(args: argparse.Namespace) -> dict:
    """Runs one configuration in this process and returns its figures."""
    import torch
    from transformers import AutoTokenizer, BertForMaskedLM
    from transformers.utils import logging as hf_logging

    from maskstream.trainer.exlm import ExLMForMaskedLM, expand_batch

    hf_logging.set_verbosity_error()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    device = torch.device(args.device)
    tokenizer = AutoTokenizer.from_pretrained(args.model)
    mlm = BertForMaskedLM.from_pretrained(args.model)
    input_ids, attention_mask, chosen = (
        t.to(device) for t in packed_batch(tokenizer, args.corpus, args.batch_size, args.seq_len, seed=0)
    )
    extra: dict = {}
    masked = torch.where(chosen, tokenizer.mask_token_id, input_ids)
    if args.objective == "mlm":
        model = mlm.to(device)
        labels = torch.where(chosen, input_ids, -100)

        def step_loss():
            return model(input_ids=masked, attention_mask=attention_mask, labels=labels).loss

    elif args.objective == "mlm-masked-head":
        model = mlm.to(device)

        def step_loss():
            # As fairseq/RoBERTa do: the vocabulary projection only at the chosen positions.
            hidden = model.bert(input_ids=masked, attention_mask=attention_mask).last_hidden_state
            return torch.nn.functional.cross_entropy(model.cls(hidden[chosen]), input_ids[chosen])

    else:
        model = ExLMForMaskedLM(
            mlm, num_states=args.states, mask_token_id=tokenizer.mask_token_id, token_budget=args.token_budget
        ).to(device)
        labels = torch.where(chosen, input_ids, -100)
        x = expand_batch(input_ids, attention_mask, chosen, num_states=args.states, mask_token_id=tokenizer.mask_token_id)
        extra.update(expanded_length=x.input_ids.shape[1], vertices=x.vertex_index.shape[1])

        def step_loss():
            # What `maskstream train --objective exlm` runs: expansion on the device, the DAG loss,
            # and the Viterbi read-out for the masked-token accuracy it logs.
            return model(masked, attention_mask, labels)["loss"]

    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)

    def step() -> float:
        loss = step_loss()
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        return float(loss.detach())

    def sync():
        if device.type == "cuda":
            torch.cuda.synchronize()

    rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats()
        base_cuda = torch.cuda.memory_allocated()
    for _ in range(args.warmup):
        step()
    times = []
    for _ in range(args.steps):
        sync()
        start = time.perf_counter()
        loss = step()
        sync()
        times.append(time.perf_counter() - start)
    if device.type == "cuda":
        peak_mib = (torch.cuda.max_memory_allocated() - base_cuda) / 2**20
    else:
        peak_mib = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss_before) / 1024
    return {
        "step_s": statistics.median(times),
        "peak_mib": peak_mib,
        "tokens": int(attention_mask.sum()),
        "masked": int(chosen.sum()),
        "loss": loss,
        **extra,
    }


def main(argv: list[str] | None = None) -> int:
    from maskstream.models import default_model

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=default_model(), help="masked LM name or path (default: offline MiniLM)")
    parser.add_argument("--corpus", type=Path, default=REPO_ROOT / "data" / "debian-science.jsonl", help="JSONL text")
    parser.add_argument("--batch-size", type=int, default=8, help="sequences per step (default: 8)")
    parser.add_argument("--seq-len", type=int, default=128, help="tokens per sequence (default: 128)")
    parser.add_argument("--states", type=int, nargs="+", default=[2, 4], help="ExLM k values (default: 2 4)")
    parser.add_argument("--steps", type=int, default=5, help="timed steps per configuration (default: 5)")
    parser.add_argument("--warmup", type=int, default=2, help="untimed steps first (default: 2)")
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads (default: 1)")
    parser.add_argument("--device", default="cpu", help="cpu or cuda (default: cpu)")
    parser.add_argument("--token-budget", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--worker", choices=["mlm", "mlm-masked-head", "exlm"], help=argparse.SUPPRESS)
    args = parser.parse_args(argv)

    if args.worker:
        args.objective = args.worker
        args.states = args.states[0]
        print(json.dumps(worker(args)))
        return 0

    common = [
        "--model", args.model, "--corpus", str(args.corpus), "--batch-size", str(args.batch_size),
        "--seq-len", str(args.seq_len), "--steps", str(args.steps), "--warmup", str(args.warmup),
        "--threads", str(args.threads), "--device", args.device,
    ]  # fmt: skip

    def run(objective: str, states: int, token_budget: int = 0) -> dict:
        command = [sys.executable, __file__, "--worker", objective, "--states", str(states), *common]
        out = subprocess.run(
            [*command, "--token-budget", str(token_budget)],
            capture_output=True,
            text=True,
            cwd=REPO_ROOT,
            env={**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")]))},
        )
        if out.returncode:
            raise SystemExit(f"{' '.join(command)} failed:\n{out.stderr[-3000:]}")
        return json.loads(out.stdout.strip().splitlines()[-1])

    print(
        f"MiniLM ({Path(args.model).name}), batch {args.batch_size} x {args.seq_len} tokens, {args.device}, "
        f"{args.threads} thread(s), median of {args.steps} steps after {args.warmup} warm-up; "
        "step = forward + backward + AdamW"
    )
    # The baseline is plain MLM as `maskstream train --objective mlm` runs it (vocabulary logits at the
    # masked positions only); HF's BertForMaskedLM(labels=...) projects every position.
    baseline = run("mlm-masked-head", 1)
    rows = [("MLM, head at masked (maskstream)", baseline, None), ("MLM, HF BertForMaskedLM(labels)", run("mlm", 1), None)]
    rows += [(f"ExLM k={k}", run("exlm", k), k) for k in args.states]
    budget = args.batch_size * args.seq_len  # the plain batch's tokens per forward pass
    k = max(args.states)
    rows.append((f"ExLM k={k}, --exlm-token-budget {budget}", run("exlm", k, budget), k))
    print(f"{baseline['masked']} masked tokens of {baseline['tokens']}; ratios to the first row")
    header = f"{'objective':40} {'input len':>9} {'DAG V':>6} {'step s':>8} {'ratio':>6} {'peak MiB':>9} {'ratio':>6}"
    print(header)
    print("-" * len(header))
    for name, r, k in rows:
        length = r.get("expanded_length", args.seq_len)
        vertices = str(r["vertices"]) if k else "-"
        print(
            f"{name:40} {length:>9} {vertices:>6} {r['step_s']:>8.3f} {r['step_s'] / baseline['step_s']:>6.2f} "
            f"{r['peak_mib']:>9.0f} {r['peak_mib'] / baseline['peak_mib']:>6.2f}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
