"""Building blocks of ``"mode": "auto"``, the goodput controller (in progress; no mode uses them yet): layer
groups and their ladders (``ladder``), predicted time per level from the agreed cost-model fits (``timing``),
error per level of the averaged update (``error_model``), and the budgeted plan with its hysteresis (``solver``).

The package imports from ``compress`` and ``sync.cost_model``, never the other way round.
"""
