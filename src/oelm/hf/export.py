"""Export a trained oelm GPT to a standard Hugging Face `GPT2LMHeadModel` folder (+ tokenizer files).

(Our Llama goes to `LlamaForCausalLM`, or `Qwen3ForCausalLM` with QK-norm: `oelm.hf.llama_export`;
`export_hf` picks by the run's model.)

Our GPT maps onto GPT-2 exactly: pre-LayerNorm blocks (eps 1e-5), learned positions, tied LM
head, exact-erf GELU (`activation_function="gelu"`), 1/sqrt(head_dim) attention scale. Our Q/K/V/O
are bias-free, so GPT-2's c_attn/c_proj biases are written as zeros, and so are its LayerNorm and
MLP biases for a GPTConfig(bias=False) model (adding zero changes no logit). The mapping reads our
state-dict keys only (not module attributes), so it does not depend on how attention is built.
"""

from __future__ import annotations

import base64
import inspect
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from tiktoken_ext.openai_public import r50k_pat_str
from torch import nn

from oelm import __version__
from oelm.core.audit import check_finite
from oelm.core.restore import carry_method
from oelm.data.tokenizers import EOT_TEXT, HFTokenizer, TiktokenTokenizer, load_tokenizer
from oelm.hf.llama_export import to_llama
from oelm.models.gpt import GPT, GPTClassifier
from oelm.models.llama import Llama
from oelm.training.checkpoint import read_metadata, resolve_checkpoint
from oelm.training.runs import existing_run_dir, load_checkpoint, run_tokenizer_spec
from oelm.utils.errors import UserError
from oelm.utils.io import atomic_write_json, follow_umask, read_json, read_yaml, write_error
from oelm.utils.lock import clear_stale_temps, sibling_lock

# Written into every export, listing its files: `--overwrite` replaces only a folder holding it,
# and only when the folder holds nothing else.
MARKER = "oelm_export.json"

# Text the exported tokenizer must encode exactly as the run's tokenizer did.
_PROBE = "Hello world! Once upon a time, 12 cats\u2014naïve, 日本語—sat.\n\n  <|endoftext|> end"


def _check_maps(model: nn.Module) -> None:
    """Raise naming the architecture detail that has no exact GPT-2 counterpart."""

    if isinstance(model, GPTClassifier):
        why = "its attention is bidirectional" if not model.causal else "its score layer has a bias"
        raise UserError(
            f"this run trained a GPTClassifier, which does not map exactly to GPT2ForSequenceClassification: "
            f"{why} (GPT-2's classifier is causal with a bias-free score layer and pools the last "
            "non-pad token by pad_token_id); export supports language-model runs"
        )
    if not isinstance(model, GPT):
        raise UserError(f"export --to hf takes our GPT runs, got {type(model).__name__} (already a HF model)")
    if model.config.qk_width != model.config.d_model:
        raise UserError(
            f"this GPT has thin keys (qk_dim={model.config.qk_width} < d_model={model.config.d_model}); GPT-2's "
            "c_attn has Q, K and V at one width, so it cannot be exported exactly; sample it with `oelm sample`"
        )
    if model.config.q_identity or model.config.attn_scale != 1.0:
        raise UserError(
            f"this GPT has W_Q = I without a Q projection (q_identity={model.config.q_identity}) or an attention "
            f"scale x{model.config.attn_scale}; its export to GPT-2 is not written yet; sample it with `oelm sample`"
        )
    sd = model.state_dict()
    added = sorted({k.split(".oelm_adapter")[0] for k in sd if "oelm_adapter" in k})
    if added:
        raise UserError(
            f"the run's method adds adapter modules (e.g. at {added[0]}) that GPT-2 has no place for; "
            "export supports methods without adapters"
        )
    if any(k.endswith(("q_proj.bias", "k_proj.bias", "v_proj.bias", "o_proj.bias")) for k in sd):
        raise UserError("this GPT has attention biases; the export expects bias-free Q/K/V/O")
    for name, module in model.named_modules():
        if isinstance(module, nn.LayerNorm) and (module.eps != 1e-5 or not module.elementwise_affine):
            raise UserError(f"{name}: LayerNorm eps={module.eps} (GPT-2's layer_norm_epsilon is one value, 1e-5)")


