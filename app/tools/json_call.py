"""One JSON call object, `{"name": "f", "arguments": {...}}`, read a piece at a time.

Every format surge parses writes a call as such an object (Hermes and Mistral name the
arguments `arguments`, Llama 3 `parameters`). The scanner follows the JSON's structure as text
arrives (depth, strings, escapes, the current top-level key) so a stream can announce the call
as soon as its name is complete and pass the arguments' text on as it is written, without
re-parsing the whole reply at every token. Keys may come in either order.

`JsonCallScanner.feed` returns how much of the text belonged to the object; what follows it
(a closing tag, the next call) is the caller's.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

ARGUMENT_KEYS = ("arguments", "parameters")
_WHITESPACE = " \t\r\n"


@dataclass(frozen=True, slots=True)
class Scanned:
    consumed: int  # characters of the fed text that belong to the object
    name: str | None  # set by the feed that completed the name
    arguments: str  # arguments text this feed added


class JsonCallScanner:
    def __init__(self) -> None:
        self.text: list[str] = []  # the object so far
        self.done = False  # its closing brace was read
        self.failed = False  # not a JSON object: the caller keeps the text as content
        self.name: str | None = None
        self.arguments: list[str] = []
        self._depth = 0
        self._in_string = False
        self._escape = False
        # At depth 1: "key" (expecting a key or "}"), "in_key", "colon", "value", "in_value", "comma".
        self._state = "start"
        self._key: list[str] = []
        self._value_key = ""
        self._value: list[str] = []
        self._value_depth = 0  # the depth at which the current top-level value started

    def feed(self, text: str) -> Scanned:
        name: str | None = None
        arguments: list[str] = []
        for i, char in enumerate(text):
            if self.done or self.failed:
                return Scanned(i, name, "".join(arguments))
            self.text.append(char)
            completed_name = self._step(char, arguments)
            if completed_name is not None:
                name = completed_name
        return Scanned(len(text), name, "".join(arguments))

    @property
    def value_complete(self) -> bool:
        """A top-level value was just read and the object is still open (a `,` or `}` is next)."""
        return self._state == "comma"

    @property
    def arguments_text(self) -> str:
        return "".join(self.arguments)

    def result(self) -> tuple[str, str] | None:
        """(name, arguments) of a complete, valid call object; None otherwise."""
        if not self.done or self.failed:
            return None
        try:
            whole = json.loads("".join(self.text))
        except ValueError:
            return None
        if not isinstance(whole, dict) or not isinstance(whole.get("name"), str):
            return None
        return whole["name"], arguments_of(whole, self.arguments_text)

    def _step(self, char: str, arguments: list[str]) -> str | None:
        state = self._state
        if state == "start":
            if char == "{":
                self._depth, self._state = 1, "key"
            elif char not in _WHITESPACE:
                self.failed = True
            return None
        if state == "key":
            if char == '"':
                self._state, self._key = "in_key", []
            elif char == "}":
                self._depth, self.done = 0, True
            elif char not in _WHITESPACE + ",":
                self.failed = True
            return None
        if state == "in_key":
            if self._escape:
                self._escape = False
                self._key.append(char)
            elif char == "\\":
                self._escape = True
                self._key.append(char)
            elif char == '"':
                self._state = "colon"
            else:
                self._key.append(char)
            return None
        if state == "colon":
            if char == ":":
                self._state, self._value_key, self._value = "value", "".join(self._key), []
            elif char not in _WHITESPACE:
                self.failed = True
            return None
        if state == "value":
            if char in _WHITESPACE:
                return None
            self._state = "in_value"
            self._value_depth = self._depth
        if state == "comma":
            if char == ",":
                self._state = "key"
            elif char == "}":
                self._depth, self.done = 0, True
            elif char not in _WHITESPACE:
                self.failed = True
            return None
        return self._in_value(char, arguments)

    def _in_value(self, char: str, arguments: list[str]) -> str | None:
        """A character of a top-level value; the name when this one completed it."""
        ended = False
        if self._in_string:
            if self._escape:
                self._escape = False
            elif char == "\\":
                self._escape = True
            elif char == '"':
                self._in_string = False
                ended = self._depth == self._value_depth
        elif char == '"':
            self._in_string = True
        elif char in "{[":
            self._depth += 1
        elif char in "}]":
            if self._depth == self._value_depth:  # a primitive ended by the object's close
                self._depth, self.done = 0, True
                return self._end_value(primitive=True)
            self._depth -= 1
            ended = self._depth == self._value_depth
        elif char == "," and self._depth == self._value_depth:  # a primitive ended by a comma
            self._state = "key"
            return self._end_value(primitive=True)
        self._value.append(char)
        if self._value_key in ARGUMENT_KEYS:
            self.arguments.append(char)
            arguments.append(char)
        if ended:
            self._state = "comma"
            return self._end_value(primitive=False)
        return None

    def _end_value(self, *, primitive: bool) -> str | None:
        if self._value_key != "name" or self.name is not None:
            return None
        try:
            value = json.loads("".join(self._value).strip())
        except ValueError:
            return None
        if isinstance(value, str):
            self.name = value
            return value
        return None


def arguments_of(call: dict[str, object], raw: str) -> str:
    """A parsed call's arguments as OpenAI's JSON string: the model's own text when it wrote an
    object, the string itself when it wrote a JSON string, "{}" when it wrote none."""
    value = next((call[key] for key in ARGUMENT_KEYS if key in call), None)
    if value is None:
        return "{}"
    if isinstance(value, str):
        return value
    return raw.strip() or json.dumps(value, ensure_ascii=False)
