"""specctl: adaptive speculative decoding control plane.

Where things live (one hop each):
- where k is chosen: ``control.policy``
- what crosses the wire: ``control.plan`` (plus the telemetry schema in ``control.service``)
- what an engine must provide: ``control.executors.base``
- the math: ``control.goodput``
"""

__version__ = "0.1.0"
