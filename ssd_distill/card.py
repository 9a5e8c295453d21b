"""The draft's model card (README.md beside its weights): how it was made, what it measured."""
from __future__ import annotations


def model_card(card: dict) -> str:
    s, d, t, h = card["settings"], card["data"], card["train"], card["heldout"]
    worth = card.get("worth") or {}
    head = (f"a head over the target's {card['head_tokens']:,} most frequent output tokens of "
            f"{card['vocab_size']:,} (`output_vocab.json`; ssd-export builds the draft's head "
            f"over those rows only, q = 0 elsewhere, which keeps decoding exact)"
            if card["head_tokens"] < card["vocab_size"] else "the target's whole vocabulary")
    early = " (train budget hit)" if t["stopped_early"] else ""
    if worth.get("agreement") is not None:
        pair = (f"- exported with the target by `ssd-export` and timed there ({worth.get('backend')}"
                f", threads {worth.get('threads')}): agreement of the deployed graphs "
                f"{worth['agreement']} on {worth.get('tokens')} held-out tokens "
                f"({worth.get('text')}), draft/target cost "
                f"c = {worth.get('c')}, predicted speed-up **{worth.get('speedup')}x** at k = "
                f"{worth.get('best_k')} over the target alone\n")
    else:
        pair = f"- the pair's worth was not measured ({worth.get('note') or 'skipped'})\n"
    command = card.get("command") or f"ssd-distill --target {card['target']} --preset {card['preset']}"
    return f"""# Draft for `{card['target']}`, made by ssd-distill ({card['preset']} preset)

A `{card['architecture']}` of {len(card['layers'])} layers ({card['parameters']:,} parameters
against the target's {card['target_parameters']:,}), its layers started from the target's
layers {card['layers']}, its embeddings (and {head}) the target's, frozen. It shares the
target's tokenizer and chat template: `ssd-export --target TARGET --draft THIS_FOLDER`.

## Training
- data: the target's own answers to {d['answered']} of {d['asked']} prompts
  ({d['prompt_source']}; fewer when the answer budget was hit; a quarter
  sampled at temperature 1, the rest greedy; {d['answer_positions']:,} positions,
  {d['answer_seconds']} s at {d['answer_tokens_per_s']} tok/s) and {d['text_positions']:,}
  positions of {d['text_files']} text file(s), each labelled with the target's top-{s['top_k']}
  log-probs and argmax
- loss: `{card['loss']}` (docs/distill.md); AdamW, cosine schedule, lr {s['lr']}, batches of
  {s['batch']} rows, {t['steps']}/{t['planned_steps']} steps{early} in {t['seconds']} s
  ({t['tokens_per_s']} labelled tok/s), final loss {t['loss']}
- seed {card['seed']}, {card['threads']} threads, {card['machine']}; total wall time
  {card.get('total_seconds')} s

## Measured
- teacher-forced top-1 agreement with the target on {h['positions']:,} positions of its
  answers to {d['heldout_prompts']} held-out prompts: **{h['agreement']}** (the copied
  layers before training: {h['agreement_before_training']})
{pair}
## Reproduce
`{command}`
"""


