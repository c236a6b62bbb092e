"""Cost-model selection (``selection: "cost_model"``): linear fits of every priced primitive (``fits``), the
per-bucket predictions (``predict``), the choice dense/compressed and of the exchange (``selector``), calibration
at attach and its cross-rank agreement (``calibrate``), in-step timings (``samples``) and the lifecycle with online
refits and step-record keys (``model``)."""
