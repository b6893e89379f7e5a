"""Prompt-file cleaning and its errors (fastvideo.data.prompts)."""

from pathlib import Path

import pytest

from fastvideo.data.prompts import PromptFileError, contains_cjk, load_prompts

ASSETS = Path(__file__).resolve().parents[2] / "assets"


def write(tmp_path, data: bytes | str, name="prompts.txt") -> Path:
    path = tmp_path / name
    path.write_bytes(data if isinstance(data, bytes) else data.encode("utf-8"))
    return path


def test_cleaning_strips_skips_blanks_and_drops_cjk(tmp_path):
    text = (
        "\ufeff  a cat on a mat  \n"  # BOM and padding
        "\n   \n"
        "一只猫坐在垫子上\n"  # Chinese (upstream's range)
        "a dog 狗 in the snow\n"  # mixed: dropped too, like upstream
        "ねこ\n"  # kana
        "고양이\n"  # hangul
        "café crème on a zinc bar\r\n"  # accented Latin stays
        "\tthe end\t\n"
    )
    plist = load_prompts(write(tmp_path, text))
    assert plist.prompts == ["a cat on a mat", "café crème on a zinc bar", "the end"]
    assert (plist.num_blank, plist.num_cjk_dropped, plist.num_capped) == (2, 4, 0)
    assert "dropped 4 with CJK characters" in plist.summary()
    assert "skipped 2 blank lines" in plist.summary()


def test_cjk_detection_covers_upstream_range():
    # DanceGRPO's rule is any character in U+4E00..U+9FFF.
    assert contains_cjk("\u4e00") and contains_cjk("\u9fff") and contains_cjk("x\u4f60y")
    assert not contains_cjk("naïve façade, Ærøskøbing — ok")


def test_max_prompts_caps_after_cleaning(tmp_path):
    path = write(tmp_path, "一\na\n\nb\nc\nd\n")
    plist = load_prompts(path, max_prompts=2)
    assert plist.prompts == ["a", "b"] and plist.spare == ["c", "d"] and plist.num_capped == 2
    assert "left out 2 beyond --max_prompts" in plist.summary()
    assert load_prompts(path, max_prompts=10).prompts == ["a", "b", "c", "d"]


@pytest.mark.parametrize(
    "content, expected",
    [
        (b"", "has no usable prompt (0 lines"),
        (b"\n   \n\t\n", "3 blank"),
        ("只有中文\n还是中文\n".encode("utf-8"), "2 dropped for CJK characters"),
        (b"caf\xe9 au lait\n", "is not UTF-8 (byte 0xe9 on line 1)"),
        (b"ok\nline two\n\xff\xfe\n", "on line 3"),
    ],
    ids=["empty", "blank-only", "only-cjk", "latin1", "bad-byte-line-3"],
)
def test_bad_files_fail_with_file_name_and_fix(tmp_path, content, expected):
    path = write(tmp_path, content)
    with pytest.raises(PromptFileError) as err:
        load_prompts(path)
    msg = str(err.value)
    assert expected in msg and str(path) in msg
    assert ("iconv" in msg) if b"\xe9" in content or b"\xff" in content else ("one English prompt per line" in msg)


def test_missing_file_and_directory(tmp_path):
    with pytest.raises(PromptFileError, match=r"nope\.txt' does not exist: pass a UTF-8 text file"):
        load_prompts(tmp_path / "nope.txt")
    with pytest.raises(PromptFileError, match="is a directory"):
        load_prompts(tmp_path)
    with pytest.raises(PromptFileError, match="max_prompts must be at least 1"):
        load_prompts(write(tmp_path, "a\n"), max_prompts=0)


def test_shipped_prompt_files_are_clean():
    full = load_prompts(ASSETS / "prompts.txt")
    assert len(full.prompts) >= 250
    assert full.num_blank == full.num_cjk_dropped == 0
    assert len(set(full.prompts)) == len(full.prompts), "duplicate prompts"
    tiny = load_prompts(ASSETS / "prompts_tiny.txt")
    assert len(tiny.prompts) == 8 and tiny.num_blank == tiny.num_cjk_dropped == 0
