"""Where the prompts the target answers come from (docs/distill.md §9): the user's files
(`--prompts`, JSONL or text), the shipped requests, requests made from local text (the
standard library's docstrings, `--data` files), and, for a chat model, its own questions
(Magpie: given only its template's opening of a user turn, it writes a user's request).

A prompt is `Prompt(source, body)`: body a text or a list of chat messages. `encode` renders it
as the runtime would (the chat template with the generation prompt where the target has one).
"""
from __future__ import annotations

import hashlib
import json
import random
from dataclasses import dataclass
from importlib.resources import files
from pathlib import Path
from typing import Any

from ssd_runtime.errors import ConfigError

SHIPPED = "shipped"          # ssd_distill/data/prompts.jsonl: 750 chat and code requests
HELDOUT = "heldout"          # ssd_distill/data/heldout.jsonl: written apart, never trained on
DOCSTRINGS = "docstrings"    # requests about passages of the standard library's docstrings
SELF = "self"                # the chat model's own questions (Magpie)
TEXT = "text"                # requests about passages of the --data files

# what a request made from a passage asks (a chat model); a base model continues the passage
TEXT_TASKS = ("Explain this in simple terms:\n\n{}",
              "Summarize the following in a few sentences:\n\n{}",
              "What is this describing? Give a short example of its use.\n\n{}",
              "Rewrite this more clearly:\n\n{}",
              "Write three questions a reader might ask about this text, and answer them:\n\n{}",
              "List the key points of this text:\n\n{}")
PASSAGE_CHARS = (200, 900)   # a passage's length: long enough to say something, short to answer
_MARK = "\x00SSD-MARK\x00"   # stands for the user's words while a template's opening is cut


@dataclass(frozen=True)
class Prompt:
    source: str                  # SHIPPED, HELDOUT, DOCSTRINGS, SELF, TEXT or "file:NAME"
    body: Any                    # text, or a list of {"role", "content"} messages


def read_prompt_file(path: Path, source: str | None = None) -> list[Prompt]:
    """Prompts from a file: JSONL of {"prompt": text} or {"messages": [...]} lines, or plain
    text, one prompt a line (a file whose first line is not a JSON object). Blank lines are
    skipped; an empty or unreadable file is refused by name."""
    name = source or f"file:{path.name}"
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"--prompts {path}: cannot read it ({exc.__class__.__name__}: {exc})."
                          f" ---> HINT: give a UTF-8 file: JSONL, one {{\"prompt\": ...}} or "
                          f"{{\"messages\": [...]}} object a line, or plain text, one prompt "
                          f"a line.") from None
    lines = [(n, line) for n, line in enumerate(text.splitlines(), 1) if line.strip()]
    if not lines:
        raise ConfigError(f"--prompts {path} holds no prompts (it is empty or blank). ---> "
                          f"HINT: one prompt a line (plain text or JSONL), or leave --prompts "
                          f"out for the shipped and locally made ones.")
    if not lines[0][1].lstrip().startswith("{"):
        return [Prompt(name, line.strip()) for _, line in lines]
    prompts = []
    for n, line in lines:
        try:
            item = json.loads(line)
        except json.JSONDecodeError as exc:
            raise ConfigError(f"--prompts {path} line {n} is not JSON ({exc.msg}). ---> HINT: "
                              f"one {{\"prompt\": ...}} or {{\"messages\": [...]}} a line, or "
                              f"plain text with no line starting with '{{'.") from None
        if isinstance(item, dict) and isinstance(item.get("prompt"), str):
            prompts.append(Prompt(name, item["prompt"]))
        elif isinstance(item, dict) and isinstance(item.get("messages"), list):
            prompts.append(Prompt(name, item["messages"]))
        else:
            raise ConfigError(f"--prompts {path} line {n} has neither a \"prompt\" string nor a "
                              f"\"messages\" list. ---> HINT: {{\"prompt\": \"Explain ...\"}}.")
    return prompts


