"""Admission control and tiered degradation: the queue bounds and the per-request effect of the level
(`admission.py`), the load score and its levels with hysteresis (`degradation.py`), and level 3's
cached or canned replies (`canned.py`)."""
