"""Whether an image file is whole, told from its structure without decoding it (train.data.written asks it of every
image it writes): a file cut short (a copy or download that stopped) would otherwise be found only when a batch
reaches it, mid-training.

JPEG: the end marker (FFD9) after the first scan; PNG: the IEND chunk; GIF: the trailer (0x3B); BMP: the size
its header gives. Bytes after the end (padding, a camera's trailer, a motion photo's video) are allowed, as the
decoders allow them. No TensorFlow, no PIL: a few byte searches from the file's end, so that checking costs next
to nothing beside reading the file.
"""

from __future__ import annotations

JPEG_END = b"\xff\xd9"
JPEG_SCAN = 0xDA
PNG_END = b"IEND\xaeB`\x82"  # the IEND chunk's type and its CRC (its length, 0, before them)
GIF_END = 0x3B
PADDING = b"\x00\r\n "  # what writers leave after a GIF's trailer
TAIL = 64 << 10  # a GIF's trailer is looked for this far from the end, past padding


def damage(data: bytes, kind: str) -> str | None:
    """What is wrong with the image `data` of `kind` (jpeg, png, gif, bmp), in a few words; None where it is whole."""
    return {"jpeg": _jpeg, "png": _png, "gif": _gif, "bmp": _bmp}[kind](data)


def _jpeg(data: bytes) -> str | None:
    """The segments are walked to the first scan (an EXIF thumbnail before it holds an end marker of its own); the
    end marker must follow it. A scan's data cannot hold FF D9 (an FF in it is followed by 00 or a restart marker)."""
    scan = _first_scan(data)
    if scan is None:
        return "cut short: it ends before its image data"
    if data.rfind(JPEG_END, scan) < 0:
        return "cut short: no JPEG end marker (FF D9)"
    return None


def _first_scan(data: bytes) -> int | None:
    """Where the first scan's data begins, None where the file ends first."""
    position = 2  # after SOI
    while position + 4 <= len(data):
        if data[position] != 0xFF:  # not where a marker should be: looked for, as a lenient decoder does
            found = data.find(b"\xff\xda", position)
            return None if found < 0 else found + 2
        marker = data[position + 1]
        if marker == 0xFF:  # fill bytes before a marker
            position += 1
        elif marker == 0xD8 or 0xD0 <= marker <= 0xD7 or marker == 0x01:  # markers without a length
            position += 2
        elif marker == 0xD9:  # the end before any scan
            return None
        else:
            end = position + 2 + int.from_bytes(data[position + 2 : position + 4], "big")
            if marker == JPEG_SCAN:
                return end if end <= len(data) else None
            position = end
    return None


def _png(data: bytes) -> str | None:
    return None if data.rfind(PNG_END) >= 8 else "cut short: no PNG IEND chunk"


def _gif(data: bytes) -> str | None:
    end = len(data)
    while end > max(6, len(data) - TAIL) and data[end - 1] in PADDING:
        end -= 1
    return None if end > 6 and data[end - 1] == GIF_END else "cut short: no GIF trailer (3B)"


def _bmp(data: bytes) -> str | None:
    """The file's size in its header (some writers leave 0 there: then the pixel array's own size), against the
    bytes there are."""
    if len(data) < 26:
        return "cut short: its header is incomplete"
    declared = int.from_bytes(data[2:6], "little")
    if declared < 26:  # not given: the pixel array of an uncompressed bitmap (BI_RGB) after its offset
        declared = _bmp_pixels_end(data)
    if declared > len(data):
        return f"cut short: {len(data):,} of its {declared:,} bytes"
    return None


def _bmp_pixels_end(data: bytes) -> int:
    offset, header = int.from_bytes(data[10:14], "little"), int.from_bytes(data[14:18], "little")
    if header < 40 or len(data) < 34:  # an OS/2 header, or too short to say: only the offset is known
        return offset
    width = abs(int.from_bytes(data[18:22], "little", signed=True))
    height = abs(int.from_bytes(data[22:26], "little", signed=True))
    bits, compression = int.from_bytes(data[28:30], "little"), int.from_bytes(data[30:34], "little")
    if compression != 0:
        return offset
    return offset + (width * bits + 31) // 32 * 4 * height
