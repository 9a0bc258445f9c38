"""`oelm params` reproduces the study's parameter tables exactly, offline."""

from __future__ import annotations

import json

import pytest

from oelm.cli import main


def params_json(capsys, *argv: str) -> dict:
    assert main(["params", *argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_gpt_medium_512_baseline(capsys):
    s = params_json(capsys, "gpt-medium-512", "--method", "baseline")
    assert s["total"] == 44_896_768 and s["frozen"] == 0 and s["max_orthogonality_error"] == 0


def test_gpt_medium_512_oelm_freeze(capsys):
    s = params_json(capsys, "gpt-medium-512", "--method", "oelm-freeze")
    assert (s["frozen"], s["trainable"]) == (3_145_728, 41_751_040)
    assert round(100 * s["frozen_fraction"], 1) == 7.0
    assert 0 < s["max_orthogonality_error"] < 1e-5


def test_bert_base_uncased_three_labels_oelm_freeze(capsys):
    s = params_json(capsys, "bert-base-uncased", "--num-labels", "3", "--method", "oelm-freeze")
    assert (s["total"], s["frozen"], s["trainable"]) == (109_484_547, 14_174_208, 95_310_339)
    assert round(100 * s["frozen_fraction"], 1) == 12.9


def test_gpt2_offline_and_config_json_path(capsys, tmp_path):
    import transformers

    s = params_json(capsys, "gpt2", "--method", "oelm-freeze")
    assert s["total"] == 124_439_808 and s["frozen"] == 12 * 2 * (768 * 768 + 768)
    cfg = transformers.BertConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128)
    cfg.save_pretrained(tmp_path)
    s = params_json(capsys, str(tmp_path / "config.json"), "--method", "oelm-freeze")
    assert s["family"] == "bert" and s["frozen"] == 2 * 2 * (64 * 64 + 64)


def test_table_output_and_bad_model(capsys):
    assert main(["params", "gpt-tiny", "--method", "oelm-qk-ffn"]) == 0
    out = capsys.readouterr().out
    assert "frozen" in out and "gpt-tiny" in out
    assert main(["params", "no/such-model-anywhere", "--method", "baseline"]) == 2
    err = capsys.readouterr().err
    assert "no/such-model-anywhere" in err and "local config.json" in err


def test_methods_command_lists_every_method(capsys):
    assert main(["methods"]) == 0
    out = capsys.readouterr().out
    assert out.count("\n") >= 8 and "oelm-freeze" in out


@pytest.mark.parametrize("argv", [["params", "gpt-tiny", "--method", "nope"]])
def test_unknown_method_is_one_clear_error(capsys, argv):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "unknown method 'nope'" in err and "oelm-freeze" in err


def test_params_says_its_vocabulary_and_takes_another(capsys):
    """gpt-tiny counts with GPT-2's vocabulary unless told; the README's byte-level gpt-tiny is 494,208."""
    assert main(["params", "gpt-tiny", "--method", "oelm-freeze"]) == 0
    out = capsys.readouterr().out
    assert "vocabulary         50,257  (the preset's default, GPT-2 BPE's; --vocab-size N or --tokenizer" in out
    byte = params_json(capsys, "gpt-tiny", "--method", "oelm-freeze", "--tokenizer", "byte")
    given = params_json(capsys, "gpt-tiny", "--method", "oelm-freeze", "--vocab-size", "257")
    assert (byte["vocab_size"], byte["vocab_source"], given["vocab_source"]) == (257, "tokenizer byte", "--vocab-size")
    assert byte["total"] == given["total"] == 494_208 and round(100 * byte["frozen_fraction"], 1) == 13.3
    bert = params_json(capsys, "bert-base-uncased", "--vocab-size", "1000")
    assert bert["total"] == 109_482_240 - (30_522 - 1000) * 768 and bert["vocab_source"] == "--vocab-size"
    assert main(["params", "gpt-tiny", "--vocab-size", "0"]) == 2
    assert "--vocab-size must be a positive number" in capsys.readouterr().err
