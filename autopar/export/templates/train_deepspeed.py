"""DeepSpeed training script for the model in config.json beside this file, written by autopar.

    deepspeed train_deepspeed.py --deepspeed --deepspeed_config ds_config.json --dataset-path TOKENS.bin

(launch_deepspeed.sh beside this file runs it on the hostfile's nodes). Everything this script
reads lies beside it: config.json (the model, Hugging Face transformers' format), ds_config.json
(batch, ZeRO stage, bf16, optimizer and LR schedule) and the PLAN block below (sequence length,
recompute, pipeline stages, steps, checkpoint interval as autopar planned them).

The data: one flat file of token ids (numpy uint16 when the vocabulary fits 65,536 ids, else
uint32; e.g. `np.array(ids, dtype=np.uint32).tofile("tokens.bin")`), cut into sequences of
SEQ_LEN tokens. Hugging Face causal-LM models shift the labels themselves, so labels = inputs.

Recompute as planned: "full" checkpoints every decoder layer (transformers'
gradient_checkpointing_enable), "full" with K layers only the first K; "selective" of core
attention needs no call (SDPA / flash attention keep no attention scores); "none" keeps every
activation. A pipeline (PLAN["pp"] > 1) is DeepSpeed's PipelineModule over the model's own
embedding, decoder layers and head, partitioned evenly by layer.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

import numpy as np
import torch

HERE = Path(__file__).resolve().parent  # config.json and ds_config.json are read from here, not the cwd

# ---- The plan (written by autopar; change it by re-planning, not by hand) ----
PLAN = {"seq_len": 2048, "recompute": "none", "recompute_layers": None, "pp": 1, "steps": 10000,
        "checkpoint_interval": 1000, "vocab_size": 32000}


class TokenFile(torch.utils.data.Dataset):
    """Sequences of `seq_len` token ids from one flat binary file (read lazily with np.memmap)."""

    def __init__(self, path: str | os.PathLike, seq_len: int, vocab_size: int) -> None:
        dtype = np.uint16 if vocab_size <= 2**16 else np.uint32
        self.tokens = np.memmap(path, dtype=dtype, mode="r")
        self.seq_len = seq_len
        if len(self.tokens) < seq_len:
            raise SystemExit(f"{path} holds {len(self.tokens)} tokens, fewer than one sequence of {seq_len}")

    def __len__(self) -> int:
        return len(self.tokens) // self.seq_len

    def __getitem__(self, i: int) -> torch.Tensor:
        chunk = self.tokens[i * self.seq_len:(i + 1) * self.seq_len]
        return torch.from_numpy(chunk.astype(np.int64))


def build_model(plan: dict = PLAN, model_dir: Path = HERE, zero3_config: dict | None = None):
    """The Hugging Face causal LM of config.json (randomly initialised), with recompute as planned;
    with `zero3_config`, built inside deepspeed.zero.Init so each rank holds only its shard."""
    import contextlib

    import deepspeed
    import torch._dynamo  # noqa: F401 (imported before zero.Init patches tensor creation)
    from transformers import AutoConfig, AutoModelForCausalLM
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING

    if not (model_dir / "config.json").is_file():
        raise SystemExit(f"no config.json in {model_dir}: no Hugging Face model_type describes this model; "
                         "replace build_model() with code that builds it")
    config = AutoConfig.from_pretrained(model_dir)
    config.use_cache = False
    MODEL_FOR_CAUSAL_LM_MAPPING[type(config)]  # imports the modeling module outside zero.Init
    init = deepspeed.zero.Init(config_dict_or_path=zero3_config) if zero3_config else contextlib.nullcontext()
    with init:
        model = AutoModelForCausalLM.from_config(config)  # bf16 as ds_config.json says, by the engine
    if plan["recompute"] == "full" and plan["pp"] == 1:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        if plan["recompute_layers"] is not None:  # full of the first K layers only
            for layer in decoder_layers(model)[plan["recompute_layers"]:]:
                layer.gradient_checkpointing = False
    return model


def decoder_layers(model) -> list:
    return list(model.get_decoder().layers)


class _Embed(torch.nn.Module):
    """Pipeline stage input: token ids -> hidden states (the model's own embedding); with tied
    weights the same module is the head's weight on the last stage (DeepSpeed's TiedLayerSpec)."""

    def __init__(self, model) -> None:
        super().__init__()
        self.embed = model.get_input_embeddings()
        self.norm = model.get_decoder().norm

    def forward(self, input_ids):
        return self.embed(input_ids)


def _tied_head(module: _Embed, hidden):
    """The last stage's norm and LM head when the head is the embedding matrix (tie_word_embeddings)."""
    return torch.nn.functional.linear(module.norm(hidden), module.embed.weight)


class _Layer(torch.nn.Module):
    """One decoder layer taking and returning hidden states only, as PipelineModule passes them:
    positions 0..s-1, the model's rotary embedding, causal attention without a mask tensor."""

    def __init__(self, layer, rotary) -> None:
        super().__init__()
        self.layer, self.rotary = layer, rotary

    def forward(self, hidden):
        positions = torch.arange(hidden.shape[1], device=hidden.device).unsqueeze(0)
        out = self.layer(hidden, attention_mask=None, position_ids=positions,
                         position_embeddings=self.rotary(hidden, positions))
        return out[0] if isinstance(out, tuple) else out


class _Head(torch.nn.Module):
    """Pipeline stage output: final norm and LM head -> logits."""

    def __init__(self, model) -> None:
        super().__init__()
        self.norm, self.head = model.get_decoder().norm, model.get_output_embeddings()

    def forward(self, hidden):
        return self.head(self.norm(hidden))


