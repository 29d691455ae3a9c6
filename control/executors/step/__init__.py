"""The step kernel: one speculative decode step, the same numbered procedure for every data plane.

1. build the ``StepView``                      ``view.py``    ``build_view``
2. clamp k and the drafter by one rule         ``clamp.py``   ``clamp_decision``
3. run the drafter(s), then the policy's prune ``kernel.py``  ``StepParts.draft`` / ``StepParts.prune``
4. verify                                      ``kernel.py``  ``StepParts.verify``
5. accept (greedy, coupled, rejection)         ``accept.py``
6. apply the stop rules                        ``stop.py``
7. build the ``StepOutcome``                   ``kernel.py``  ``step_outcome``

``kernel.run_step`` runs steps 2-5 over a data plane's ``StepParts`` (its drafters, verifier and
acceptor); the plane then commits the accepted tokens with the stop rules (6) and reports the outcome
(7). The reference executor's parts run real models; the simulator's draw or replay acceptance
instead of running models; the TensorRT-LLM orchestrator's call engines. ``ngram.py`` is the one
prompt-lookup proposer every plane drafts n-grams with.
"""