def gpt2_config(model: nn.Module, eot_id: int | None = None, n_positions: int | None = None) -> Any:
    """The GPT2Config equal to our GPTConfig (exact GELU, same eps, no extra scaling).

    n_positions: the context the run trained at (default the model's block size); evaluators such
    as lm-eval take their window from it, and positions beyond it were never trained.
    """
    import transformers  # heavy optional dependency: imported on use

    c = model.config
    eot = c.vocab_size - 1 if eot_id is None else eot_id
    return transformers.GPT2Config(
        vocab_size=c.vocab_size,
        n_positions=n_positions or c.block_size,
        n_embd=c.d_model,
        n_layer=c.n_layer,
        n_head=c.n_head,
        n_inner=c.d_ff,
        activation_function="gelu",
        resid_pdrop=c.dropout,
        embd_pdrop=c.dropout,
        attn_pdrop=c.dropout,
        layer_norm_epsilon=1e-5,
        initializer_range=c.init_std,
        scale_attn_weights=True,
        scale_attn_by_inverse_layer_idx=False,
        reorder_and_upcast_attn=False,
        tie_word_embeddings=True,
        bos_token_id=eot,
        eos_token_id=eot,
    )


def gpt2_state_dict(
    sd: dict[str, torch.Tensor], n_layer: int, n_positions: int | None = None, vocab_size: int | None = None
) -> dict[str, torch.Tensor]:
    """Our GPT's state dict in GPT2LMHeadModel's keys and layouts (Conv1D stores [in, out]).

    vocab_size: the real vocabulary; the rows of a padded embedding past it are left out (None: all rows).
    """

    def bias(module: str) -> torch.Tensor:
        """`module`'s bias, or zeros shaped like it where the model has none (GPTConfig.bias=False)."""
        if f"{module}.bias" in sd:
            return sd[f"{module}.bias"]
        w = sd[f"{module}.weight"]
        return w.new_zeros(w.shape[0])

    out = {f"transformer.{k}": sd[f"transformer.{k}"] for k in ("wte.weight", "wpe.weight", "ln_f.weight")}
    out["transformer.wte.weight"] = out["transformer.wte.weight"][:vocab_size]  # padding rows (vocab_multiple) cut off
    if n_positions is not None:  # the trained positions only
        out["transformer.wpe.weight"] = out["transformer.wpe.weight"][:n_positions]
    out["transformer.ln_f.bias"] = bias("transformer.ln_f")
    for i in range(n_layer):
        src, dst = f"transformer.h.{i}", f"transformer.h.{i}"
        a = f"{src}.attn"
        qkv = torch.cat([sd[f"{a}.{p}_proj.weight"].T for p in "qkv"], dim=1)
        d = qkv.shape[0]
        out.update(
            {
                f"{dst}.ln_1.weight": sd[f"{src}.ln_1.weight"],
                f"{dst}.ln_1.bias": bias(f"{src}.ln_1"),
                f"{dst}.ln_2.weight": sd[f"{src}.ln_2.weight"],
                f"{dst}.ln_2.bias": bias(f"{src}.ln_2"),
                f"{dst}.attn.c_attn.weight": qkv,
                f"{dst}.attn.c_attn.bias": qkv.new_zeros(3 * d),
                f"{dst}.attn.c_proj.weight": sd[f"{a}.o_proj.weight"].T,
                f"{dst}.attn.c_proj.bias": qkv.new_zeros(d),
                f"{dst}.mlp.c_fc.weight": sd[f"{src}.mlp.fc_in.weight"].T,
                f"{dst}.mlp.c_fc.bias": bias(f"{src}.mlp.fc_in"),
                f"{dst}.mlp.c_proj.weight": sd[f"{src}.mlp.fc_out.weight"].T,
                f"{dst}.mlp.c_proj.bias": bias(f"{src}.mlp.fc_out"),
            }
        )
    out["lm_head.weight"] = out["transformer.wte.weight"]
    return {k: v.detach().contiguous().clone() for k, v in out.items()}


