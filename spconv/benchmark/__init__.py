"""``python -m spconv.benchmark``: is it correct, and how fast is it on this machine?"""
