"""The profiler: time each model's forward passes over a batch x context x k grid, fit the cost
model T = a*N_ctx + b*N_batched + c per model, and write ``profiles/<sku>/<pair>.yaml``.

Heavy (imports torch): import ``control.profiler.run`` where it is needed.
"""
