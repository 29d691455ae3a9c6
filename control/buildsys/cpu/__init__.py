"""The CPU reference pair (DESIGN.md section 8): a byte-level BPE tokenizer, a target and drafts
trained from Python sources on this machine, saved in Hugging Face layout under ``engines/cpu``.

Modules: ``corpus`` (what is read, the held-out split), ``tokenizer``, ``recipe`` (sizes and
schedules of the full and quick builds), ``train`` (LM training, distillation), ``generate``
(batched greedy generation), ``acceptance`` (held-out greedy acceptance), ``ngram`` (prompt
lookup), ``pair`` (the build), ``progress`` (reporters). Import torch-using modules lazily.
"""
