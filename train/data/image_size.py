"""An image's height and width, read from its header (no decode): a folder whose images all share one size is
written with that fixed shape, so a model takes it as it is, as Keras's image_dataset_from_directory gives
images of one size. No TensorFlow here."""

from __future__ import annotations

# JPEG's start-of-frame markers (baseline, progressive, lossless...): C4, C8 and CC are other segments
_JPEG_FRAMES = frozenset(range(0xC0, 0xD0)) - {0xC4, 0xC8, 0xCC}


def image_size(data: bytes, kind: str) -> tuple[int, int] | None:
    """(height, width) of a JPEG, PNG, GIF or BMP from its header; None where the header does not say."""
    try:
        if kind == "png" and data[12:16] == b"IHDR":
            return int.from_bytes(data[20:24], "big"), int.from_bytes(data[16:20], "big")
        if kind == "gif":  # the logical screen, what a decoded frame fills
            return int.from_bytes(data[8:10], "little"), int.from_bytes(data[6:8], "little")
        if kind == "bmp":  # a negative height: the rows stored top-down
            height = int.from_bytes(data[22:26], "little", signed=True)
            return abs(height), int.from_bytes(data[18:22], "little", signed=True)
        if kind == "jpeg":
            return _jpeg_size(data)
    except (IndexError, ValueError):
        return None
    return None


def _jpeg_size(data: bytes) -> tuple[int, int] | None:
    at = 2  # after SOI
    while at + 9 < len(data):
        if data[at] != 0xFF:
            return None
        marker = data[at + 1]
        if marker == 0xFF:  # a fill byte
            at += 1
            continue
        if marker in _JPEG_FRAMES:
            return int.from_bytes(data[at + 5 : at + 7], "big"), int.from_bytes(data[at + 7 : at + 9], "big")
        if marker == 0xDA:  # start of scan before any frame: not a JPEG we can read
            return None
        at += 2 + int.from_bytes(data[at + 2 : at + 4], "big")
    return None
