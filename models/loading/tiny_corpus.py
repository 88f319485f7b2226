"""The text the tiny model's tokenizer is trained on: deterministic pseudo-text, grown in-process.

Prose, code, JSON and many scripts (a seed sample, pseudo-words from syllables, code lines, CJK
runs), from a seeded `random.Random`, so the same arguments give the same lines on every machine
and the tokenizer trained on them (models/loading/tiny.py) is byte-identical.
"""

from __future__ import annotations

import random

CORPUS_SEED = 1234
# Enough distinct words to fill 8192 merges, few enough lines to train in a moment.
CORPUS_LINES = 16_000

# The seed text the corpus is grown from: prose, code, JSON and non-ASCII scripts, so that
# common English words, indentation and multi-byte characters all get merges of their own.
SAMPLE_TEXT = """\
The quick brown fox jumps over the lazy dog. A server streams tokens to many clients at once.
Continuous batching lets new requests join while others are still decoding their answers.
Please summarise the following paragraph in one sentence, and keep the tone friendly.
Once upon a time, in a small village by the sea, there lived an old fisherman and his cat.
What is the capital of France? The capital of France is Paris. How many legs does a spider have?
I think the answer is 42, but let me check the documentation before I commit to it.
Thank you! You're welcome. Could you explain that again, step by step, with an example?
def add(a: int, b: int) -> int:
    return a + b

class Scheduler:
    def __init__(self, max_num_seqs: int = 32) -> None:
        self.waiting: list[Sequence] = []
        self.running: list[Sequence] = []

    def schedule(self) -> list[Sequence]:
        while self.waiting and len(self.running) < self.max_num_seqs:
            self.running.append(self.waiting.pop(0))
        return self.running

for i in range(10):
    if i % 2 == 0:
        print(f"even: {i}")
    else:
        print("odd", i, sep=", ")
{"model": "tiny", "messages": [{"role": "user", "content": "Hello!"}], "stream": true}
{"id": "chatcmpl-123", "object": "chat.completion.chunk", "choices": [{"index": 0, "delta": {}}]}
SELECT name, count(*) FROM users WHERE age >= 18 GROUP BY name ORDER BY 2 DESC;
<html><body><p class="note">Hello, world &amp; friends</p></body></html>
$ curl -s http://localhost:8000/v1/models | jq '.data[0].id'
Le café est très bon à Paris ; l'été dernier, nous sommes allés à la plage près de Nice.
Ça va ? Où est la gare ? Je préfère le thé au café, mais j'adore les crêpes.
Der Bär läuft über die Straße. Schöne Grüße aus München! Die Größe ist übermäßig.
El niño comió una piña en la montaña. ¿Dónde está la biblioteca? ¡Qué día tan bonito!
Português: não, ação, coração. Polski: zażółć gęślą jaźń. Čeština: příliš žluťoučký kůň.
Привет, мир! Как дела? Съешь же ещё этих мягких французских булок, да выпей чаю.
Γειά σου κόσμε. Ἡ γλῶσσα μου ἔδωσαν ἑλληνική. Καλημέρα!
你好，世界！今天天气很好，我们去公园散步吧。机器学习模型正在生成文本。
日本語のテキストです。東京は大きな都市です。ありがとうございます！カタカナもあります。
안녕하세요, 세계! 한국어 문장입니다. 감사합니다.
مرحبا بالعالم. שלום עולם. नमस्ते दुनिया। สวัสดีชาวโลก
Emoji: 😀 😂 🎉 🚀 ❤️ 👍🏽 👨‍👩‍👧‍👦 🇫🇷 ✅ ⚡ 🔥 🤖 — and symbols: € £ ¥ © ® ™ ° ± × ÷ → ← ∞ ≈ ≠ ≤ ≥
Math: ∑_{i=1}^{n} x_i² = ∫₀¹ f(x) dx; α + β = γ; π ≈ 3.14159; √2 ≈ 1.41421.
"""

