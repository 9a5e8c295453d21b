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
- data: the target's own answers to {d['answered']} prompts ({d['prompt_source']}; a quarter
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