def to_gpt2(model: nn.Module, eot_id: int | None = None, n_positions: int | None = None) -> nn.Module:
    """A GPT2LMHeadModel computing the same logits as our GPT (eval mode) on up to n_positions tokens."""
    import transformers  # heavy optional dependency: imported on use

    _check_maps(model)
    check_finite(model)
    if n_positions is not None and not 0 < n_positions <= model.config.block_size:
        raise UserError(f"n_positions {n_positions} must be in 1..{model.config.block_size} (the block size)")
    hf = transformers.GPT2LMHeadModel(gpt2_config(model, eot_id, n_positions))
    state = gpt2_state_dict(model.state_dict(), model.config.n_layer, n_positions, model.config.vocab_size)
    missing, unexpected = hf.load_state_dict(state, strict=False)
    # Non-persistent buffers aside, every GPT-2 tensor must come from ours and vice versa.
    buffers = {n for n, _ in hf.named_buffers()}
    if set(missing) - buffers or unexpected:
        raise UserError(
            f"GPT-2 mapping incomplete: missing {sorted(set(missing) - buffers)[:4]}, unexpected {unexpected[:4]}"
        )
    return hf.eval()


def to_hf(model: nn.Module, eot_id: int | None = None, n_positions: int | None = None) -> nn.Module:
    """The Hugging Face causal LM computing our model's logits: GPT2LMHeadModel for our GPT,
    LlamaForCausalLM for our Llama (Qwen3ForCausalLM when it has QK-norm)."""
    if isinstance(model, Llama):
        check_finite(model)
        return to_llama(model, eot_id, n_positions)
    return to_gpt2(model, eot_id, n_positions)


@torch.no_grad()
def max_logit_diff(ours: nn.Module, hf: nn.Module, seed: int = 0, batch: int = 2) -> float:
    """Largest |logit difference| between our model and the export on random token ids."""
    c = ours.config
    context = getattr(hf.config, "n_positions", None) or hf.config.max_position_embeddings
    length = min(c.block_size, context)
    x = torch.randint(0, c.vocab_size, (batch, length), generator=torch.Generator().manual_seed(seed))
    return float((ours.eval()(x)[0] - hf.eval()(input_ids=x).logits).abs().max())


def export_hf(
    run_dir: str | Path, out_dir: str | Path, which: str = "best", tolerance: float = 1e-4, overwrite: bool = False
) -> dict[str, Any]:
    """Write RUN_DIR's model as a Hugging Face folder (`to_hf`); returns what was written and the logit check.

    The folder is written as a hidden sibling and renamed into place when complete, so a killed
    export leaves no folder that looks complete; the next export clears such leftovers.
    """
    out = Path(out_dir)
    # One export into a folder at a time: two would both pass check_target on a missing folder and
    # rename their temp folders over each other, each exiting 0. The lock sits beside the folder.
    with sibling_lock(out, "export"):
        return _export_locked(out, run_dir, which, tolerance, overwrite)


