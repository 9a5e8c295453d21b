"""`ssd-distill`: make a draft for a target that has none, from the target itself (its layers,
its own answers and next-token distributions), as a Hugging Face folder that `ssd-export
--draft` takes unchanged (docs/distill.md)."""
