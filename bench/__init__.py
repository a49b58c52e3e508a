"""The measuring sticks: each script's docstring gives its command. Nothing in the product imports bench/."""