def _export_locked(out: Path, run_dir: str | Path, which: str, tolerance: float, overwrite: bool) -> dict[str, Any]:
    """export_hf's body, holding the output folder's lock."""
    check_target(out, Path(run_dir), overwrite)
    source = Path(run_dir).resolve()
    # The checkpoint resolved once, its metadata and the run's config.yaml read once; the loader is
    # handed all three rather than reading them again.
    run = existing_run_dir(run_dir)
    checkpoint = resolve_checkpoint(run, "last" if which == "latest" else which)
    meta = read_metadata(checkpoint)
    spec = run_tokenizer_spec(run, meta)
    config = read_yaml(run / "config.yaml", "run config")
    model = load_checkpoint(run, checkpoint, meta, config=config)
    context = int(config.get("seq_len") or model.config.block_size)  # the context it trained at
    tok, note = hf_tokenizer(spec)
    hf = to_hf(model, tok.eos_token_id if tok is not None else None, n_positions=context)
    diff = max_logit_diff(model, hf)
    if not diff <= tolerance:  # a NaN difference is no match either
        raise UserError(
            f"exported logits differ by {diff:.2e} (> {tolerance:g}); not writing a folder that is not exact"
        )
    carry_method(model, hf)  # Q/K frozen in the export too, so oelm.from_pretrained restores the method
    clear_stale_temps(out)
    tmp = out.parent / f".{out.name}.tmp-{os.getpid()}"
    try:
        tmp.mkdir(parents=True)
        hf.save_pretrained(tmp)
        if tok is not None:
            tok.save_pretrained(tmp)
            _portable_tokenizer_class(tmp / "tokenizer_config.json")
        card = model_card(Path(run_dir), config, context, which, note, type(hf).__name__, hf.config.model_type)
        (tmp / "README.md").write_text(card, encoding="utf-8")
        files = sorted(str(p.relative_to(tmp)) for p in tmp.rglob("*") if not p.is_dir())
        marker = {"format": 1, "oelm_version": __version__, "run": source.name, "checkpoint": which}
        atomic_write_json(tmp / MARKER, {**marker, "files": sorted([*files, MARKER])})
        follow_umask(tmp)
        _replace_folder(tmp, out)
    except (OSError, SafetensorError) as err:  # a full disk, a read-only folder: nothing half-written stays
        raise write_error(out, err) from None
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return {
        "out_dir": str(out),
        "architecture": type(hf).__name__,
        "max_abs_logit_diff": diff,
        "tokenizer": note,
        "n_positions": context,
    }


def _portable_tokenizer_class(path: Path) -> None:
    """Name the tokenizer class every transformers release knows: version 5 writes
    "TokenizersBackend", which 4.x cannot load; "PreTrainedTokenizerFast" is the same class there."""
    if not path.is_file():
        return
    config = json.loads(path.read_text(encoding="utf-8"))
    if config.get("tokenizer_class") in (None, "TokenizersBackend"):
        config["tokenizer_class"] = "PreTrainedTokenizerFast"
        path.write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")


