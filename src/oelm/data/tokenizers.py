"""Tokenizers behind one small interface: byte, GPT-2 BPE (tiktoken or local files), HF folders."""

from __future__ import annotations

import base64
import os
import re
import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tiktoken_ext.openai_public import r50k_pat_str

from oelm.utils.errors import UserError
from oelm.utils.hub import require_hub

EOT_TEXT = "<|endoftext|>"

ACCEPTED_SPECS = (
    "accepted tokenizer specs: 'byte' (256 bytes + end-of-text, vocab 257); "
    "'gpt2' (GPT-2 BPE downloaded by tiktoken, needs internet); "
    "'gpt2:DIR' or DIR (a folder with vocab.json + merges.txt, or with one *.tiktoken file); "
    "PATH.tiktoken (a tiktoken rank file, GPT-2 split pattern); "
    "a Hugging Face tokenizer folder (tokenizer.json or tokenizer_config.json); "
    "a Hugging Face hub name such as 'bert-base-uncased' or 'owner/name'"
)

# A hub repo id: `name` or `owner/name`, no path-like prefix.
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*(/[\w.-]+)?$")


class Tokenizer:
    """Common interface; backends implement `_encode_batch` and `_decode`."""

    def __init__(self, name: str, spec: str, base_vocab_size: int, eot_id: int) -> None:
        self.name = name
        self.spec = spec
        self.eot_id = eot_id
        self._base_vocab_size = base_vocab_size
        # ids decoded verbatim; added special tokens live only here so that the backend
        # can never produce them from plain text.
        self._verbatim: dict[int, str] = {}
        self._added: dict[str, int] = {}

    @property
    def vocab_size(self) -> int:
        """Number of ids, added special tokens included."""
        return self._base_vocab_size + len(self._added)

    def encode(self, text: str) -> list[int]:
        """Encode one text as ordinary text (no special tokens are recognised)."""
        return self.encode_batch([text])[0]

    def encode_batch(self, texts: Sequence[str], num_threads: int | None = None) -> list[list[int]]:
        """Encode many texts at once, in parallel where the backend supports it."""
        return self._encode_batch(list(texts), num_threads or os.cpu_count() or 1)

    def decode(self, ids: Sequence[int]) -> str:
        """Decode ids back to text; special ids become their token strings."""
        parts: list[str] = []
        run: list[int] = []
        for i in (int(x) for x in ids):
            if i in self._verbatim:
                if run:
                    parts.append(self._decode(run))
                    run = []
                parts.append(self._verbatim[i])
            else:
                run.append(i)
        if run:
            parts.append(self._decode(run))
        return "".join(parts)

    def add_special_token(self, token: str) -> int:
        """Append a special token at the end of the vocabulary and return its id (idempotent)."""
        if token in self._added:
            return self._added[token]
        new_id = self.vocab_size
        self._added[token] = new_id
        self._verbatim[new_id] = token
        return new_id

    def _encode_batch(self, texts: list[str], num_threads: int) -> list[list[int]]:
        raise NotImplementedError

    def _decode(self, ids: list[int]) -> str:
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"{type(self).__name__}(spec={self.spec!r}, vocab_size={self.vocab_size}, eot_id={self.eot_id})"


class ByteTokenizer(Tokenizer):
    """UTF-8 bytes as ids 0..255, end-of-text 256."""

    def __init__(self, spec: str = "byte") -> None:
        super().__init__("byte", spec, base_vocab_size=257, eot_id=256)
        self._verbatim[256] = EOT_TEXT

    def _encode_batch(self, texts: list[str], num_threads: int) -> list[list[int]]:
        return [list(t.encode("utf-8")) for t in texts]

    def _decode(self, ids: list[int]) -> str:
        return bytes(ids).decode("utf-8", errors="replace")


class TiktokenTokenizer(Tokenizer):
    """A tiktoken Encoding; plain text is encoded with `encode_ordinary`."""

    def __init__(self, encoding: Any, spec: str, name: str = "gpt2") -> None:
        super().__init__(name, spec, base_vocab_size=encoding.n_vocab, eot_id=encoding.eot_token)
        self._enc = encoding

    def _encode_batch(self, texts: list[str], num_threads: int) -> list[list[int]]:
        return self._enc.encode_ordinary_batch(texts, num_threads=num_threads)

    def _decode(self, ids: list[int]) -> str:
        return self._enc.decode(ids)


