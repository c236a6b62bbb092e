"""``"mode": "auto"``, the goodput controller and, since 0.5, what ``"gravac": {}`` runs: the controller
(``controller``) and its per-group signals (``signals``), built on layer groups and their ladders (``ladder``),
predicted time per level from the agreed cost-model fits (``timing``), error per level of the averaged update
(``error_model``), and the budgeted plan with its hysteresis (``solver``).

The package imports from ``compress`` and ``sync`` (the cost model's fits, the aggregate gain's group spec),
never the other way round.
"""
