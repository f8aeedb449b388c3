"""Golden runs of ``agentjax train`` (tests/train/test_golden.py) and their recorder (record.py)."""