class HFTokenizer(Tokenizer):
    """A Hugging Face `tokenizers.Tokenizer` (also the backend of a fast AutoTokenizer)."""

    def __init__(self, backend: Any, spec: str, name: str, eot_id: int) -> None:
        from tokenizers import Tokenizer as RustTokenizer  # heavy optional dependency: imported on use

        # Work on a private copy: encode special-token strings as ordinary text, and never
        # truncate or pad (a tokenizer.json may carry those settings).
        backend = RustTokenizer.from_str(backend.to_str())
        backend.encode_special_tokens = True
        backend.no_truncation()
        backend.no_padding()
        super().__init__(name, spec, base_vocab_size=backend.get_vocab_size(with_added_tokens=True), eot_id=eot_id)
        self._backend = backend

    def _encode_batch(self, texts: list[str], num_threads: int) -> list[list[int]]:
        # The Rust backend parallelises the batch over all cores itself.
        encodings = self._backend.encode_batch_fast(texts, add_special_tokens=False)
        return [e.ids for e in encodings]

    def _decode(self, ids: list[int]) -> str:
        return self._backend.decode(ids, skip_special_tokens=False)


def load_tokenizer(spec: str) -> Tokenizer:
    """Load a tokenizer from a spec string (see ACCEPTED_SPECS); the spec is kept to reload it."""
    if not isinstance(spec, str) or not spec.strip():
        raise UserError(f"empty tokenizer spec; {ACCEPTED_SPECS}")
    if spec == "byte":
        return ByteTokenizer()
    if spec == "gpt2":
        return _gpt2_from_hub()
    if spec.startswith("gpt2:"):
        return _gpt2_from_files(Path(spec[len("gpt2:") :]).expanduser(), spec)
    path = Path(spec).expanduser()
    if path.exists():
        return _from_local_path(path, spec)
    if ":" not in spec and _HUB_ID.match(spec) and not spec.startswith("."):
        return _from_hub_name(spec)
    raise UserError(f"unknown tokenizer spec {spec!r} (not a known name and no such path); {ACCEPTED_SPECS}")


def _from_local_path(path: Path, spec: str) -> Tokenizer:
    """A local folder or file: HF tokenizer folder, GPT-2 vocab/merges folder or .tiktoken file."""
    if path.is_dir() and any((path / f).is_file() for f in ("tokenizer.json", "tokenizer_config.json")):
        return _from_auto_tokenizer(str(path), spec)
    if path.is_dir() or path.suffix == ".tiktoken":
        return _gpt2_from_files(path, spec)
    raise UserError(f"tokenizer path {spec!r} is a file but not a .tiktoken rank file; {ACCEPTED_SPECS}")


def _gpt2_from_hub() -> Tokenizer:
    """GPT-2 BPE through tiktoken, which downloads (and caches) OpenAI's files."""
    import tiktoken  # heavy optional dependency: imported on use

    try:
        encoding = tiktoken.get_encoding("gpt2")
    except Exception as err:  # network errors come in many types (requests, OSError, ...)
        raise UserError(
            f"could not get the GPT-2 BPE files through tiktoken (offline?): {type(err).__name__}: {err}. "
            "Use local files instead: --tokenizer gpt2:DIR (DIR holding vocab.json + merges.txt, "
            "or gpt2.tiktoken) or --tokenizer PATH/gpt2.tiktoken"
        ) from None
    return TiktokenTokenizer(encoding, spec="gpt2")


def _gpt2_from_files(path: Path, spec: str) -> Tokenizer:
    """GPT-2 BPE from vocab.json + merges.txt (HF tokenizers) or from a .tiktoken file."""
    if path.is_file() and path.suffix == ".tiktoken":
        return _tiktoken_from_file(path, spec)
    if not path.is_dir():
        raise UserError(f"GPT-2 tokenizer files not found at {str(path)!r}; {ACCEPTED_SPECS}")
    if (path / "vocab.json").is_file() and (path / "merges.txt").is_file():
        return _bpe_from_vocab_merges(path, spec)
    rank_files = sorted(path.glob("*.tiktoken"))
    if len(rank_files) == 1:
        return _tiktoken_from_file(rank_files[0], spec)
    raise UserError(
        f"folder {str(path)!r} holds neither vocab.json + merges.txt nor exactly one *.tiktoken file; {ACCEPTED_SPECS}"
    )


def _bpe_from_vocab_merges(folder: Path, spec: str) -> Tokenizer:
    """Byte-level BPE with GPT-2 semantics (no prefix space, GPT-2 split regex)."""
    from tokenizers import Tokenizer as RustTokenizer  # heavy optional dependency: imported on use
    from tokenizers import decoders, models, pre_tokenizers  # heavy optional dependency: imported on use

    try:
        backend = RustTokenizer(models.BPE.from_file(str(folder / "vocab.json"), str(folder / "merges.txt")))
    except Exception as err:
        raise UserError(f"could not read GPT-2 vocab.json/merges.txt in {str(folder)!r}: {err}") from None
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    eot_id = backend.token_to_id(EOT_TEXT)
    if eot_id is None:
        raise UserError(f"{str(folder / 'vocab.json')!r} has no {EOT_TEXT!r} entry; it is not a GPT-2 vocabulary")
    return HFTokenizer(backend, spec=spec, name="gpt2", eot_id=eot_id)