# Syllable parts for pseudo-words; the empty strings weight "no onset/coda" more heavily.
_ONSETS: tuple[str, ...] = ("", "b", "c", "d", "f", "g", "h", "j", "k", "l", "m", "n", "p", "qu", "r", "s")
_ONSETS += ("t", "v", "w", "z", "br", "ch", "cl", "dr", "fl", "gr", "pl", "pr", "sh", "sk", "sl", "st", "str")
_ONSETS += ("th", "tr")
_VOWELS = ("a", "e", "i", "o", "u", "ai", "ea", "ee", "ie", "oo", "ou", "y", "é", "è", "ä", "ö", "ü", "á")
_CODAS = ("", "", "", "n", "r", "s", "t", "l", "m", "ng", "nd", "st", "ck", "rt", "ss", "x", "sh", "ch")
_EMOJI = ("😀", "😂", "🎉", "🚀", "❤️", "👍", "🤖", "🔥", "✅", "⚡", "🌍", "🍕", "🐍", "🦀", "✨")
_PUNCT = (".", ".", ".", ",", "!", "?", ";", ":", " —", "...")


def _pseudo_word(rng: random.Random) -> str:
    syllables = rng.choice((1, 1, 2, 2, 2, 3, 3, 4))
    word = "".join(rng.choice(_ONSETS) + rng.choice(_VOWELS) + rng.choice(_CODAS) for _ in range(syllables))
    return word.capitalize() if rng.random() < 0.15 else word


def _cjk_run(rng: random.Random, pool: list[str]) -> str:
    # Mostly characters seen in the sample (so they get merges), some fresh ones from the
    # CJK Unified Ideographs block (so rare characters still occur).
    chars = [rng.choice(pool) if rng.random() < 0.8 else chr(rng.randint(0x4E00, 0x9FFF)) for _ in range(12)]
    return "".join(chars[: rng.randint(3, 12)])


def _identifier(rng: random.Random) -> str:
    parts = [_pseudo_word(rng).lower() for _ in range(rng.randint(1, 3))]
    if rng.random() < 0.5:
        return "_".join(parts)
    return parts[0] + "".join(p.capitalize() for p in parts[1:])


def _code_line(rng: random.Random) -> str:
    name, arg, other = _identifier(rng), _identifier(rng), _identifier(rng)
    number = rng.randint(0, 10_000)
    indent = " " * rng.choice((0, 0, 4, 4, 8, 12))
    return indent + rng.choice(
        (
            f"def {name}({arg}: int, {other}: str = {number}) -> None:",
            f"return {arg} + {other} * {number}",
            f"{name} = [{arg}, {other}, {number}]",
            f"if {arg} is not None and {other} >= {number}:",
            f"for {arg} in range({number}):",
            f'{name}["{arg}"] = {rng.random():.4f}',
            f"self.{name} = {arg}.{other}({number})",
            f'{{"{name}": "{arg}", "{other}": {number}}}',
            f"# {name} {arg} {other}",
            f"const {name} = ({arg}) => {arg}.{other} ?? {number};",
        )
    )


def _corpus_line(rng: random.Random, sample_lines: list[str], sample_words: list[str], cjk: list[str]) -> str:
    kind = rng.random()
    if kind < 0.25:
        return rng.choice(sample_lines)
    if kind < 0.45:
        return " ".join(rng.choice(sample_words) for _ in range(rng.randint(4, 16))) + rng.choice(_PUNCT)
    if kind < 0.75:
        words = [_pseudo_word(rng) for _ in range(rng.randint(4, 14))]
        if rng.random() < 0.2:
            words.insert(rng.randrange(len(words)), rng.choice(_EMOJI))
        if rng.random() < 0.2:
            words.insert(rng.randrange(len(words)), str(rng.randint(0, 99_999)))
        return " ".join(words) + rng.choice(_PUNCT)
    if kind < 0.9:
        return _code_line(rng)
    return _cjk_run(rng, cjk) + rng.choice(("。", "，", "！", "？", "、")) + _cjk_run(rng, cjk)


def build_corpus(num_lines: int = CORPUS_LINES, seed: int = CORPUS_SEED) -> list[str]:
    """Deterministic pseudo-text for training the tokenizer: same arguments, same lines."""
    rng = random.Random(seed)
    sample_lines = [line for line in SAMPLE_TEXT.splitlines() if line.strip()]
    sample_words = SAMPLE_TEXT.split()
    cjk = sorted({ch for ch in SAMPLE_TEXT if "\u3040" <= ch <= "\u9fff"})
    return [_corpus_line(rng, sample_lines, sample_words, cjk) for _ in range(num_lines)]
