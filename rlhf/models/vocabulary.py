"""Whether two models' tokenizers give every token id the same meaning (a teacher and its student).

A teacher scores the token ids the student sampled: where an id means another token to the teacher, its
log-prob is the probability of something the student never wrote, and distillation trains toward noise
without any error. So a teacher is compared with its student before either model loads, from the tokenizer
files alone (cross-tokenizer distillation is not supported).
"""

from __future__ import annotations

from transformers import AutoTokenizer, PreTrainedTokenizerBase

from rlhf.models.loading import resolve_model_path

__all__ = ["VocabularyMismatch", "check_same_vocabulary", "vocabulary_differences"]


class VocabularyMismatch(ValueError):
    """Two tokenizers map some token id to different tokens (or have different sizes)."""


def _tokens(tokenizer: PreTrainedTokenizerBase) -> list[str | None]:
    """id -> token string, added (special) tokens included."""
    return tokenizer.convert_ids_to_tokens(list(range(len(tokenizer))))


def vocabulary_differences(a: PreTrainedTokenizerBase, b: PreTrainedTokenizerBase,
                           limit: int = 3) -> list[tuple[int, str | None, str | None]]:
    """The first `limit` ids where `a` and `b` name different tokens, as (id, a's token, b's token); an id only
    one of them has gives None for the other. Empty when the vocabularies are the same."""
    ta, tb = _tokens(a), _tokens(b)
    out = []
    for i in range(max(len(ta), len(tb))):
        x, y = ta[i] if i < len(ta) else None, tb[i] if i < len(tb) else None
        if x != y:
            out.append((i, x, y))
            if len(out) == limit:
                break
    return out


def check_same_vocabulary(student: str, teacher: str) -> None:
    """Raise VocabularyMismatch naming the first differing tokens when the teacher's tokenizer differs from the
    student's. Reads the tokenizer files only (no weights)."""
    a = AutoTokenizer.from_pretrained(resolve_model_path(student))
    b = AutoTokenizer.from_pretrained(resolve_model_path(teacher))
    differences = vocabulary_differences(a, b)
    if not differences:
        return
    listed = "; ".join(f"id {i}: student {x!r}, teacher {y!r}" for i, x, y in differences)
    raise VocabularyMismatch(
        f"the teacher's tokenizer ({teacher}) is not the student's ({student}): token ids mean different tokens "
        f"({len(a)} vs {len(b)} tokens; first differences: {listed}), so the teacher would score tokens the student "
        "never sampled. Use a teacher with the student's tokenizer (the same model family), e.g. a larger or "
        "RL-trained model of the student's family; cross-tokenizer distillation is not supported."
    )
