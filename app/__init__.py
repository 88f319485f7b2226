"""The HTTP face of surge: one room per wire protocol, each translating to one generation request.

`chat/` and `completions/` are OpenAI's protocols (`openai/` holds the wire pieces they share);
`generation/` takes a protocol's request through checks, the traffic layers and the engine, and
back as a whole reply or a stream; `tools/`, `response_format.py` and `reasoning.py` are shared by
every protocol that has them. `server/` assembles the app and runs uvicorn, `runtime/` holds what
every route reaches, `ops/` what operators read, `config/` every option. docs/architecture.md
lists every module.
"""