def head_card(card: dict) -> str:
    """The EAGLE-3 head's card (README.md beside config.json and model.safetensors)."""
    s, d, t, h = card["settings"], card["data"], card["train"], card["heldout"]
    steps = ", ".join(f"step {j + 1}: **{a}**" for j, a in enumerate(h["agreement"]))
    start = ", ".join(str(a) for a in h["agreement_before_training"])
    early = " (the time budget stopped it)" if t["stopped_early"] else ""
    sources = "; ".join(f"{name}: {v['answers']:,} answers, {v['positions']:,} positions"
                        for name, v in d["sources"].items())
    held = "; ".join(f"{name}: {v['answers']:,} answers, {v['positions']:,} positions"
                     for name, v in d["heldout_sources"].items())
    r, plan, worth = card["rates"], card["plan"], card.get("worth") or {}
    if worth.get("c") is not None:
        measured = (f"- exported with the target by `ssd-export` and timed there: the cost of a "
                    f"drafted token against a target step **c = {worth['c']}** "
                    f"({worth.get('backend')}, threads {worth.get('threads')}), agreement of "
                    f"the deployed graphs {worth.get('agreement')} on {worth.get('tokens')} "
                    f"tokens of the held-out answers, predicted {worth.get('speedup')}x at k = "
                    f"{worth.get('best_k')}\n")
    else:
        measured = f"- c was not measured ({worth.get('note') or 'the check was skipped'})\n"
    command = card.get("command") or (f"ssd-distill --kind head --target {card['target']} "
                                      f"--preset {card['preset']}")
    return f"""# EAGLE-3 head for `{card['target']}`, made by ssd-distill ({card['preset']} preset)

One decoder layer over the target's hidden states entering its layers
{card['aux_layer_ids']} (fused by `fc`) and the next token's embedding (the target's table,
not stored here), drafting over the {card['draft_vocab_size']:,} tokens the target writes most
often of its {card['vocab_size']:,} (`d2t`, `t2d`: {card['draft_vocab_coverage']:.1%} of its
answers' tokens). SafeAILab's layout (`LlamaForCausalLMEagle3`): `ssd-export --target TARGET
--draft THIS_FOLDER`, and the servers that load SafeAILab's EAGLE-3 heads (vLLM, SGLang,
TensorRT-LLM) take it as it is. Started from the target's {"last layer" if card["head_init"] ==
"target" else "nothing (SafeAILab's init)"}.

## Size and cost
- {card['parameters']:,} parameters ({card['bytes'] / 2**20:.1f} MiB in float32) against the
  target's {card['target_parameters']:,}; a drafted token multiplies by about
  {card['cost_ratio']:.1%} of the weights a target step does
{measured}
## Data
- the target's own answers, written by this project's runtime from `{d['bundle']}` (labels:
  {"its log-probabilities, the float target's" if d['labels'] == 'runtime' else
   "the float target's prefill"}), at most {d['max_new_tokens']} tokens each, greedy and
  sampled; kept in the answer cache `{d['cache']}` ({d['cache_bytes'] / 2**20:,.0f} MiB)
- training: {d['answers']:,} answers, **{d['positions']:,} positions** ({sources});
  {d['new_answers']:,} of them written by this run in {d['answer_seconds']} s
  {("(" + d['stopped'] + ")") if d['stopped'] else ""}
- held out (another source, never trained on): {held}
- rates measured here: answers {r['answer']:.0f} positions/s, features {r['feature']:.0f}
  tokens/s, training {r['train']:.0f} positions/s; plan: {plan['answers']:,} answers,
  {plan['epochs']} epoch(s){(" (" + plan['note'] + ")") if plan['note'] else ""}

## Training
- {s['ttt_steps']} drafting steps unrolled per position (SafeAILab's training-time test), loss
  Σ 0.8^j · CE(target restricted to the draft vocabulary, head); AdamW, cosine schedule, lr
  {s['lr']}, clip {s['clip']}, batches of {s['batch']} rows, {t['steps']}/{t['planned_steps']}
  steps{early} in {t['seconds']} s on {card['device']}, final loss {t['loss']}
- seed {card['seed']}, {card['threads']} threads, {card['machine']}; total wall time
  {card['total_seconds']} s, peak RSS {card['peak_rss_gib']} GiB

## Measured
- teacher-forced top-1 agreement with the target on {h['positions']:,} positions of its answers
  to the held-out prompts, each drafting step fed the head's own previous output: {steps}
  (before training: {start}; the draft vocabulary holds {h['draft_vocab_coverage']:.1%} of
  those answers' tokens)

## Reproduce
`{command}`
"""
