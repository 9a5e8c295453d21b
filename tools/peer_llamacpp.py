"""llama.cpp as a peer of tools/peers.py: the pair converted to GGUF, quantized, and decoded by
llama.cpp's own command-line tools (nothing of llama.cpp is committed here; peers.py takes the
path of a build). Its source ships inside llama-cpp-python's source distribution:

    pip download --no-binary :all: --no-deps llama-cpp-python -d /tmp/llcp
    tar xzf /tmp/llcp/llama_cpp_python-*.tar.gz -C /tmp/llcp
    SRC=$(echo /tmp/llcp/llama_cpp_python-*/vendor/llama.cpp)
    cmake -S $SRC -B /tmp/llcp/build -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON \\
          -DLLAMA_CURL=OFF -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_TESTS=OFF
    cmake --build /tmp/llcp/build -j2 --target llama-completion llama-speculative-simple \\
          llama-quantize llama-tokenize llama-bench
    pip install sentencepiece    # the converter imports it even for a BPE tokenizer
    python tools/peers.py ... --llama-cpp /tmp/llcp/build/bin --llama-cpp-src $SRC

(30 min on this 2-core machine, shared, on 2026-12-02.) The converter runs in peers.py's
Python: torch and transformers (the export extra), gguf from its own gguf-py, sentencepiece.

Every run is one process, greedy, -t/-tb threads: the target alone is `llama-completion`
(seconds: its "total time", from after the model load and warm-up to the last token), the
speculative mode `llama-speculative-simple` (the draft on its own -td/-tbd; seconds: its
"encoded" prefill of prompt[:-1] plus "decoded", the rest). Process start and model load stay
outside the clocks, as they do for the other peers.
"""
from __future__ import annotations

import json
import re
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

TOOLS = ("llama-completion", "llama-speculative-simple", "llama-quantize", "llama-tokenize")
QUANTS = ("f32", "q8_0", "q4_0")     # what llama-quantize writes from the f32 conversion

# The converter recognises a byte-level BPE pre-tokenizer by hashing how it splits a test
# string, and refuses a tokenizer trained here (the demo pair's) whose hash it has never seen.
# GPT-2's ByteLevel regex is what such a tokenizer uses (checked by gpt2_pre_tokenizer), so an
# unknown hash is registered as "gpt-2" in this process only: no file of llama.cpp is edited.
_CONVERT = """
import runpy, sys
from pathlib import Path
script = sys.argv[1]
sys.path[:0] = [str(Path(script).parent), str(Path(script).parent / "gguf-py")]
from conversion import base
known = base.TextModel.get_vocab_base_pre
def pre(self, tokenizer):
    try:
        return known(self, tokenizer)
    except NotImplementedError:
        return "gpt-2"
base.TextModel.get_vocab_base_pre = pre
sys.argv = sys.argv[1:]
runpy.run_path(script, run_name="__main__")
"""
_SECONDS = re.compile(r"(encoded|decoded)\s+(\d+) tokens in\s+([\d.]+) seconds")
_ACCEPT = re.compile(r"accept\s+=\s+([\d.]+)%")
_PERF = re.compile(r"common_perf_print:\s+(prompt eval|eval|total) time =\s+([\d.]+) ms"
                   r"(?: /\s+(\d+))?")


@dataclass(frozen=True)
class LlamaCpp:
    bin: Path                        # the built tools
    src: Path                        # llama.cpp's source: convert_hf_to_gguf.py, gguf-py/


@dataclass
class Prepared:
    tools: LlamaCpp
    files: dict[tuple[str, str], Path]       # (role, quant) -> GGUF
    texts: dict[tuple[int, ...], str]        # our prompt ids -> the text llama.cpp is given

    def describe(self) -> dict:
        res = subprocess.run([str(self.tools.bin / "llama-speculative-simple"), "--version"],
                             capture_output=True, text=True, check=False)
        return {"bin": str(self.tools.bin), "src": str(self.tools.src),
                "version": (res.stdout + res.stderr).strip().splitlines()[0],
                "gguf": {f"{role} {quant}": str(path) for (role, quant), path in
                         self.files.items()}}


