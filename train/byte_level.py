"""GPT-2's byte-level BPE alphabet (HF `ByteLevel`): the printable character
that stands for each byte in a byte-level tokenizer's vocabulary. Standard
library only; used by data.py and scripts/gen_tokenizer_fuzz_seeds.py."""


def byte_chars():
    """The character of each byte: byte_chars()[b] stands for byte b."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("\u00a1"), ord("\u00ac") + 1)) + \
        list(range(ord("\u00ae"), ord("\u00ff") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return [chr(c) for _, c in sorted(zip(bs, cs))]