def model_card(
    run_dir: Path,
    config: dict[str, Any],
    context: int,
    which: str,
    tokenizer_note: str,
    architecture: str = "GPT2LMHeadModel",
    model_type: str = "gpt2",
) -> str:
    """README.md of an export: what was trained, on what, for how long, how well, and how to use it."""
    results = read_json(run_dir / "results.json") or {}
    frozen, trainable = results.get("frozen_params"), results.get("trainable_params")
    share = (
        f"{frozen / (frozen + trainable):.1%}"
        if isinstance(frozen, int) and isinstance(trainable, int) and frozen + trainable
        else "n/a"
    )

    def metric(key: str) -> str:
        value = results.get(key)
        return f"{value:.4g}" if isinstance(value, (int, float)) else "n/a"

    method = config.get("method", results.get("method", "?"))
    lines = [
        "---",
        "library_name: transformers",
        f"tags: [oelm, {model_type}]",
        "---",
        "",
        f"# {run_dir.name}: {architecture}, trained with oelm method `{method}`",
        "",
        f"Exported by `oelm export` (oelm {__version__}) from the run directory `{run_dir.name}`, checkpoint `{which}`.",
        "",
        "| | |",
        "|---|---|",
        f"| method | `{method}` (options {json.dumps(config.get('method_options') or {})}, seed {config.get('seed')}) |",
        f"| frozen parameters | {frozen if frozen is not None else 'n/a'} of {(frozen or 0) + (trainable or 0) or 'n/a'} ({share}) |",
        f"| data | `{Path(str(config.get('data', '?'))).name}` ({results.get('dataset', 'n/a')}); tokenizer: {tokenizer_note} |",
        f"| budget | {config.get('steps')} steps x batch {config.get('batch_size')} x grad_accum {config.get('grad_accum', 1)} x {results.get('world_size', 1)} process(es) at context {context}; lr {config.get('lr')} |",
        f"| held-out | test perplexity {metric('test_perplexity')} ({metric('test_tokens')} tokens, standard error of the loss {metric('test_loss_se')}); validation perplexity {metric('val_perplexity')}"
        + (
            ""
            if which == "best"
            else f"; these are of the run's best checkpoint (step {results.get('best_step')}), not of the exported `{which}`"
        )
        + " |",
        "",
        "One training run: its numbers carry test-set noise only. Differences between methods need several",
        "seeds and a paired comparison (`oelm sweep`, `oelm report`), not one run.",
        "",
        "## Load",
        "",
        "```python",
        "import transformers",
        "",
        f'model = transformers.AutoModelForCausalLM.from_pretrained("PATH")  # a plain {architecture}',
        "import oelm",
        "",
        'model = oelm.from_pretrained("PATH")  # the same, with the method\'s frozen Q/K restored and checked',
        "```",
        "",
        "## Evaluate",
        "",
        f"The context is {context} tokens (`{'n_positions' if model_type == 'gpt2' else 'max_position_embeddings'}`), the length it was trained at; evaluate with",
        f"windows of at most {context} tokens, e.g. `lm_eval --model hf --model_args pretrained=PATH,max_length={context} "
        "--tasks oelm_heldout --include_path tasks` (docs/huggingface.md writes that held-out task from a "
        "prepared data folder; standard tasks such as `--tasks wikitext` need the hub).",
        "",
    ]
    return "\n".join(lines)


def check_target(out: Path, run_dir: Path, overwrite: bool) -> None:
    """Refuse an output folder that export may not write: a file, a link, the run or a folder above
    it, a non-empty folder without `overwrite`, and with it any folder that is not a previous export
    (no MARKER) or that holds anything the previous export did not write."""
    if out.is_symlink():
        raise UserError(f"output {str(out)!r} is a link; export writes a real folder: pass the folder it points to")
    if out.exists() and not out.is_dir():
        raise UserError(f"output {str(out)!r} is a file; choose a folder")
    source = run_dir.resolve()
    if out.resolve() == source or out.resolve() in source.parents:
        raise UserError(f"output {str(out)!r} is the run directory or holds it; choose a folder outside the run")
    if not out.is_dir() or not any(out.iterdir()):
        return
    if not overwrite:
        raise UserError(f"output folder {str(out)!r} is not empty; choose a new folder or pass --overwrite")
    marker = out / MARKER
    listed = read_json(marker) if marker.is_file() and not marker.is_symlink() else None
    if not isinstance(listed, dict) or not isinstance(listed.get("files"), list):
        raise UserError(
            f"--overwrite replaces only a previous `oelm export` (a folder with its {MARKER}); {str(out)!r} has "
            "none and is not empty: choose a new folder, or empty this one yourself"
        )
    files = {str(f) for f in listed["files"]}
    allowed = files | {str(d) for f in files for d in Path(f).parents if str(d) != "."}
    present = set()
    for root, dirs, names in os.walk(out):  # links are entries, never followed: rmtree removes a link only
        present.update(os.path.relpath(os.path.join(root, n), out) for n in [*dirs, *names])
    others = sorted(present - allowed)
    if others:
        raise UserError(
            f"{str(out)!r} is a previous export but also holds {len(others)} file(s) it did not write "
            f"(e.g. {others[0]!r}); --overwrite removes nothing else: move them out or choose a new folder"
        )