def _next_token_loss(logits, labels):
    return torch.nn.functional.cross_entropy(logits[:, :-1].flatten(0, 1).float(), labels[:, 1:].flatten())


def pipeline_model(model, stages: int, plan: dict = PLAN):
    """DeepSpeed's PipelineModule of `stages` stages (ds_config.json's pipeline.stages) over the
    model's embedding, decoder layers and head, each decoder layer its own partitioned unit
    (partition_method "type:_Layer": even by decoder layers)."""
    from deepspeed.pipe import PipelineModule

    from deepspeed.pipe import TiedLayerSpec

    decoder = model.get_decoder()
    if not hasattr(decoder, "layers") or not hasattr(decoder, "rotary_emb"):
        raise SystemExit(f"{type(model).__name__} has no decoder.layers and rotary_emb to pipeline; plan pp 1")
    rotary = decoder.rotary_emb
    blocks = [_Layer(layer, rotary) for layer in decoder_layers(model)]
    if model.config.tie_word_embeddings:  # one weight on the first and last stage, its gradient summed
        tied = [TiedLayerSpec("embed", _Embed, model, tied_weight_attr=["embed.weight"]),
                TiedLayerSpec("embed", _Embed, model, forward_fn=_tied_head, tied_weight_attr=["embed.weight"])]
        layers = [tied[0], *blocks, tied[1]]
    else:
        layers = [_Embed(model), *blocks, _Head(model)]
    interval = 1 if plan["recompute"] == "full" else 0
    return PipelineModule(layers=layers, num_stages=stages, loss_fn=_next_token_loss,
                          partition_method="type:_Layer", activation_checkpoint_interval=interval,
                          checkpointable_layers=["_Layer"])  # decoder layers only: the embedding's input has no grad


def parse_args(argv=None) -> argparse.Namespace:
    import deepspeed

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dataset-path", required=True, help="Flat binary file of token ids (see the docstring).")
    parser.add_argument("--save-dir", default=str(HERE / "checkpoints"), help="Where checkpoints are written.")
    parser.add_argument("--steps", type=int, default=PLAN["steps"],
                        help="Optimizer steps to train; the LR schedule of ds_config.json decays over them.")
    parser.add_argument("--lr", type=float, default=None, help="Peak learning rate (default: ds_config.json's).")
    parser.add_argument("--local_rank", type=int, default=int(os.environ.get("LOCAL_RANK", 0)),
                        help="Set by the deepspeed launcher.")
    parser = deepspeed.add_config_arguments(parser)
    args = parser.parse_args(argv)
    if args.deepspeed_config is None:
        args.deepspeed_config = str(HERE / "ds_config.json")
    elif not Path(args.deepspeed_config).is_absolute() and not Path(args.deepspeed_config).exists():
        args.deepspeed_config = str(HERE / args.deepspeed_config)  # relative to this script
    return args


def build_engine(args: argparse.Namespace, plan: dict = PLAN, model=None):
    """(engine, dataloader, scheduler) from deepspeed.initialize with ds_config.json's batch, ZeRO
    stage, optimizer and scheduler; the pipeline engine when plan["pp"] > 1."""
    import deepspeed

    deepspeed.init_distributed()
    with open(args.deepspeed_config) as f:
        config = json.load(f)
    schedule = config.get("scheduler", {}).get("params", {})
    if "total_num_steps" in schedule:  # the schedule decays over the steps this run trains
        schedule["total_num_steps"] = args.steps
        schedule["warmup_num_steps"] = min(schedule.get("warmup_num_steps", 0), max(1, args.steps // 10))
    if args.lr is not None:
        config["optimizer"]["params"]["lr"] = args.lr
    if model is None:
        zero3 = config.get("zero_optimization", {}).get("stage") == 3
        model = build_model(plan, zero3_config=config if zero3 else None)
    data = TokenFile(args.dataset_path, plan["seq_len"], plan["vocab_size"])
    if plan["pp"] > 1:
        model = pipeline_model(model, config["pipeline"]["stages"], plan)
        data = _PairDataset(data)
    engine, _, loader, scheduler = deepspeed.initialize(
        model=model, model_parameters=[p for p in model.parameters() if p.requires_grad], config=config,
        training_data=data)
    return engine, loader, scheduler


class _PairDataset(torch.utils.data.Dataset):
    """(inputs, labels) pairs, as the pipeline engine reads them."""

    def __init__(self, data) -> None:
        self.data = data

    def __len__(self) -> int:
        return len(self.data)

    def __getitem__(self, i: int):
        ids = self.data[i]
        return ids, ids


def train(engine, loader, steps: int, save_dir: str, checkpoint_interval: int) -> float:
    """`steps` optimizer steps (each of gradient_accumulation_steps micro batches); the last loss."""
    from deepspeed.utils import RepeatingLoader

    # a pipeline's middle stages read no data (DeepSpeed gives them no loader)
    batches = iter(RepeatingLoader(loader)) if loader is not None else None
    loss = torch.tensor(float("nan"))
    for step in range(1, steps + 1):
        if hasattr(engine, "train_batch"):  # the pipeline engine runs its whole schedule
            loss = engine.train_batch(data_iter=batches)
        else:
            for _ in range(engine.gradient_accumulation_steps()):
                ids = next(batches).to(engine.device)
                loss = engine(input_ids=ids, labels=ids).loss
                engine.backward(loss)
                engine.step()
        if step % checkpoint_interval == 0 or step == steps:
            engine.save_checkpoint(save_dir, tag=f"step{step}")
    return float(loss.detach())


def main(argv=None) -> None:
    args = parse_args(argv)
    engine, loader, _ = build_engine(args)
    train(engine, loader, args.steps, args.save_dir, PLAN["checkpoint_interval"])


if __name__ == "__main__":
    main()