def shipped(which: str = SHIPPED) -> list[Prompt]:
    """The shipped requests (SHIPPED, for training) or the held-out set (HELDOUT)."""
    name = "prompts.jsonl" if which == SHIPPED else "heldout.jsonl"
    path = Path(str(files("ssd_distill").joinpath("data", name)))
    return read_prompt_file(path, which)


def passages(texts: list[str]) -> list[str]:
    """Paragraph-aligned passages of PASSAGE_CHARS characters cut from the texts."""
    low, high = PASSAGE_CHARS
    out = []
    for text in texts:
        chunk = ""
        for para in text.split("\n\n"):
            para = para.strip()
            if not para:
                continue
            if len(chunk) + len(para) > high and len(chunk) >= low:
                out.append(chunk)
                chunk = ""
            chunk = f"{chunk}\n\n{para}" if chunk else para[:high]
        if len(chunk) >= low:
            out.append(chunk)
    return out


def text_prompts(texts: list[str], source: str, chat: bool, seed: int) -> list[Prompt]:
    """Requests about passages of local text (a chat model: a task drawn per passage), or the
    passages themselves to continue (a base model)."""
    rng = random.Random(seed)
    items = passages(texts)
    if not chat:
        return [Prompt(source, p) for p in items]
    return [Prompt(source, rng.choice(TEXT_TASKS).format(p)) for p in items]


def docstring_texts() -> list[str]:
    """The docstrings of the standard library's modules, classes and functions, read from its
    source files with `ast` (nothing imported): English prose about code, the same on every
    machine with the same Python, a few thousand passages."""
    import ast
    import sysconfig

    root = Path(sysconfig.get_paths()["stdlib"])
    texts, seen = [], set()
    for path in sorted(root.rglob("*.py")):
        if any(part in ("test", "tests", "idlelib", "site-packages", "lib2to3")
               for part in path.relative_to(root).parts):
            continue
        try:
            tree = ast.parse(path.read_text(encoding="utf-8"))
        except (OSError, SyntaxError, UnicodeDecodeError, ValueError):
            continue
        for node in ast.walk(tree):
            if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef,
                                 ast.AsyncFunctionDef)):
                doc = ast.get_docstring(node)
                if doc and len(doc) > PASSAGE_CHARS[0] and doc not in seen:
                    seen.add(doc)
                    texts.append(doc)
    return texts


def user_turn_opening(tokenizer: Any) -> str | None:
    """The chat template's text before a user's words (its system preamble included), or None
    when the target has no chat template (a base model asks no questions of its own)."""
    if not getattr(tokenizer, "chat_template", None):
        return None
    try:
        text = tokenizer.apply_chat_template([{"role": "user", "content": _MARK}],
                                             add_generation_prompt=False, tokenize=False)
    except Exception:        # a template that refuses a lone user turn: no Magpie questions
        return None
    return text.split(_MARK)[0] if _MARK in text else None


def encode(tokenizer: Any, prompt: Prompt) -> list[int]:
    """A prompt's ids as the runtime would encode them: through the target's chat template
    with the generation prompt when it has one; else plain text with the tokenizer's added
    tokens (a chat's messages joined by newlines)."""
    body = prompt.body
    if getattr(tokenizer, "chat_template", None):
        messages = body if isinstance(body, list) else [{"role": "user", "content": body}]
        text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        return list(tokenizer(text, add_special_tokens=False)["input_ids"])
    if isinstance(body, list):
        body = "\n".join(str(m.get("content", "")) for m in body if isinstance(m, dict))
    return list(tokenizer(body)["input_ids"])


def key(ids: list[int], mode: str) -> str:
    """What identifies an answer in the cache: the prompt's ids and how it was decoded."""
    return hashlib.sha1(json.dumps([mode, ids]).encode()).hexdigest()[:16]


def interleave(groups: list[list[Prompt]], seed: int) -> list[Prompt]:
    """The groups' prompts, each group shuffled, taken in turn (round robin) so that any
    prefix of the list mixes every source."""
    rng = random.Random(seed)
    queues = [rng.sample(g, len(g)) for g in groups if g]
    out: list[Prompt] = []
    while queues:
        for q in list(queues):
            out.append(q.pop())
            if not q:
                queues.remove(q)
    return out