def _tiktoken_from_file(path: Path, spec: str) -> Tokenizer:
    """A tiktoken Encoding from a local rank file, GPT-2 split pattern, EOT after the last rank."""
    import tiktoken  # heavy optional dependency: imported on use

    ranks = _read_tiktoken_ranks(path)
    eot_id = max(ranks.values()) + 1
    encoding = tiktoken.Encoding(
        name=f"oelm-{path.stem}",
        pat_str=r50k_pat_str,
        mergeable_ranks=ranks,
        special_tokens={EOT_TEXT: eot_id},
        explicit_n_vocab=eot_id + 1,
    )
    return TiktokenTokenizer(encoding, spec=spec, name="gpt2" if eot_id == 50256 else path.stem)


def _read_tiktoken_ranks(path: Path) -> dict[bytes, int]:
    """Parse `base64(token) rank` lines."""
    # Not tiktoken.load.load_tiktoken_bpe: it caches by path string in a temp folder, so an
    # edited or replaced local file would silently load stale ranks.
    ranks: dict[bytes, int] = {}
    for n, line in enumerate(path.read_bytes().splitlines(), start=1):
        if not line.strip():
            continue
        try:
            token, rank = line.split()
            ranks[base64.b64decode(token)] = int(rank)
        except ValueError:
            raise UserError(f"{str(path)!r} line {n} is not 'base64token rank'; is it a .tiktoken file?") from None
    if not ranks:
        raise UserError(f"tiktoken rank file {str(path)!r} is empty")
    return ranks


def _from_hub_name(name: str) -> Tokenizer:
    """A Hugging Face hub tokenizer (cached or downloaded)."""

    require_hub(name, "model", "pass a local tokenizer folder (with tokenizer.json) or --tokenizer byte")
    try:
        return _from_auto_tokenizer(name, name)
    except UserError as err:
        raise UserError(f"{err}; {ACCEPTED_SPECS}") from None


def _from_auto_tokenizer(name_or_path: str, spec: str) -> Tokenizer:
    """Wrap transformers.AutoTokenizer; end-of-text is the eos token, else the sep token."""
    from transformers import AutoTokenizer  # heavy optional dependency: imported on use

    try:
        hf = AutoTokenizer.from_pretrained(name_or_path)
    except Exception as err:  # hub/network/format errors have many types
        raise UserError(
            f"could not load Hugging Face tokenizer {name_or_path!r} (offline, or not a tokenizer?): "
            f"{type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}"
        ) from None
    eot_id = hf.eos_token_id if hf.eos_token_id is not None else hf.sep_token_id
    if eot_id is None:
        raise UserError(f"tokenizer {name_or_path!r} has neither an eos nor a sep token to end documents with")
    backend = getattr(hf, "backend_tokenizer", None)
    if backend is None:
        raise UserError(f"tokenizer {name_or_path!r} has no fast (Rust) backend; save it with tokenizer.json")
    name = Path(name_or_path).name or name_or_path
    return HFTokenizer(backend, spec=spec, name=name, eot_id=int(eot_id))


# Files that make up a local tokenizer (a GPT-2 files folder or a Hugging Face tokenizer folder).
TOKENIZER_FILES = (
    "vocab.json",
    "merges.txt",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "vocab.txt",
    "spiece.model",
    "sentencepiece.bpe.model",
)


def copy_local_tokenizer(spec: str, dest: Path) -> bool:
    """Copy the files of a tokenizer given by a local path into `dest`; False for names and 'byte'.

    A run keeps its own copy so that it can be sampled and exported on another machine, where
    the original absolute path does not exist.
    """
    if spec in ("byte", "gpt2"):
        return False
    raw = spec[len("gpt2:") :] if spec.startswith("gpt2:") else spec
    path = Path(raw).expanduser()
    if not path.exists():
        return False  # a hub name: portable as it is
    files = [path] if path.is_file() else [path / f for f in TOKENIZER_FILES if (path / f).is_file()]
    files += [] if path.is_file() else sorted(path.glob("*.tiktoken"))
    if not files:
        return False
    dest.mkdir(parents=True, exist_ok=True)
    for f in files:
        shutil.copyfile(f, dest / f.name)
    return True


def relocated_spec(spec: str, folder: Path) -> str:
    """The spec of `spec`'s tokenizer read from its copy in `folder` (same kind, new place)."""
    if spec.startswith("gpt2:"):
        return f"gpt2:{folder}"
    raw = Path(spec).expanduser()
    if raw.suffix == ".tiktoken":
        return str(folder / raw.name)
    return str(folder)
