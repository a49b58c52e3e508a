"""The measuring sticks: each script's docstring gives its command. train.py imports memory for its pre-flight."""