@dataclass
class Run:
    text: str                        # the new text, as llama.cpp printed it
    seconds: float                   # prefill + decode, by its own clocks
    decode_seconds: float
    acceptance: float | None


def locate(bin_dir: str, src: str) -> LlamaCpp:
    """The build and source given to peers.py, or FileNotFoundError naming what is missing."""
    tools = LlamaCpp(Path(bin_dir).resolve(), Path(src).resolve())
    missing = [str(tools.bin / t) for t in TOOLS if not (tools.bin / t).exists()] + \
        [str(p) for p in (tools.src / "convert_hf_to_gguf.py", tools.src / "gguf-py")
         if not p.exists()]
    if missing:
        raise FileNotFoundError(f"not found: {', '.join(missing)} (build: tools/peer_llamacpp.py)")
    return tools


def gpt2_pre_tokenizer(hf_dir: Path) -> bool:
    """Whether the tokenizer splits text as GPT-2 does: ByteLevel with its regex, no normaliser."""
    tok = json.loads((hf_dir / "tokenizer.json").read_text())
    pre = tok.get("pre_tokenizer") or {}
    return tok.get("normalizer") is None and pre.get("type") == "ByteLevel" \
        and pre.get("use_regex", True) and not pre.get("add_prefix_space", False)


def prepare(tools: LlamaCpp, models: dict[str, Path], quants: dict[str, set[str]],
            workdir: Path, stamp: str, log: Callable[[str], None]) -> dict[tuple[str, str], Path]:
    """GGUF files per (role, quant): each Hugging Face folder converted once in f32 and
    quantized from it (llama-quantize's defaults per type), reused while the pair is unchanged."""
    out = workdir / "llamacpp"
    out.mkdir(parents=True, exist_ok=True)
    files = {}
    for role, hf_dir in models.items():
        f32 = out / f"{role}-f32.gguf"
        if not _fresh(f32, stamp):
            if not gpt2_pre_tokenizer(hf_dir):
                raise ValueError(f"{hf_dir}/tokenizer.json: only GPT-2-style byte-level BPE "
                                 "tokenizers are converted here")
            log(f"convert_hf_to_gguf.py: {hf_dir} -> {f32}")
            _sh([sys.executable, "-c", _CONVERT, str(tools.src / "convert_hf_to_gguf.py"),
                 str(hf_dir), "--outtype", "f32", "--outfile", str(f32)], out / f"{role}-f32.log")
            _stamp(f32, stamp)
        files[role, "f32"] = f32
        for quant in sorted(quants.get(role, set()) - {"f32"}):
            q = out / f"{role}-{quant}.gguf"
            if not _fresh(q, stamp):
                log(f"llama-quantize: {f32} -> {q}")
                _sh([str(tools.bin / "llama-quantize"), str(f32), str(q), quant.upper()],
                    out / f"{role}-{quant}.log")
                _stamp(q, stamp)
            files[role, quant] = q
    return files


def tokenize(tools: LlamaCpp, model: Path, text: str) -> list[int]:
    """The ids llama.cpp gives the prompt text (BOS as the GGUF says), to check against ours."""
    res = subprocess.run([str(tools.bin / "llama-tokenize"), "-m", str(model), "-p", text,
                          "--ids", "--log-disable"], capture_output=True, text=True, check=True)
    return json.loads(res.stdout.strip().splitlines()[-1])


def target_alone(tools: LlamaCpp, target: Path, text: str, prompt_len: int, n: int,
                 threads: int) -> Run:
    """n new tokens, greedy, with llama-completion (the prompt in one batch, then n-1 steps)."""
    res = _run([str(tools.bin / "llama-completion"), "-m", str(target), "-p", text,
                "-n", str(n), "-c", str(_context(prompt_len, n)), "-t", str(threads),
                "-tb", str(threads), "--temp", "0", "--top-k", "1", "--seed", "0",
                "--color", "off", "-no-cnv", "--no-display-prompt"], "graphs reused")
    perf = {m[1]: (float(m[2]), int(m[3] or 0)) for m in _PERF.finditer(res.stderr)}
    eval_ms, runs = perf["eval"]
    # stdout: the new text, " [end of text]" at an end-of-sequence token, then "\n\n"
    new = res.stdout.removesuffix("\n\n").removesuffix(" [end of text]\n")
    # decode: one step per token, as ours counts it from the last prompt token on
    return Run(new, perf["total"][0] / 1e3, eval_ms / 1e3 * (runs + 1) / max(runs, 1), None)


