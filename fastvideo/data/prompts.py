"""Read a prompts file: one prompt per line, cleaned the way the RL preprocessing expects.

Cleaning: strip each line, skip blank lines, drop lines holding CJK characters (DanceGRPO drops
Chinese prompts because FLUX's T5 and CLIP tokenizers are English-only; we drop a slightly wider
set: CJK ideographs with their extensions, Japanese kana and Hangul, which those tokenizers map to
<unk> just the same). The index of a prompt in the cleaned list is its id everywhere downstream
(file names ``{idx}.pt``, dataset index, sampler index).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from fastvideo.errors import UserError

# U+3040-30FF kana, U+3400-4DBF ext. A, U+4E00-9FFF unified (upstream's range), U+AC00-D7AF Hangul
# syllables, U+1100-11FF Hangul jamo, U+F900-FAFF compatibility ideographs, U+20000-2FA1F ext. B+.
CJK_PATTERN = re.compile(
    "[\u1100-\u11ff\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uac00-\ud7af\uf900-\ufaff"
    "\U00020000-\U0002fa1f]"
)

PROMPT_FILE_HINT = ("pass a UTF-8 text file with one English prompt per line (for example assets/prompts.txt), or a "
                    '.jsonl file of {"prompt": ..., "image": ...} records')


class PromptFileError(UserError, ValueError):
    """A prompts file is missing, unreadable, not UTF-8 or holds no usable prompt."""


@dataclass(frozen=True)
class PromptList:
    """The cleaned prompts of one file and what cleaning removed."""

    path: Path
    prompts: list[str]
    num_lines: int
    num_blank: int
    num_cjk_dropped: int
    spare: list[str]  # usable prompts beyond max_prompts, in file order
    # Source images of an editing prompt file (a JSONL file, fastvideo.data.sources), one per prompt
    # and one per spare prompt; None for a text-to-image file.
    images: list[Path] | None = None
    spare_images: list[Path] | None = None

    @property
    def num_capped(self) -> int:
        return len(self.spare)

    def summary(self) -> str:
        parts = [f"{len(self.prompts)} prompts from {str(self.path)!r}"]
        if self.num_cjk_dropped:
            parts.append(f"dropped {self.num_cjk_dropped} with CJK characters")
        if self.num_blank:
            parts.append(f"skipped {self.num_blank} blank lines")
        if self.num_capped:
            parts.append(f"left out {self.num_capped} beyond --max_prompts")
        return parts[0] + (f" ({', '.join(parts[1:])})" if len(parts) > 1 else "")


def contains_cjk(text: str) -> bool:
    return CJK_PATTERN.search(text) is not None


def clean_prompt_lines(lines: list[str]) -> tuple[list[str], int, int]:
    """Strip, skip blanks, drop CJK lines. Returns (prompts, num_blank, num_cjk_dropped)."""
    prompts, blank, cjk = [], 0, 0
    for line in lines:
        text = line.strip()
        if not text:
            blank += 1
        elif contains_cjk(text):
            cjk += 1
        else:
            prompts.append(text)
    return prompts, blank, cjk


def _read_utf8(path: Path) -> str:
    if not path.exists():
        raise PromptFileError(f"prompt file {str(path)!r} does not exist: {PROMPT_FILE_HINT}")
    if path.is_dir():
        raise PromptFileError(f"prompt file {str(path)!r} is a directory, not a file: {PROMPT_FILE_HINT}")
    data = path.read_bytes()
    try:
        # utf-8-sig: a byte-order mark some editors write is not part of the first prompt.
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = data[: exc.start].count(b"\n") + 1
        raise PromptFileError(
            f"prompt file {str(path)!r} is not UTF-8 (byte 0x{data[exc.start]:02x} on line {line}): "
            f"re-save it as UTF-8, e.g. `iconv -f latin1 -t utf-8 {path} > prompts_utf8.txt`"
        ) from None


# The longest line a prompt file may have: the text encoders keep --max_sequence_length tokens (512 at
# most here, about 2,000 characters of English), so longer text is never read; a 21 MB line made
# tokenization grow past 3 GB before anything was refused.
MAX_LINE_CHARS = 65536


def _check_line_lengths(path: Path, lines: list[str]) -> None:
    for number, line in enumerate(lines, 1):
        if len(line) > MAX_LINE_CHARS:
            raise PromptFileError(f"prompt file {str(path)!r} line {number} is {len(line)} characters long, over the "
                                  f"{MAX_LINE_CHARS} a prompt line may have (the text encoders read about 2,000): "
                                  "shorten it")


def load_prompts(path: str | Path, max_prompts: int | None = None) -> PromptList:
    """Read and clean a prompts file, keeping at most ``max_prompts`` (the first ones).

    Raises PromptFileError naming the file and the fix when it is missing, not UTF-8, or holds no
    prompt after cleaning (empty, only blank lines, only CJK lines).
    """
    if max_prompts is not None and max_prompts < 1:
        raise PromptFileError(f"max_prompts must be at least 1, got {max_prompts}")
    path = Path(path)
    text = _read_utf8(path)
    lines = text.splitlines()
    _check_line_lengths(path, lines)
    images: list | None = None
    if _is_jsonl(path):  # {"prompt": ..., "image": ...} records (fastvideo.data.sources)
        prompts, images, blank, cjk = _clean_jsonl(path, text)
    else:
        prompts, blank, cjk = clean_prompt_lines(lines)
    if not prompts:
        why = f"{len(lines)} lines: {blank} blank, {cjk} dropped for CJK characters"
        raise PromptFileError(f"prompt file {str(path)!r} has no usable prompt ({why}): {PROMPT_FILE_HINT}")
    spare: list[str] = []
    spare_images = [] if images is not None else None
    if max_prompts is not None and len(prompts) > max_prompts:
        prompts, spare = prompts[:max_prompts], prompts[max_prompts:]
        if images is not None:
            images, spare_images = images[:max_prompts], images[max_prompts:]
    return PromptList(path, prompts, len(lines), blank, cjk, spare, images, spare_images)


def _is_jsonl(path: Path) -> bool:
    return path.suffix.lower() == ".jsonl"


def _clean_jsonl(path: Path, text: str) -> tuple[list[str], list[Path] | None, int, int]:
    """A JSONL prompt file's records cleaned as lines are (a record whose prompt is blank or CJK is
    dropped with its image): (prompts, their images or None, blank, cjk dropped)."""
    from fastvideo.data.sources import parse_jsonl

    records, blank = parse_jsonl(path, text)
    kept = [(p.strip(), im) for p, im in records if p.strip() and not contains_cjk(p)]
    cjk = sum(1 for p, _ in records if p.strip() and contains_cjk(p))
    blank += sum(1 for p, _ in records if not p.strip())
    images = [im for _, im in kept] if kept and kept[0][1] is not None else None
    return [p for p, _ in kept], images, blank, cjk


# ---------------------------------------------------------------- held-out evaluation prompts
class EvalPromptError(UserError, ValueError):
    """The evaluation prompt set cannot be used as asked."""


def _normalise(caption: str) -> str:
    return " ".join(caption.split()).casefold()


def check_no_overlap(eval_captions: list[str], train_captions: list[str]) -> None:
    """Refuse evaluation prompts that also appear in the training set (whitespace and case
    ignored): a held-out score measured on trained prompts says nothing about generalisation."""
    train = {_normalise(c) for c in train_captions}
    shared = [c for c in eval_captions if _normalise(c) in train]
    if shared:
        shown = "; ".join(repr(c) for c in shared[:3])
        raise EvalPromptError(
            f"{len(shared)} of {len(eval_captions)} evaluation prompts are also training prompts ({shown}"
            f"{' ...' if len(shared) > 3 else ''}); remove them from --eval_prompts (held-out prompts only)"
        )
    dupes = len(eval_captions) - len({_normalise(c) for c in eval_captions})
    if dupes:
        raise EvalPromptError(f"--eval_prompts holds {dupes} duplicate prompt(s); each prompt must appear once")


def eval_captions(path: str | Path) -> list[str]:
    """The captions of an --eval_prompts file, read without encoding them (a start-up check)."""
    path = Path(path)
    if not path.is_file():
        raise EvalPromptError(f"--eval_prompts {str(path)!r} does not exist; pass a prompts .txt file "
                              "(e.g. assets/eval_prompts.txt) or a preprocessed videos2caption.json")
    if path.suffix == ".json":
        import json

        return [e.get("caption", "") for e in json.loads(path.read_text(encoding="utf-8"))]
    return load_prompts(path).prompts
