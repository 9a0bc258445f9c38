"""`oelm export RUN_DIR --to hf OUT_DIR`: a GPT2LMHeadModel folder with the same logits."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import oelm
from oelm.cli import main
from oelm.core.audit import audit_model
from oelm.hf.export import MARKER, check_target, export_hf, hf_tokenizer, max_logit_diff, to_gpt2
from oelm.models.gpt import GPT, GPTClassifier, gpt_config
from oelm.training.loop import train
from oelm.utils.errors import UserError
from train_utils import one_thread, synthetic_lm_dir, tiny_config

SHARED_GPT2 = Path(__file__).resolve().parents[1] / ".." / "shared" / "data" / "tokenizers" / "gpt2"


@pytest.fixture(scope="module")
def lm_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("export")
    cfg = tiny_config(
        synthetic_lm_dir(root / "data", n_train=4000),
        root / "run",
        steps=10,
        model_overrides={"n_layer": 2, "d_model": 64, "n_head": 4, "block_size": 32},
    )
    with one_thread():
        train(cfg)
    return root / "run"


def test_export_cli_writes_a_gpt2_folder_with_the_same_logits(lm_run, tmp_path, capsys):
    import transformers

    out = tmp_path / "hf"
    assert main(["export", str(lm_run), "--to", "hf", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "GPT2LMHeadModel" in printed and "tokenizer files written from 'byte'" in printed
    # The byte tokenizer travels: transformers encodes text to the run's UTF-8 byte ids.
    tok = transformers.AutoTokenizer.from_pretrained(out)
    text = "Héllo, wörld\n  日本"
    assert tok(text)["input_ids"] == list(text.encode("utf-8")) and tok.decode(list(text.encode())) == text
    assert len(tok) == 257 and tok.eos_token == "<|endoftext|>" and tok.convert_tokens_to_ids("<|endoftext|>") == 256
    ours = oelm.load_model(lm_run)
    hf = transformers.GPT2LMHeadModel.from_pretrained(out).eval()
    x = torch.randint(0, 64, (3, 32), generator=torch.Generator().manual_seed(7))
    diff = (ours(x)[0] - hf(input_ids=x).logits).abs().max().item()
    assert diff < 1e-4, diff
    assert hf.config.activation_function == "gelu" and hf.config.tie_word_embeddings
    greedy = hf.generate(x[:1, :4], max_new_tokens=5, do_sample=False, pad_token_id=0)
    assert torch.equal(greedy, ours.generate(x[:1, :4], 5, temperature=0))
    # The export carries the method: oelm.from_pretrained restores GPT-2 with Q/K frozen.
    again = oelm.from_pretrained(out)
    frozen = {n for n, p in again.named_parameters() if not p.requires_grad}
    assert frozen and all(".c_attn.q_" in n or ".c_attn.k_" in n for n in frozen)
    assert audit_model(again).totals["max_orthogonality_error"] < 1e-5
    assert main(["export", str(lm_run), str(out)]) == 2  # --to is required


def test_export_refuses_a_non_empty_folder_and_classifiers(lm_run, tmp_path):
    (tmp_path / "x").mkdir()
    (tmp_path / "x" / "keep.txt").write_text("mine")
    assert main(["export", str(lm_run), "--to", "hf", str(tmp_path / "x")]) == 2
    assert (tmp_path / "x" / "keep.txt").read_text() == "mine"
    with pytest.raises(UserError, match="bidirectional"):
        to_gpt2(GPTClassifier(gpt_config("gpt-tiny", vocab_size=50, block_size=16), 2))


def test_mapping_is_exact_for_a_random_untrained_gpt_with_dropout_config():
    model = GPT(gpt_config("gpt-tiny", vocab_size=80, block_size=24, n_layer=3, d_ff=200))
    assert max_logit_diff(model, to_gpt2(model)) < 1e-4


def test_a_bias_free_gpt_exports_with_zero_biases():
    model = GPT(gpt_config("gpt-tiny", vocab_size=80, block_size=24, bias=False))
    assert not any(k.endswith(".bias") for k in model.state_dict())
    hf = to_gpt2(model)
    assert max_logit_diff(model, hf) < 1e-4
    assert not any(p.any() for n, p in hf.named_parameters() if n.endswith(".bias"))


@pytest.mark.slow
def test_gpt2_bpe_tokenizer_is_written_exactly(tmp_path):
    if not SHARED_GPT2.is_dir():
        pytest.skip(f"shared GPT-2 tokenizer files not found at {SHARED_GPT2}")
    from oelm.data.tokenizers import load_tokenizer

    for spec in (f"gpt2:{SHARED_GPT2}", str(SHARED_GPT2 / "gpt2.tiktoken")):
        tok, note = hf_tokenizer(spec)
        assert tok is not None, note
        tok.save_pretrained(tmp_path / "tok")
        import transformers

        again = transformers.AutoTokenizer.from_pretrained(tmp_path / "tok")
        text = "Once upon a time, naïve cats sat.\n"
        assert again.encode(text) == load_tokenizer(spec).encode(text)
        assert again.eos_token_id == 50256


def test_export_overwrite_and_a_killed_exports_leftovers(lm_run, tmp_path, monkeypatch):
    out = tmp_path / "x"
    stale = tmp_path / ".x.tmp-999999999"  # a killed export's hidden folder (dead pid)
    stale.mkdir()
    (stale / "config.json").write_text("{}")
    assert main(["export", str(lm_run), "--to", "hf", str(out)]) == 0
    assert (out / MARKER).is_file() and not stale.exists()
    assert main(["export", str(lm_run), "--to", "hf", str(out), "--overwrite"]) == 0
    assert (out / "config.json").is_file() and (out / MARKER).is_file()
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []

    # A failure while writing leaves the previous export whole, no partial folder and one line.
    import transformers

    def broken(self, *args, **kwargs):
        raise OSError(28, "No space left on device")

    before = sorted(p.name for p in out.iterdir())
    monkeypatch.setattr(transformers.GPT2LMHeadModel, "save_pretrained", broken)
    with pytest.raises(UserError, match=r"could not write .*x'.*No space left.*free space"):
        export_hf(lm_run, out, overwrite=True)
    assert sorted(p.name for p in out.iterdir()) == before
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []


@pytest.mark.parametrize("case", ["not-an-export", "export-plus-a-file", "export-plus-a-folder", "forged-marker"])
def test_overwrite_replaces_only_a_previous_export_and_nothing_else(case, lm_run, tmp_path, capsys):
    out = tmp_path / "x"
    if case == "not-an-export":
        out.mkdir()
        (out / "thesis.tex").write_text("years of work")
    else:
        export_hf(lm_run, out)
        if case == "export-plus-a-file":
            (out / "notes.txt").write_text("mine")
        elif case == "export-plus-a-folder":
            (out / "plots").mkdir()
        else:  # a marker that lists a file the export never wrote
            marker = json.loads((out / MARKER).read_text())
            (out / MARKER).write_text(json.dumps({**marker, "files": "*"}))
    before = {str(p.relative_to(out)): p.stat().st_mtime_ns for p in out.rglob("*")}
    capsys.readouterr()  # the first export's progress bars
    assert main(["export", str(lm_run), "--to", "hf", str(out), "--overwrite"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and ("removes nothing else" in err or "previous `oelm export`" in err)
    assert {str(p.relative_to(out)): p.stat().st_mtime_ns for p in out.rglob("*")} == before


def test_overwrite_never_follows_a_link_out_of_the_target(lm_run, tmp_path):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "data.bin").write_text("precious")
    link = tmp_path / "link"
    link.symlink_to(elsewhere, target_is_directory=True)
    with pytest.raises(UserError, match="is a link"):
        export_hf(lm_run, link, overwrite=True)
    out = tmp_path / "x"
    export_hf(lm_run, out)
    (out / "inside").symlink_to(elsewhere, target_is_directory=True)  # a link planted in an export
    with pytest.raises(UserError, match="did not write .*'inside'"):
        export_hf(lm_run, out, overwrite=True)
    marker = json.loads((out / MARKER).read_text())  # even when the marker lists the link
    (out / MARKER).write_text(json.dumps({**marker, "files": [*marker["files"], "inside"]}))
    export_hf(lm_run, out, overwrite=True)
    assert not (out / "inside").exists() and (elsewhere / "data.bin").read_text() == "precious"


def test_weights_holding_nan_are_refused_naming_the_tensor(tmp_path):
    model = GPT(gpt_config("gpt-tiny", vocab_size=64, block_size=16, n_layer=2)).eval()
    with torch.no_grad():
        model.transformer.h[1].mlp.fc_in.weight[3, 5] = float("nan")
    with pytest.raises(UserError, match=r"'transformer\.h\.1\.mlp\.fc_in\.weight' holds 1 non-finite"):
        to_gpt2(model)
    with torch.no_grad():
        model.transformer.h[1].mlp.fc_in.weight[3, 5] = float("inf")
    with pytest.raises(UserError, match="non-finite"):
        to_gpt2(model)


def test_a_llama_holding_nan_is_refused_too():
    from oelm.hf.export import to_hf
    from oelm.models.llama import Llama, llama_config

    model = Llama(llama_config("llama-tiny", vocab_size=64, block_size=16)).eval()
    name, weight = next((n, p) for n, p in model.named_parameters() if p.ndim == 2 and "layers.1" in n)
    with torch.no_grad():
        weight[0, 0] = float("nan")
    with pytest.raises(UserError, match=rf"'{name}' holds 1 non-finite"):
        to_hf(model)


def test_export_says_the_context_it_trained_at_and_writes_a_model_card(tmp_path):
    import transformers

    cfg = tiny_config(
        synthetic_lm_dir(tmp_path / "data", n_train=4000),
        tmp_path / "run",
        steps=6,
        seq_len=16,  # trained at 16 tokens of a 32-token block
        model_overrides={"n_layer": 1, "d_model": 32, "n_head": 2, "block_size": 32},
    )
    with one_thread():
        results = train(cfg)
    out = tmp_path / "hf"
    report = export_hf(tmp_path / "run", out)
    hf = transformers.GPT2LMHeadModel.from_pretrained(out).eval()
    assert report["n_positions"] == hf.config.n_positions == 16  # not the block size, 32
    assert hf.transformer.wpe.weight.shape[0] == 16
    ours = oelm.load_model(tmp_path / "run")
    x = torch.randint(0, 64, (2, 16), generator=torch.Generator().manual_seed(3))
    assert (ours(x)[0] - hf(input_ids=x).logits).abs().max().item() < 1e-4
    card = (out / "README.md").read_text()
    assert "`oelm-freeze`" in card and "context 16" in card and "max_length=16" in card
    assert f"{results['test_perplexity']:.4g}" in card and "oelm.from_pretrained" in card


def test_export_never_overwrites_the_run_itself_and_labels_non_best_numbers(lm_run, tmp_path):
    for out in (lm_run, lm_run.parent):
        with pytest.raises(UserError, match="is the run directory or holds it"):
            export_hf(lm_run, out, overwrite=True)
    assert (lm_run / "results.json").is_file()
    export_hf(lm_run, tmp_path / "latest", which="latest")
    card = (tmp_path / "latest" / "README.md").read_text()
    assert "of the run's best checkpoint" in card and "not of the exported `latest`" in card


def test_a_really_full_disk_keeps_the_previous_export_and_ends_in_one_line(lm_run, small_disk, capsys):
    out = small_disk / "x"
    assert main(["export", str(lm_run), "--to", "hf", str(out)]) == 0
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    free = os.statvfs(small_disk).f_bavail * os.statvfs(small_disk).f_frsize
    (small_disk / "filler").write_bytes(b"\0" * (free - 4096))  # room for small files, not for weights
    capsys.readouterr()
    assert main(["export", str(lm_run), "--to", "hf", str(out), "--overwrite"]) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert "could not write" in err and "No space left on device" in err and "Traceback" not in err
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    assert sorted(p.name for p in small_disk.iterdir()) == ["filler", "x"]


NAMES = st.sampled_from(["config.json", "model.safetensors", "README.md", "notes.txt", "sub", "sub/a.bin", "x.lnk"])


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(listed=st.sets(NAMES, max_size=5), present=st.sets(NAMES, min_size=1, max_size=5))
def test_overwrite_is_allowed_exactly_when_the_folder_holds_only_what_its_marker_lists(
    listed, present, tmp_path_factory
):
    root = tmp_path_factory.mktemp("target")
    out, run = root / "out", root / "run"
    run.mkdir()
    out.mkdir()
    for name in sorted(present):
        path = out / name
        path.parent.mkdir(parents=True, exist_ok=True)
        if name == "x.lnk":
            path.symlink_to(run, target_is_directory=True)  # a link never counts as what it points to
        elif name == "sub":
            path.mkdir(exist_ok=True)
        elif not path.exists():
            path.write_text("x")
    files = sorted(listed | {MARKER})
    (out / MARKER).write_text(json.dumps({"files": files}))
    on_disk = {str(p.relative_to(out)) for p in out.rglob("*")}
    allowed = set(files) | {str(Path(f).parent) for f in files if "/" in f}
    if on_disk <= allowed:
        check_target(out, run, overwrite=True)
    else:
        with pytest.raises(UserError, match="removes nothing else"):
            check_target(out, run, overwrite=True)
    with pytest.raises(UserError, match="pass --overwrite"):
        check_target(out, run, overwrite=False)


@pytest.mark.slow  # a fresh interpreter: DeepSpeed warns once per process, at its import
def test_export_cli_prints_no_deepspeed_accelerator_warning_without_a_gpu(lm_run, tmp_path):
    """transformers' save_pretrained imports DeepSpeed where it is installed, which then warned
    "Setting accelerator to CPU" on every `oelm export` of a CPU machine."""
    import importlib.util
    import subprocess
    import sys

    if importlib.util.find_spec("deepspeed") is None:
        pytest.skip("DeepSpeed is not installed: no warning to silence")
    if torch.cuda.is_available():
        pytest.skip("with a GPU DeepSpeed picks CUDA and does not warn")
    env = {k: v for k, v in os.environ.items() if k != "DS_ACCELERATOR"}
    cmd = [sys.executable, "-m", "oelm", "export", str(lm_run), "--to", "hf", str(tmp_path / "hf")]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env)
    assert done.returncode == 0, done.stderr
    assert "wrote GPT2LMHeadModel" in done.stdout
    printed = done.stdout + done.stderr  # DeepSpeed's logger writes to stdout
    assert "accelerator" not in printed.lower(), printed


@pytest.mark.parametrize(
    ("edit", "says"),
    [
        ({"method": "baseline", "method_options": "{}"}, r"method record names 'baseline', but the run trained"),
        ({"method_options": '{"qk_init": null, "layers": [0]}'}, r"freezes other tensors than the run did"),
    ],
)
def test_an_edited_method_record_in_the_weights_is_refused_naming_it(lm_run, tmp_path, edit, says):
    import shutil

    from safetensors.torch import load_file, save_file

    from oelm.training.checkpoint import read_metadata

    run = tmp_path / "run"
    shutil.copytree(lm_run, run)
    weights = run / "checkpoints" / "best" / "model.safetensors"
    save_file(load_file(weights), weights, metadata={**read_metadata(weights), **edit})
    with pytest.raises(UserError, match=says + r".*freeze_audit\.json"):
        export_hf(run, tmp_path / "hf")
    assert not (tmp_path / "hf").exists()


def test_a_second_export_into_a_folder_being_written_is_refused(lm_run, tmp_path):
    from oelm.utils.lock import sibling_lock

    out = tmp_path / "x"
    with sibling_lock(out, "export"):  # what an export still writing `out` holds
        with pytest.raises(UserError, match=r"another export \(pid \d+ on .*\) is using '.*x'"):
            export_hf(lm_run, out)
        assert not out.exists()
    assert [p.name for p in tmp_path.iterdir()] == []  # the lock file goes with its holder
    export_hf(lm_run, out)
    assert (out / MARKER).is_file() and [p.name for p in tmp_path.iterdir()] == ["x"]


def test_export_resolves_the_checkpoint_once_and_reads_each_input_once(lm_run, tmp_path, monkeypatch):
    """`oelm export` resolves its checkpoint once and reads the weights' metadata, config.yaml,
    freeze_audit.json and results.json once each (issue 50). Before, it resolved the checkpoint
    twice (itself for the tokenizer, then load_model) and read the metadata three times (itself,
    load_model, then load_weights)."""
    from oelm.training import checkpoint
    from test_validate_once import count_calls, count_reads

    counts = count_reads(monkeypatch, {"config.yaml", "freeze_audit.json", "results.json"})
    count_calls(monkeypatch, checkpoint, {"resolve_checkpoint": "resolved", "read_metadata": "metadata"}, counts)
    with one_thread():
        assert main(["export", str(lm_run), "--to", "hf", str(tmp_path / "hf")]) == 0
    assert counts == {"resolved": 1, "metadata": 1, "config.yaml": 1, "freeze_audit.json": 1, "results.json": 1}