def speculative(tools: LlamaCpp, target: Path, draft: Path, text: str, prompt_len: int, n: int,
                threads: int, draft_threads: int, k: int) -> Run:
    """n new tokens, greedy, with llama-speculative-simple: at most k draft tokens a round."""
    res = _run([str(tools.bin / "llama-speculative-simple"), "-m", str(target), "-p", text,
                "-n", str(n - 1), "-c", str(_context(prompt_len, n + k)), "-t", str(threads),
                "-tb", str(threads), "--temp", "0", "--top-k", "1", "--seed", "0",
                "--color", "off", "-md", str(draft), "-td", str(draft_threads),
                "-tbd", str(draft_threads), "--spec-type", "draft-simple",
                "--spec-draft-n-max", str(k)], "graphs reused")
    secs = {m[1]: (int(m[2]), float(m[3])) for m in _SECONDS.finditer(res.stderr)}
    made, decode = secs["decoded"]
    acc = _ACCEPT.search(res.stderr)
    # It stops once it has made MORE than -n tokens, and its last round may accept a few past
    # that: the clocks are scaled to the n tokens compared (at the loop's mean rate).
    share = min(1.0, n / made) if made else 1.0
    return Run(_new_text(res.stdout, text), share * (secs["encoded"][1] + decode),
               share * decode, float(acc[1]) / 100 if acc else None)


def _context(prompt_len: int, n: int) -> int:
    # what the run needs, in llama.cpp's KV padding of 256: attention reads the cache that long
    return -(-(prompt_len + n + 8) // 256) * 256


def _run(cmd: list[str], last: str, tries: int = 10) -> subprocess.CompletedProcess:
    """The tool's run whose output reached its `last` line. llama.cpp logs through a thread
    it does not join at exit (common/log.cpp, "logs may be lost"): a run whose tail was lost
    (1 in ~10 on an idle machine, and 3 in a row for some runs beside another user's job, on
    2026-12-02) is run again; the log is in order, so the last line vouches for the rest."""
    for _ in range(tries):
        res = subprocess.run(cmd, capture_output=True, text=True, check=False)
        if res.returncode:
            tail = " | ".join(res.stderr.strip().splitlines()[-3:])
            raise RuntimeError(f"{Path(cmd[0]).name} exited {res.returncode}: {tail}")
        if last in res.stderr:
            return res
    raise RuntimeError(f"{Path(cmd[0]).name}: no {last!r} in its output {tries} times running")


def _new_text(stdout: str, prompt: str) -> str:
    """stdout is "\n\n", the prompt's pieces (BOS's included), the new text, "\n\n" twice."""
    body = stdout.removeprefix("\n\n").removesuffix("\n\n\n\n")
    at = body.find(prompt)
    if at < 0:
        raise RuntimeError(f"the prompt is not echoed on stdout: {stdout[:200]!r}")
    return body[at + len(prompt):]


def _fresh(path: Path, stamp: str) -> bool:
    s = path.with_suffix(".stamp")
    return path.exists() and s.exists() and s.read_text() == stamp


def _stamp(path: Path, stamp: str) -> None:
    path.with_suffix(".stamp").write_text(stamp)


def _sh(cmd: list[str], log: Path) -> None:
    with open(log, "w") as f:
        rc = subprocess.run(cmd, check=False, stdout=f, stderr=subprocess.STDOUT).returncode
    if rc:
        tail = " | ".join(log.read_text().strip().splitlines()[-4:])
        raise RuntimeError(f"{Path(cmd[0]).name} exited {rc} (log {log}): {tail}")
