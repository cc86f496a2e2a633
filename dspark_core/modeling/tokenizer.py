"""A thin wrapper over a `tokenizers` tokenizer.json: encode, decode, EOS."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dspark_core.errors import DSparkError

EOS_TOKEN = "<|endoftext|>"  # the end-of-text token of the reference tokenizer


@dataclass
class Tokenizer:
    """Encode / decode with the checkpoint's tokenizer.json (no special tokens added on encode)."""

    tok: Any  # tokenizers.Tokenizer
    eos_ids: list[int]  # token ids that end a generation

    @classmethod
    def load(cls, folder: str | Path, eos_ids: list[int] | None = None) -> Tokenizer:
        """Read `folder/tokenizer.json` (or a tokenizer.json path)."""
        from tokenizers import Tokenizer as HFTokenizer

        p = Path(folder)
        if not p.exists() and not str(folder).endswith(".json"):
            from dspark_core.modeling.checkpoint import checkpoint_folder

            p = checkpoint_folder(folder)  # a cached Hugging Face model id
        if p.is_dir():
            from dspark_core.modeling.weights import inside

            p = inside(p, p / "tokenizer.json")  # a link out of the checkpoint folder is refused, not followed
        if not p.is_file():
            raise DSparkError(f"no tokenizer.json at {p}; copy the checkpoint's tokenizer or set model.tokenizer")
        try:
            tok = HFTokenizer.from_file(str(p))
        except Exception as e:  # noqa: BLE001 - the tokenizers library raises plain Exception for a bad file
            reason = " ".join(str(e).split())[:120]
            raise DSparkError(f"{p} is not a tokenizer.json the tokenizers library reads ({reason}); copy the "
                              "checkpoint's tokenizer.json") from None
        if not eos_ids:
            eid = tok.token_to_id(EOS_TOKEN)
            eos_ids = [eid] if eid is not None else []
        return cls(tok=tok, eos_ids=list(eos_ids))

    @property
    def vocab_size(self) -> int:
        """Number of tokens including specials."""
        return int(self.tok.get_vocab_size())

    def encode(self, text: str) -> list[int]:
        """Text -> token ids."""
        return list(self.tok.encode(text, add_special_tokens=False).ids)

    def decode(self, ids: list[int]) -> str:
        """Token ids -> text (specials dropped)."""
        return str(self.tok.decode(ids, skip_special_tokens=True))