def _replace_folder(new: Path, out: Path) -> None:
    """Put `new` at `out`: a rename; an existing `out` (empty, or being overwritten) goes first."""
    if out.exists():
        old = out.parent / f".{out.name}.old-{os.getpid()}"
        os.replace(out, old)
        try:
            os.replace(new, out)
        except OSError:
            os.replace(old, out)  # the previous export stays where it was
            raise
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.replace(new, out)


def hf_tokenizer(spec: str) -> tuple[Any, str]:
    """(PreTrainedTokenizerFast or None, a sentence saying what was written and why)."""

    if not spec:
        return None, "no tokenizer recorded in the checkpoint; no tokenizer files written"
    try:
        ours = load_tokenizer(spec)
    except UserError as err:
        return None, f"could not load the run's tokenizer {spec!r} ({err}); no tokenizer files written"
    if spec == "byte":
        backend = _byte_backend(ours.eot_id)
    elif isinstance(ours, HFTokenizer):
        backend = _fresh_backend(ours)
    elif isinstance(ours, TiktokenTokenizer):
        backend = _tiktoken_backend(ours)
    else:
        return None, f"tokenizer {spec!r} has no Hugging Face equivalent; no tokenizer files written"
    tok = _wrap(backend, ours.eot_id)
    probe = _PROBE.replace(EOT_TEXT, "")
    if tok.encode(probe) != ours.encode(probe) or len(tok) != ours.vocab_size:
        return None, f"tokenizer {spec!r} could not be converted exactly; no tokenizer files written"
    return tok, f"tokenizer files written from {spec!r} (encodes the same ids as the run's tokenizer)"


def _byte_backend(eot_id: int) -> Any:
    """UTF-8 bytes as ids 0-255 and <|endoftext|> as `eot_id`, as a `tokenizers.Tokenizer`: GPT-2's
    byte-level alphabet with a BPE of no merges, so each byte is its own token and id."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers  # heavy optional dependency
    from transformers.convert_slow_tokenizer import bytes_to_unicode  # heavy optional dependency: imported on use

    vocab = {char: byte for byte, char in bytes_to_unicode().items()}
    vocab[EOT_TEXT] = eot_id
    backend = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    backend.decoder = decoders.ByteLevel()
    backend.add_special_tokens([AddedToken(EOT_TEXT, special=True)])
    return backend


def _fresh_backend(ours: Any) -> Any:
    from tokenizers import Tokenizer as RustTokenizer  # heavy optional dependency: imported on use

    backend = RustTokenizer.from_str(ours._backend.to_str())
    backend.encode_special_tokens = False  # HF tools expect special-token strings to be recognized
    return backend


def _tiktoken_backend(ours: Any) -> Any:
    """A byte-level BPE `tokenizers.Tokenizer` from tiktoken ranks (transformers' converter)."""

    from transformers.convert_slow_tokenizer import TikTokenConverter  # heavy optional dependency: imported on use

    ranks = ours._enc._mergeable_ranks
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "ranks.tiktoken"
        path.write_text(
            "".join(f"{base64.b64encode(t).decode()} {r}\n" for t, r in sorted(ranks.items(), key=lambda x: x[1]))
        )
        # transformers 5 names the argument extra_special_tokens, 4.x additional_special_tokens.
        params = inspect.signature(TikTokenConverter.__init__).parameters
        special = "extra_special_tokens" if "extra_special_tokens" in params else "additional_special_tokens"
        return TikTokenConverter(vocab_file=str(path), pattern=r50k_pat_str, **{special: ["<|endoftext|>"]}).converted()


def _wrap(backend: Any, eot_id: int) -> Any:
    """A PreTrainedTokenizerFast whose bos/eos are the run's end-of-text token (as GPT-2's are)."""
    from transformers import PreTrainedTokenizerFast  # heavy optional dependency: imported on use

    tok = PreTrainedTokenizerFast(tokenizer_object=backend)
    tok.eos_token = tok.bos_token = backend.id_to_token(eot_id)
    return tok
