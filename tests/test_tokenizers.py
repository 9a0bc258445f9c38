"""Tokenizers: byte and GPT-2 (tiktoken file, vocab/merges, HF folder) round trips and agreement."""

from __future__ import annotations

from pathlib import Path

import pytest

from oelm.data.tokenizers import EOT_TEXT, load_tokenizer
from oelm.utils.errors import UserError

DATA = Path(__file__).resolve().parents[1] / ".." / "shared" / "data"
GPT2_DIR = DATA / "tokenizers" / "gpt2"
needs_gpt2 = pytest.mark.skipif(
    not (GPT2_DIR / "vocab.json").is_file(),
    reason=f"GPT-2 tokenizer files not found under {GPT2_DIR} (shared data folder absent)",
)

TEXTS = [
    "Hello world",
    "Once upon a time, there was a little girl.\n\nThe end.",
    "unicode: héllo wörld — 世界 🎉 \t tabs  and   spaces\n",
    f"a literal {EOT_TEXT} inside text",
    "",
]


@pytest.fixture(scope="module")
def hf_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A Hugging Face tokenizer folder saved from the local GPT-2 vocab/merges."""
    from transformers import PreTrainedTokenizerFast

    base = load_tokenizer(f"gpt2:{GPT2_DIR}")
    folder = tmp_path_factory.mktemp("hf-gpt2")
    PreTrainedTokenizerFast(tokenizer_object=base._backend, eos_token=EOT_TEXT).save_pretrained(folder)
    return folder


def gpt2_specs(hf_folder: Path) -> list[str]:
    """Every local way to spell the GPT-2 tokenizer."""
    return [
        f"gpt2:{GPT2_DIR}",
        str(GPT2_DIR),
        str(GPT2_DIR / "gpt2.tiktoken"),
        f"gpt2:{GPT2_DIR / 'gpt2.tiktoken'}",
        str(hf_folder),
    ]


def test_byte_round_trip_and_ids() -> None:
    tok = load_tokenizer("byte")
    assert (tok.name, tok.spec, tok.vocab_size, tok.eot_id) == ("byte", "byte", 257, 256)
    for text in TEXTS:
        ids = tok.encode(text)
        assert tok.decode(ids) == text and all(0 <= i < 256 for i in ids)
    assert tok.encode_batch(TEXTS) == [tok.encode(t) for t in TEXTS]
    assert tok.decode(tok.encode("a") + [tok.eot_id] + tok.encode("b")) == f"a{EOT_TEXT}b"


@needs_gpt2
def test_gpt2_local_variants_agree_and_round_trip(hf_folder: Path) -> None:
    reference = None
    for spec in gpt2_specs(hf_folder):
        tok = load_tokenizer(spec)
        assert tok.spec == spec and tok.vocab_size == 50257 and tok.eot_id == 50256, spec
        assert tok.encode("Hello world") == [15496, 995], spec
        assert tok.encode("Once upon a time") + [tok.eot_id] == [7454, 2402, 257, 640, 50256], spec
        # The literal end-of-text string is ordinary text, never the special id.
        assert tok.eot_id not in tok.encode(f"x{EOT_TEXT}y"), spec
        batch = tok.encode_batch(TEXTS)
        assert batch == [tok.encode(t) for t in TEXTS], spec
        assert [tok.decode(ids) for ids in batch] == TEXTS, spec
        reference = reference or batch
        assert batch == reference, f"{spec} disagrees with {gpt2_specs(hf_folder)[0]}"
    # The spec alone reloads the same tokenizer (HF folder skipped: AutoTokenizer loads slowly).
    assert load_tokenizer(f"gpt2:{GPT2_DIR}").encode(TEXTS[2]) == reference[2]


@needs_gpt2
@pytest.mark.parametrize("spec", ["byte", f"gpt2:{GPT2_DIR}", str(GPT2_DIR / "gpt2.tiktoken")])
def test_add_special_token_appends_and_is_never_encoded(spec: str) -> None:
    tok = load_tokenizer(spec)
    before = tok.vocab_size
    sep = tok.add_special_token("<|sep|>")
    assert sep == before and tok.vocab_size == before + 1
    assert tok.add_special_token("<|sep|>") == sep  # idempotent
    assert sep not in tok.encode("a <|sep|> b")
    assert tok.decode(tok.encode("a") + [sep] + tok.encode("b")) == "a<|sep|>b"


def test_bert_folder_uses_sep_as_eot(tmp_path: Path) -> None:
    vocab = DATA / "tokenizers" / "bert-base-uncased" / "vocab.txt"
    if not vocab.is_file():
        pytest.skip(f"BERT vocabulary not found at {vocab} (shared data folder absent)")
    (tmp_path / "vocab.txt").write_bytes(vocab.read_bytes())  # a temp folder, not the repo
    (tmp_path / "tokenizer_config.json").write_text('{"tokenizer_class": "BertTokenizer", "do_lower_case": true}')
    tok = load_tokenizer(str(tmp_path))
    assert tok.eot_id == 102 and tok.vocab_size == 30522
    assert tok.encode("Hello world") == [7592, 2088]  # no [CLS]/[SEP] added
    assert 102 not in tok.encode("a [SEP] b")


def test_gpt2_hub_offline_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    import tiktoken

    def offline(name: str) -> None:
        raise ConnectionError("Name or service not known")

    monkeypatch.setattr(tiktoken, "get_encoding", offline)
    with pytest.raises(UserError, match="gpt2:DIR"):
        load_tokenizer("gpt2")


@pytest.mark.parametrize("spec", ["", "nope:xyz", "./no/such/tokenizer", "gpt2:/no/such/dir"])
def test_bad_specs_are_user_errors(spec: str) -> None:
    with pytest.raises(UserError, match="accepted tokenizer specs"):
        load_tokenizer(spec)


def test_folder_without_tokenizer_files(tmp_path: Path) -> None:
    (tmp_path / "notes.txt").write_text("hi")
    with pytest.raises(UserError, match="neither vocab.json"):
        load_tokenizer(str(tmp_path))
    with pytest.raises(UserError, match="not a .tiktoken"):
        load_tokenizer(str(tmp_path / "notes.txt"))
